"""DVC stage evaluate@<dataset>-<backbone>-<loss>-<dim>: exact metrics per seed, mean and 95% CI (t over seeds)."""

from dmlbench.cli import combo_spec, main, stage_parser
from dmlbench.evaluate.stage import evaluate_stage
from dmlbench.params.load import load_params

if __name__ == "__main__":
    main(
        stage_parser(__doc__, "dataset", "backbone", "loss", "dim"),
        lambda params, args: evaluate_stage(params, combo_spec(args)),
        load=lambda args: load_params(args.params),
    )
