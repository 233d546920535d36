"""DVC stage download@<dataset>: fetch the dataset into artifacts/raw/<dataset>."""

import argparse

from dmlbench.cli import main
from dmlbench.data.stage import download_stage

parser = argparse.ArgumentParser(description=__doc__)
parser.add_argument("--params", default="params.yaml")
parser.add_argument("--dataset", required=True)

if __name__ == "__main__":
    main(parser, lambda params, args: download_stage(params, args.dataset))
