"""DVC stage validate: check every key of params.yaml, and that every pretrained weights file
the grid needs is here or downloadable, before any other stage runs.

Its output never changes (so it re-runs on any params change without invalidating
downstream stages); `download` depends on it, so bad input fails here, in one line.
"""

import argparse

from dmlbench.cli import main
from dmlbench.config import validated_marker
from dmlbench.preflight import require_weights

parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
parser.add_argument("--params", default="params.yaml")
parser.add_argument("--out", default="artifacts/params.validated")


def validate(params, args: argparse.Namespace) -> None:
    require_weights(params)  # missing pretrained weights fail here, before download and prepare
    validated_marker(params, args.out)


if __name__ == "__main__":
    main(parser, validate)
