"""DVC stage report: reports/report.md + reports/figures/*.png (results, tournament, statistics, papers vs
reality, thesis figures), also logged to MLflow as one "report" run per report content."""

from dmlbench.analysis.report import report_stage
from dmlbench.cli import main, stage_parser
from dmlbench.params.load import load_params

if __name__ == "__main__":
    main(
        stage_parser(__doc__),
        lambda params, args: print(f"wrote {report_stage(params)}"),
        load=lambda args: load_params(args.params),
    )
