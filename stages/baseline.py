"""DVC stage baseline@<dataset>-<backbone>-<loss>-<variant>: train the published values at tuning.dim
with every seed, embed and evaluate them (the tuned grid's baseline, tuning.baselines)."""

import argparse

from dmlbench.cli import main
from dmlbench.tune.baseline import baseline_stage
from dmlbench.tune.settings import BASELINES

if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--params", default="params.yaml")
    parser.add_argument("--dataset", required=True)
    parser.add_argument("--backbone", required=True)
    parser.add_argument("--loss", required=True)
    parser.add_argument("--variant", required=True, choices=BASELINES)
    main(parser, lambda params, args: baseline_stage(params, args.dataset, args.backbone, args.loss, args.variant))
