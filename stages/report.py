"""DVC stage report: reports/report.md + reports/figures/*.png (results, tournament, statistics, papers vs
reality, thesis figures), also logged to MLflow as one "report" run per report content."""

import argparse

from dmlbench.analysis.report import report_stage
from dmlbench.cli import main

parser = argparse.ArgumentParser(description=__doc__)
parser.add_argument("--params", default="params.yaml")

if __name__ == "__main__":
    main(parser, lambda params, args: print(f"wrote {report_stage(params)}"))
