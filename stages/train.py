"""DVC stage train@<dataset>-<backbone>-<loss>-<dim>-<seed>: train one run, log it to MLflow."""

from dmlbench.cli import main, run_parser, run_spec
from dmlbench.train.stage import train_stage

if __name__ == "__main__":
    main(run_parser(__doc__), lambda params, args: train_stage(params, run_spec(args)))
