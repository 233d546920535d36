"""The run log: what differs between two executions of the same training, kept out of DVC's outputs.

``artifacts/runlog/<grid_key>.json`` (:func:`dmlbench.paths.runlog_file`; not a DVC output,
git-ignored) holds the per-epoch wall-clock timings, the device and host, the MLflow run id and
experiment, the start and end time and the epoch a resumed training went on from. The DVC
outputs of a training (``history.json``, ``run.json``) hold none of these, so two clones that
run the same pipeline on one machine produce byte-identical outputs and the same DVC hashes.
The timings also reach MLflow as metrics. Where the outputs were restored from a DVC cache
(``dvc pull``, ``dvc checkout``) there is no run log, and the report says timings are
unavailable.
"""

from __future__ import annotations

import datetime
import socket
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from dmlbench.io import read_json, write_json

# per-epoch metrics that measure the execution, not the result (train/loop.py)
TIMING_KEYS = ("train/epoch_seconds", "train/images_per_second", "train/elapsed_seconds")


def split_timings(history: Iterable[Mapping[str, Any]]) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """``history`` without the timing keys, and the timings per epoch (``epoch`` + timing keys).

    >>> split_timings([{"epoch": 1, "train/loss": 0.5, "train/epoch_seconds": 2.0}])
    ([{'epoch': 1, 'train/loss': 0.5}], [{'epoch': 1, 'train/epoch_seconds': 2.0}])
    """
    stable, timings = [], []
    for entry in history:
        stable.append({k: v for k, v in entry.items() if k not in TIMING_KEYS})
        timed = {k: entry[k] for k in TIMING_KEYS if k in entry}
        if timed:
            timings.append({"epoch": entry["epoch"], **timed})
    return stable, timings


def now() -> str:
    """UTC time, ISO 8601 to the second."""
    return datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds")


def host() -> str:
    return socket.gethostname()


def write_runlog(path: Path, record: Mapping[str, Any]) -> None:
    """Write ``record`` (atomically) to ``path``, creating its folders."""
    path.parent.mkdir(parents=True, exist_ok=True)
    write_json(path, dict(record))


def read_runlog(path: Path) -> dict[str, Any] | None:
    """The run log at ``path``, or None where there is none (or it is unreadable)."""
    try:
        return read_json(path)
    except (OSError, ValueError):
        return None
