"""DVC stage tune@<dataset>-<backbone>-<loss>: search the loss's hyperparameters on the training
classes' folds (Optuna; params.yaml `tuning:`), write artifacts/tuning/<dataset>/<backbone>/<loss>/."""

import argparse

from dmlbench.cli import main
from dmlbench.tune.stage import tune_stage

if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--params", default="params.yaml")
    parser.add_argument("--dataset", required=True)
    parser.add_argument("--backbone", required=True)
    parser.add_argument("--loss", required=True)
    parser.add_argument("--workers", type=int, default=None, help="trial processes (default: tuning.workers)")
    main(
        parser,
        lambda params, args: tune_stage(
            params, args.dataset, args.backbone, args.loss, workers=args.workers, params_file=args.params
        ),
    )
