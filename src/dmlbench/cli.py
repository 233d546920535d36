"""Shared entry point of the thin ``stages/*.py`` scripts.

Parses the stage's arguments, loads and validates ``params.yaml`` (so every stage rejects
bad input before expensive work), runs the stage, and turns a user-fixable error into one
line on stderr and exit status 2.
"""

from __future__ import annotations

import argparse
import os
import sys
from typing import Any, Callable

from dmlbench.config import Combo, Params, RunSpec, load_params
from dmlbench.errors import DmlbenchError


def run_parser(description: str, with_seed: bool = True) -> argparse.ArgumentParser:
    """Arguments naming one grid cell: --dataset --backbone --loss --dim [--seed]."""
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--params", default="params.yaml")
    parser.add_argument("--dataset", required=True)
    parser.add_argument("--backbone", required=True)
    parser.add_argument("--loss", required=True)
    parser.add_argument("--dim", type=int, required=True)
    if with_seed:
        parser.add_argument("--seed", type=int, required=True)
    return parser


def run_spec(args: argparse.Namespace) -> RunSpec:
    return RunSpec(args.dataset, args.backbone, args.loss, args.dim, args.seed)


def combo_spec(args: argparse.Namespace) -> Combo:
    return Combo(args.dataset, args.backbone, args.loss, args.dim)


def main(parser: argparse.ArgumentParser, stage: Callable[[Params, argparse.Namespace], Any]) -> None:
    """Parse, validate params, run ``stage(params, args)``; one-line errors, exit status 2."""
    os.environ.setdefault("MLFLOW_DISABLE_TELEMETRY", "true")
    args = parser.parse_args()
    try:
        params = load_params(args.params)
        stage(params, args)
    except DmlbenchError as exc:
        print("\n".join(f"error: {line}" for line in str(exc).splitlines()), file=sys.stderr)
        sys.exit(2)
