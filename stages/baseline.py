"""DVC stage baseline@<dataset>-<backbone>-<loss>-<variant>: train the published values at tuning.dim
with every seed, embed and evaluate them (the tuned grid's baseline, tuning.baselines)."""

from dmlbench.cli import main, stage_parser
from dmlbench.params.load import load_params
from dmlbench.tune.baseline import baseline_stage

if __name__ == "__main__":
    main(
        stage_parser(__doc__, "dataset", "backbone", "loss", "variant"),
        lambda params, args: baseline_stage(params, args.dataset, args.backbone, args.loss, args.variant),
        load=lambda args: load_params(args.params),
    )
