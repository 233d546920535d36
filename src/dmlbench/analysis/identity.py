"""What identifies each training run of the grid for pairing, read from the outputs that travel with
it (a cross-validated run: its first fold model), and where it was trained
(:mod:`dmlbench.tracking.workspace`): the columns :data:`IDENTITY`, described in docs/report.md;
``protocol_digest`` and ``split`` are :func:`digest`s of ``config.yaml`` (else ``params.yaml``).
``"unknown"`` stands for a missing record; runs pair (:mod:`.pairing`) only when :data:`PAIRING` agree.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pandas as pd
import yaml

from dmlbench import paths
from dmlbench.data.prepare import MANIFEST
from dmlbench.io import md5_file, read_json
from dmlbench.params.model import Params
from dmlbench.params.protocol import protocol_values
from dmlbench.stage_inputs import manifest_path
from dmlbench.tracking.runlog import read_runlog
from dmlbench.tracking.workspace import PULLED, default_remote, provenance, workspace_id

CELL = ["dataset", "backbone", "loss", "dim"]
IDENTITY = [
    "code",
    "protocol",
    "protocol_digest",
    "split",
    "dataset_checksum",
    "inputs_manifest",
    "device",
    "precision",
    "provenance",
    "origin",
]
PAIRING = ("protocol_digest", "dataset_checksum", "split")  # rows pair only when these agree
UNKNOWN = "unknown"


def digest(values: Any) -> str:
    """First 12 hex digits of the md5 of ``values`` as JSON with sorted keys (stable across runs).

    >>> digest({"b": 1, "a": [2]}) == digest({"a": [2], "b": 1})
    True
    """
    return hashlib.md5(json.dumps(values, sort_keys=True).encode()).hexdigest()[:12]


def split_text(split: Mapping[str, Any] | None) -> str:
    """The split settings in one string, keys sorted, unset ones left out: ``num_folds=2,scheme=rc_cv``."""
    if not split:
        return UNKNOWN
    return ",".join(f"{key}={split[key]}" for key in sorted(split) if split[key] is not None)


def _file_md5(path: Path, length: int | None = None) -> str:
    return md5_file(path)[:length] if path.is_file() else UNKNOWN


def run_identities(params: Params, root: Path = Path(".")) -> pd.DataFrame:
    """One row per run of the grid: ``dataset, backbone, loss, dim, seed`` and :data:`IDENTITY`."""
    here = workspace_id(root)
    remote = default_remote(root)
    checksums = {name: _file_md5(paths.prepared_dir(name) / MANIFEST, 12) for name in params.datasets}
    rows = []
    for run in params.runs():
        fold = paths.folds_in(paths.model_dir(run))[0]
        model = paths.model_dir(run, fold)
        info = read_json(model / "run.json") if (model / "run.json").exists() else {}
        resolved = yaml.safe_load((model / "config.yaml").read_text()) if (model / "config.yaml").exists() else {}
        protocol = resolved.get("protocol") or protocol_values(params.protocol_name, params.protocol_for(run))
        split = (resolved.get("dataset") or params.datasets[run.dataset].model_dump(mode="json")).get("split")
        origin = provenance(read_runlog(paths.runlog_file(run, fold)), info.get("config_hash"), here)
        rows.append(
            {
                **dict(zip(CELL, (run.dataset, run.backbone, run.loss, run.dim), strict=True)),
                "seed": run.seed,
                "code": info.get("code", UNKNOWN),
                "protocol": protocol.get("name", params.protocol_name),
                "protocol_digest": digest(protocol),
                "split": split_text(split),
                "dataset_checksum": checksums[run.dataset],
                "inputs_manifest": _file_md5(manifest_path(run.stage, root)),
                "device": info.get("device", UNKNOWN),
                "precision": info.get("precision", UNKNOWN),
                "provenance": origin,
                "origin": (f"DVC remote {remote}" if remote else "DVC cache") if origin == PULLED else "this workspace",
            }
        )
    return pd.DataFrame(rows, columns=[*CELL, "seed", *IDENTITY])
