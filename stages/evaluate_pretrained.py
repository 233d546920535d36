"""DVC stage evaluate_pretrained@<dataset>-<backbone>: metrics of the untrained trunk, per-query bootstrap CI."""

import argparse

from dmlbench.cli import main
from dmlbench.evaluate.stage import evaluate_pretrained_stage

if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--params", default="params.yaml")
    parser.add_argument("--dataset", required=True)
    parser.add_argument("--backbone", required=True)
    main(parser, lambda params, args: evaluate_pretrained_stage(params, args.dataset, args.backbone))
