"""The run log: what differs between two executions of the same training, kept out of DVC's outputs.

``artifacts/runlog/<grid_key>.json`` (not a DVC output) holds the per-epoch timings, device, host,
MLflow run id, start and end, and the resumed epoch, so the DVC outputs of two clones stay
byte-identical. Pulled outputs have none (the report says timings are unavailable).
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
