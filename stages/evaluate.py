"""DVC stage evaluate@<dataset>-<backbone>-<loss>-<dim>: exact metrics per seed, mean and 95% CI (t over seeds)."""

from dmlbench.cli import combo_spec, main, run_parser
from dmlbench.evaluate.stage import evaluate_stage

if __name__ == "__main__":
    main(run_parser(__doc__, with_seed=False), lambda params, args: evaluate_stage(params, combo_spec(args)))
