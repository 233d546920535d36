"""DVC stage tune@<dataset>-<backbone>-<loss>: search the loss's hyperparameters on the training
classes' folds (Optuna; params.yaml `tuning:`), write artifacts/tuning/<dataset>/<backbone>/<loss>/."""

from dmlbench.cli import main, stage_parser
from dmlbench.params.load import load_params
from dmlbench.tune.stage import tune_stage

if __name__ == "__main__":
    main(
        stage_parser(__doc__, "dataset", "backbone", "loss", "workers"),
        lambda params, args: tune_stage(
            params, args.dataset, args.backbone, args.loss, workers=args.workers, params_file=args.params
        ),
        load=lambda args: load_params(args.params),
    )
