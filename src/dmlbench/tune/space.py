"""A loss's search space as Optuna suggestions, its published point, and the one-at-a-time grid."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from pydantic import BaseModel

from dmlbench.losses.search import Choice, Dimension, FloatRange, IntRange, grid_points


def suggest(trial: Any, space: Mapping[str, Dimension]) -> dict[str, Any]:
    """One value per dimension from an ``optuna.Trial`` (fixed values of an enqueued trial win)."""
    values: dict[str, Any] = {}
    for key, dim in space.items():
        if isinstance(dim, FloatRange):
            values[key] = trial.suggest_float(key, dim.low, dim.high, log=dim.log)
        elif isinstance(dim, IntRange):
            values[key] = trial.suggest_int(key, dim.low, dim.high, log=dim.log)
        elif isinstance(dim, Choice):
            values[key] = trial.suggest_categorical(key, list(dim.values))
        else:  # pragma: no cover - Dimension is closed
            raise TypeError(f"unknown dimension {dim!r}")
    return values


def published_point(space: Mapping[str, Dimension], published: BaseModel, param_lr: float | None) -> dict[str, Any]:
    """The published values of the searched keys (``param_lr``: the effective lr, ``optimizer_lr``);
    keys without a value are left out (the sampler draws them)."""
    point = {}
    for key in space:
        value = getattr(published, key, None)
        if key == "param_lr" and param_lr is not None:
            value = param_lr
        if value is not None:
            point[key] = value
    return point


def one_at_a_time(space: Mapping[str, Dimension], published: Mapping[str, Any], points: int) -> list[dict[str, Any]]:
    """The thesis's search (§5.2): the published point, then each hyperparameter alone over
    ``points`` values of its range (the others at their published values)."""
    candidates = [dict(published)]
    for key, dim in space.items():
        for value in grid_points(dim, points):
            if value != published.get(key):
                candidates.append({**published, key: value})
    return candidates
