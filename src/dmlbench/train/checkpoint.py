"""Resumable per-epoch checkpoints (``last.pt``, written atomically after every epoch).

Resumed only when its config hash and the code its stage reads match
(:func:`dmlbench.stage_inputs.inputs_fingerprint`: an edit of the report's code keeps it). Checkpoints
are data, never code: tensors and plain values only, read with ``weights_only=True``
(:func:`dmlbench.safe_load.load_plain`), which refuses any other pickled object.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

import torch

from dmlbench.errors import DataError
from dmlbench.io import atomic_path
from dmlbench.safe_load import load_plain
from dmlbench.stage_inputs import inputs_fingerprint

LAST = "last.pt"


def _no_best() -> dict[str, Any]:
    return {"epoch": 0, "value": -math.inf, "since": 0}


@dataclass
class TrainState:
    """Everything a resumed run needs (``last.pt``: :meth:`to_checkpoint`'s plain dict); ``best``: the
    selected ``epoch``, its ``value`` and validations ``since``; ``best_state``: its CPU weights."""

    config_hash: str
    epoch: int = 0
    elapsed: float = 0.0  # training seconds so far
    history: list[dict[str, Any]] = field(default_factory=list)
    best: dict[str, Any] = field(default_factory=_no_best)
    best_state: dict[str, Any] | None = None
    model: dict[str, Any] = field(default_factory=dict)
    loss: dict[str, Any] = field(default_factory=dict)
    optimizers: list[dict[str, Any]] = field(default_factory=list)
    schedulers: list[dict[str, Any]] = field(default_factory=list)
    scaler: dict[str, Any] = field(default_factory=dict)
    rng: dict[str, Any] = field(default_factory=dict)
    sampler: dict[str, Any] = field(default_factory=dict)
    extra: dict[str, Any] = field(default_factory=dict)
    code: str = field(default_factory=lambda: inputs_fingerprint())  # the code the stage reads

    def to_checkpoint(self) -> dict[str, Any]:
        return {f.name: getattr(self, f.name) for f in fields(self)}

    @classmethod
    def from_checkpoint(cls, state: dict[str, Any]) -> TrainState:
        missing = [f.name for f in fields(cls) if f.name not in state]
        if missing:
            raise ValueError(f"not a training checkpoint: no {', '.join(missing)}")
        return cls(**{f.name: state[f.name] for f in fields(cls)})


def save_checkpoint(directory: Path, state: TrainState) -> None:
    with atomic_path(directory / LAST) as tmp:
        torch.save(state.to_checkpoint(), tmp)


def load_checkpoint(directory: Path, config_hash: str) -> TrainState | None:
    """The saved state if it belongs to this exact config and the code the stage reads, else None.
    Raises :class:`dmlbench.safe_load.UnsafeFile` if the file holds more than tensors and plain values."""
    path = directory / LAST
    if not path.exists():
        return None
    state = load_plain(path, "delete it to start this run over")
    if not isinstance(state, dict):
        raise DataError(f"{path}: not a training checkpoint (a {type(state).__name__}, not a dict)")
    if state.get("config_hash") != config_hash or state.get("code") != inputs_fingerprint():
        return None
    return TrainState.from_checkpoint(state)


def clear_checkpoint(directory: Path) -> None:
    (directory / LAST).unlink(missing_ok=True)
