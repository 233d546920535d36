"""DVC stage evaluate_pretrained@<dataset>-<backbone>: metrics of the untrained trunk, per-query bootstrap CI."""

from dmlbench.cli import main, stage_parser
from dmlbench.evaluate.stage import evaluate_pretrained_stage
from dmlbench.params.load import load_params

if __name__ == "__main__":
    main(
        stage_parser(__doc__, "dataset", "backbone"),
        lambda params, args: evaluate_pretrained_stage(params, args.dataset, args.backbone),
        load=lambda args: load_params(args.params),
    )
