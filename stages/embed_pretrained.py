"""DVC stage embed_pretrained@<dataset>-<backbone>: pooled trunk features before training (the "Pretrained" row)."""

import argparse

from dmlbench.cli import main
from dmlbench.evaluate.embed import embed_pretrained_stage

if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--params", default="params.yaml")
    parser.add_argument("--dataset", required=True)
    parser.add_argument("--backbone", required=True)
    main(parser, lambda params, args: embed_pretrained_stage(params, args.dataset, args.backbone))
