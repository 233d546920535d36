"""The ``tuning:`` section of ``params.yaml``: how ``tune@<dataset>-<backbone>-<loss>`` searches.

The Reality Check (Musgrave, Belongie & Lim, ECCV 2020, §4): 50 Bayesian-optimisation iterations
per loss and dataset, scored by mean validation MAP@R over the folds, at dim 128.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from functools import lru_cache
from typing import Any, Literal

from pydantic import Field, NonNegativeInt, PositiveInt, ValidationError, field_validator, model_validator

from dmlbench.errors import ConfigError
from dmlbench.grid import Combo, RunSpec
from dmlbench.losses import LOSSES
from dmlbench.losses.search import Dimension, check_space, parse_dimension
from dmlbench.messages import one_line
from dmlbench.params.model import Params
from dmlbench.params.protocol import SELECTION_METRICS
from dmlbench.schema import StrictModel

SAMPLERS = ("gp", "tpe", "random", "one_at_a_time")
PRUNERS = ("none", "median")
BASELINES = ("published",)  # what a tuned grid can be compared with (tuning.baselines)
_PASSWORD_IN_URL = re.compile(r"^[a-z0-9+]+://[^/@:]+:[^/@]+@")


class TuningConfig(StrictModel):
    """Search settings, the same for every loss (the fair-comparison rule; docs/tuning.md).
    ``sampler: gp`` is like RC's Ax GPEI; ``storage``: an RDB URL (password from ``PGPASSWORD`` or
    ``~/.pgpass``, never params.yaml); ``seed`` is outside the grid's ``seeds``, so selection luck
    never reaches the test scores."""

    sampler: Literal[SAMPLERS] = "gp"  # type: ignore[valid-type]
    trials: PositiveInt = 50  # RC: 50 iterations per loss and dataset
    startup_trials: NonNegativeInt = 10
    objective: Literal[SELECTION_METRICS] = "map_at_r"  # type: ignore[valid-type]
    dim: PositiveInt | None = None  # RC tuned at 128; None = the grid's largest dim
    seed: NonNegativeInt = 1000  # outside the grid's seeds: no grid run repeats a trial the search picked
    pruner: Literal[PRUNERS] = "none"  # type: ignore[valid-type]
    start_from_published: bool = True
    points_per_key: int = Field(5, ge=2)
    workers: PositiveInt = 1
    storage: str | None = None
    space: dict[str, dict[str, Any]] = Field(default_factory=dict)
    baselines: list[Literal[BASELINES]] = Field(default_factory=list)  # type: ignore[valid-type]

    @field_validator("baselines")
    @classmethod
    def _unique_baselines(cls, baselines: list[str]) -> list[str]:
        if len(set(baselines)) != len(baselines):
            raise ValueError(f"baselines has repeated values: {baselines}")
        return baselines

    @field_validator("storage")
    @classmethod
    def _storage(cls, url: str | None) -> str | None:
        if url is None:
            return None
        if not re.match(r"^(postgresql|postgresql\+\w+|mysql\+\w+|mysql|sqlite)://", url):
            raise ValueError(f"storage must be an RDB URL (postgresql://user@host/db) or null, got {url!r}")
        if _PASSWORD_IN_URL.match(url):
            raise ValueError(
                "storage: put no password in the URL (params.yaml is committed); use PGPASSWORD or ~/.pgpass"
            )
        return url

    @model_validator(mode="after")
    def _pruned_trials_inform_the_sampler(self) -> TuningConfig:
        # Optuna's GPSampler fits complete trials only: after a pruned trial it proposes the same
        # point again (TPE models pruned trials by their last reported value)
        if self.pruner != "none" and self.sampler == "gp":
            raise ValueError(
                "pruner median needs a sampler that learns from pruned trials (tpe, random); "
                "gp fits complete trials only (use pruner: none with gp)"
            )
        return self

    def dimensions(self, loss: str, declared: Mapping[str, Dimension], fixed: set[str]) -> dict[str, Dimension]:
        """The searched space of ``loss``: its declared dimensions, replaced or extended by
        ``space.<loss>``, minus the keys ``fixed`` by ``losses.<loss>`` in params.yaml."""
        merged = dict(declared)
        merged.update({key: parse_dimension(raw) for key, raw in (self.space.get(loss) or {}).items()})
        return {key: dim for key, dim in merged.items() if key not in fixed}

    def check(self, losses: Mapping[str, Any], source: str) -> None:
        """Each ``space.<loss>`` names a registered loss and fits its params model; raise
        ValueError ``source: tuning.space.<loss>.<key>: ...`` on the first problem."""
        for loss, table in self.space.items():
            if loss not in losses:
                raise ValueError(
                    f"{source}: tuning.space.{loss}: unknown loss; registered: {', '.join(sorted(losses))}"
                )
            where = f"tuning.space.{loss}"
            parsed = {}
            for key, raw in table.items():
                try:
                    parsed[key] = parse_dimension(raw)
                except ValueError as exc:
                    raise ValueError(f"{source}: {where}.{key}: {exc}") from None
            try:
                check_space(loss, losses[loss].params, parsed, where)
            except ValueError as exc:
                raise ValueError(f"{source}: {exc}") from None


@lru_cache(maxsize=16)
def tuning_settings(params: Params, source: str = "params.yaml") -> TuningConfig:
    """The validated ``tuning:`` section (``dim`` resolved), checked against the grid (space fits the
    loss, baselines need a tuned protocol, ``dim`` in ``dims``): else a one-line :class:`ConfigError`."""
    try:
        tuning = TuningConfig.model_validate(dict(params.tuning))
    except ValidationError as exc:
        raise ConfigError(one_line(exc, source, prefix="tuning", model=TuningConfig)) from None
    try:
        tuning.check(LOSSES, source)
    except ValueError as exc:
        raise ConfigError(str(exc)) from None
    if tuning.dim is None:
        tuning = tuning.model_copy(update={"dim": search_dim(params)})
    baselines = tuning.baselines
    if baselines and params.protocol.hyperparameters != "tuned":
        raise ConfigError(
            f"{source}: tuning.baselines: {baselines} compares tuned with published values, but protocol "
            f"{params.protocol_name!r} trains its published values already (set tuning.baselines: [])"
        )
    if baselines and tuning.dim not in params.dims:
        raise ConfigError(
            f"{source}: tuning.baselines: the baseline is compared at tuning.dim {tuning.dim}, which dims "
            f"{params.dims} does not list (set tuning.dim: null to follow the grid, or set tuning.baselines: [])"
        )
    return tuning


def search_dim(params: Params) -> int:
    """The search's embedding size (``tuning.dim``, else the grid's largest), from those two keys alone."""
    dim = params.tuning.get("dim")
    return int(dim) if dim is not None else max(params.dims)


def check_baseline(params: Params, run: RunSpec | Combo) -> None:
    """Reject a baseline cell that ``tuning.baselines`` / ``tuning.dim`` do not ask for."""
    tuning = tuning_settings(params)
    if run.variant not in tuning.baselines:
        raise ConfigError(f"variant {run.variant!r} is not in tuning.baselines {tuning.baselines} of params.yaml")
    if run.dim != tuning.dim:
        raise ConfigError(f"dim {run.dim}: a {run.variant} baseline trains at tuning.dim {tuning.dim}")


def baseline_combos(params: Params) -> list[Combo]:
    """The baseline cells of ``tuning.baselines``: each loss at ``tuning.dim`` per variant."""
    tuning = tuning_settings(params)
    return [
        Combo(d, b, loss, search_dim(params), variant)
        for variant in tuning.baselines
        for d in params.datasets
        for b in params.backbones
        for loss in params.losses
    ]
