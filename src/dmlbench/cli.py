"""The one entry point of the thin ``stages/*.py`` scripts: :func:`stage_parser` builds a stage's
arguments from the shared definitions below; :func:`main` parses them, loads and validates what the
stage reads (so every stage rejects bad input before expensive work), runs the stage, and turns a
user-fixable error into one line on stderr and exit status 2.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

from dmlbench.errors import DmlbenchError
from dmlbench.grid import Combo, RunSpec
from dmlbench.stage_inputs import check_manifest

Loaded = TypeVar("Loaded")

ARGUMENTS: dict[str, dict[str, Any]] = {
    "dataset": {"required": True},
    "backbone": {"required": True},
    "loss": {"required": True},
    "dim": {"type": int, "required": True},
    "seed": {"type": int, "required": True},
    "variant": {"required": True, "help": "what the tuned grid is compared with (tuning.baselines)"},
    "workers": {"type": int, "default": None, "help": "worker processes (default: the stage's own setting)"},
    "out": {"default": "artifacts/params.validated", "help": "the validate stage's marker file"},
}


def stage_parser(description: str, *names: str) -> argparse.ArgumentParser:
    """``--params`` and ``--<name>`` for each of ``names`` (:data:`ARGUMENTS`), in that order."""
    parser = argparse.ArgumentParser(description=description.strip().split("\n")[0])
    parser.add_argument("--params", default="params.yaml")
    for name in names:
        parser.add_argument(f"--{name}", **ARGUMENTS[name])
    return parser


def run_spec(args: argparse.Namespace) -> RunSpec:
    """The run named by ``--dataset --backbone --loss --dim --seed``."""
    return RunSpec(args.dataset, args.backbone, args.loss, args.dim, args.seed)


def combo_spec(args: argparse.Namespace) -> Combo:
    """The grid cell named by ``--dataset --backbone --loss --dim``."""
    return Combo(args.dataset, args.backbone, args.loss, args.dim)


def main(
    parser: argparse.ArgumentParser,
    stage: Callable[[Loaded, argparse.Namespace], Any],
    load: Callable[[argparse.Namespace], Loaded],
) -> None:
    """Parse, check the stage's inputs manifest (when DVC or a runner names the stage in ``DVC_STAGE``:
    :func:`dmlbench.stage_inputs.check_manifest`), ``load(args)`` (validation), run
    ``stage(loaded, args)``, check the manifest again (an edit while the stage ran fails it, so that
    nothing records its outputs); one-line errors, exit status 2."""
    os.environ.setdefault("MLFLOW_DISABLE_TELEMETRY", "true")
    args = parser.parse_args()
    name, root = os.environ.get("DVC_STAGE"), Path(os.environ.get("DVC_ROOT") or ".")
    try:
        if name:
            check_manifest(name, root)
        stage(load(args), args)
        if name:
            check_manifest(name, root, after_run=True)
    except DmlbenchError as exc:
        print("\n".join(f"error: {line}" for line in str(exc).splitlines()), file=sys.stderr)
        sys.exit(2)
