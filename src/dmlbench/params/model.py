"""The validated ``params.yaml`` (:func:`dmlbench.params.load.parse_params`); ``tuning:`` and
``cluster:`` stay raw mappings, validated only where read."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from dmlbench.errors import ConfigError
from dmlbench.grid import Combo, RunSpec
from dmlbench.messages import join_names
from dmlbench.params.protocol import Protocol
from dmlbench.params.sections import EvaluateConfig, ReportConfig, TrackingConfig

if TYPE_CHECKING:  # the registries' base models, for the annotations only
    from dmlbench.data.base import DatasetParams
    from dmlbench.losses.base import LossParams
    from dmlbench.models.base import BackboneParams

PARAMS_FILE = "params.yaml"


@dataclass(frozen=True, eq=False)
class Params:
    """Validated ``params.yaml``: the registries' typed parameter models. A run's loss values:
    :meth:`loss_params`; ``loss_values``: the keys ``losses.<name>`` sets."""

    datasets: dict[str, DatasetParams]
    backbones: dict[str, BackboneParams]
    losses: dict[str, LossParams]
    dims: list[int]
    seeds: list[int]
    protocol_name: str
    protocols: dict[str, Protocol]
    evaluate: EvaluateConfig
    report: ReportConfig
    tracking: TrackingConfig
    tuning: Mapping[str, Any] = field(default_factory=dict)  # raw: params.tuning.tuning_settings validates it
    cluster: Mapping[str, Any] = field(default_factory=dict)  # raw: params.cluster.cluster_settings validates it
    loss_values: dict[str, dict[str, Any]] = field(default_factory=dict)
    loss_models: dict[str, type[LossParams]] = field(default_factory=dict)

    @property
    def protocol(self) -> Protocol:
        return self.protocols[self.protocol_name]

    def loss_values_for(self, run: RunSpec | Combo, published_only: bool = False) -> dict[str, Any]:
        """The values a run's loss is built with before tuning: the protocol's for the dataset and
        backbone, then ``losses.<name>`` (``published_only``: the protocol's alone). The one merge."""
        values = dict(self.protocol_for(run).losses.get(run.loss, {}))
        if not published_only:
            values.update(self.loss_values.get(run.loss, {}))
        return values

    def loss_params(self, run: RunSpec | Combo) -> LossParams:
        """One run's loss hyperparameters (untuned): the module defaults under :meth:`loss_values_for`."""
        return self.loss_models[run.loss].model_validate(self.loss_values_for(run))

    def loss_source(self, run: RunSpec | Combo) -> str:
        """Where a run's loss values come from: ``protocol``, ``params`` (``losses.<name>``) or ``defaults``."""
        if self.protocol_for(run).losses.get(run.loss):
            return "protocol"
        return "params" if self.loss_values.get(run.loss) else "defaults"

    def protocol_for(self, run: RunSpec | Combo) -> Protocol:
        """The protocol of one run: ``protocol`` with its dataset/backbone overrides applied."""
        return self.protocol.for_run(run.dataset, run.backbone)

    def combos(self) -> list[Combo]:
        """Every grid cell, in params order."""
        return [
            Combo(d, b, loss, dim)
            for d in self.datasets
            for b in self.backbones
            for loss in self.losses
            for dim in self.dims
        ]

    def runs(self) -> list[RunSpec]:
        return [combo.with_seed(seed) for combo in self.combos() for seed in self.seeds]

    def check_run(self, run: RunSpec | Combo) -> None:
        """Reject a stage argument that is not a cell of the grid in ``params.yaml``; a baseline
        cell's variant and dim are the tuning section's (:func:`dmlbench.params.tuning.check_baseline`)."""
        self.check_listed(run.dataset, run.backbone, run.loss, run.dim, getattr(run, "seed", None))

    def check_listed(
        self,
        dataset: str,
        backbone: str | None = None,
        loss: str | None = None,
        dim: int | None = None,
        seed: int | None = None,
    ) -> None:
        """Reject stage arguments that params.yaml does not list (None: not checked); the one
        membership check of every stage (a run, a grid cell, a dataset x backbone, a dataset)."""
        checks = [
            ("datasets", dataset, list(self.datasets)),
            ("backbones", backbone, list(self.backbones)),
            ("losses", loss, list(self.losses)),
            ("dims", dim, self.dims),
            ("seeds", seed, self.seeds),
        ]
        for key, value, allowed in checks:
            if value is not None and value not in allowed:  # type: ignore[operator]
                raise ConfigError(f"{key}: {value!r} is not in params.yaml; listed: {join_names(allowed)}")


def config_hash(resolved: Mapping[str, Any]) -> str:
    """Short stable hash of a resolved run config (identifies a run across re-executions)."""
    blob = json.dumps(resolved, sort_keys=True, separators=(",", ":")).encode()
    return hashlib.sha256(blob).hexdigest()[:16]


def flatten(data: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    """``{"a": {"b": 1}}`` -> ``{"a.b": 1}`` (lists kept as values)."""
    flat: dict[str, Any] = {}
    for key, value in data.items():
        name = f"{prefix}{key}"
        if isinstance(value, Mapping):
            flat.update(flatten(value, prefix=f"{name}."))
        else:
            flat[name] = value
    return flat
