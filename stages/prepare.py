"""DVC stage prepare@<dataset>: decode, resize and split into artifacts/prepared/<dataset>."""

import argparse

from dmlbench.cli import main
from dmlbench.data.stage import prepare_stage

parser = argparse.ArgumentParser(description=__doc__)
parser.add_argument("--params", default="params.yaml")
parser.add_argument("--dataset", required=True)
parser.add_argument("--workers", type=int, default=None, help="decoding processes (default: all usable CPUs)")

if __name__ == "__main__":
    main(parser, lambda params, args: prepare_stage(params, args.dataset, workers=args.workers))
