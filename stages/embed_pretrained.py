"""DVC stage embed_pretrained@<dataset>-<backbone>: pooled trunk features before training (the "Pretrained" row)."""

from dmlbench.cli import main, stage_parser
from dmlbench.evaluate.embed import embed_pretrained_stage
from dmlbench.params.load import load_params

if __name__ == "__main__":
    main(
        stage_parser(__doc__, "dataset", "backbone"),
        lambda params, args: embed_pretrained_stage(params, args.dataset, args.backbone),
        load=lambda args: load_params(args.params),
    )
