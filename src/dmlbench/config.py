"""One schema for ``params.yaml``: load it, validate every key, resolve one run's config.

Every stage calls :func:`load_params` first, so a typo or a wrong type fails the first
stage that runs, in one line that names the key and what is allowed, before any
expensive work starts.

Layout of ``params.yaml`` (the DVC ``matrix`` iterates over the keys of the first three):

* ``datasets.<name>``  - every dataset listed is downloaded, prepared and trained on;
* ``backbones.<name>`` - every backbone listed is trained;
* ``losses.<name>``    - every loss listed is trained; values given here deviate from the
  protocol's (``protocols.<p>.losses.<name>``, per dataset/backbone through its overrides),
  which deviate from the loss module's defaults;
* ``dims``, ``seeds``  - embedding sizes and seeds of the grid;
* ``protocol``         - the key of ``protocols`` used for training (optimiser, batch, ...);
* ``evaluate``, ``report``, ``tracking`` - evaluation, report and MLflow settings;
* ``tuning`` - the search (:mod:`dmlbench.tune.settings`); ``cluster`` - Slurm resources per
  stage kind (:mod:`dmlbench.cluster.settings`), read by ``--executor slurm`` only.

The section models live in :mod:`dmlbench.protocol` and :mod:`dmlbench.settings` (re-exported
here), the one-line error messages in :mod:`dmlbench.messages`; one run's resolved settings
are a :class:`dmlbench.run_config.RunConfig`.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel, Field, NonNegativeInt, PositiveInt, ValidationError, model_validator

from dmlbench.cluster.settings import ClusterConfig
from dmlbench.data import DATASETS
from dmlbench.errors import ConfigError
from dmlbench.grid import Combo, RunSpec
from dmlbench.losses import LOSSES
from dmlbench.messages import join_names, one_line
from dmlbench.models import BACKBONES
from dmlbench.protocol import (
    OVERRIDABLE_KEYS,
    SELECTION_METRICS,
    AugmentConfig,
    EarlyStoppingConfig,
    OptimizerConfig,
    Protocol,
    ProtocolOverride,
    SchedulerConfig,
    deep_merge,
)
from dmlbench.schema import StrictModel
from dmlbench.settings import (
    BootstrapConfig,
    DatasetEvaluateConfig,
    EvaluateConfig,
    GalleryConfig,
    ReportConfig,
    TrackingConfig,
)
from dmlbench.tune.settings import TuningConfig

PARAMS_FILE = "params.yaml"

__all__ = [
    "OVERRIDABLE_KEYS",
    "PARAMS_FILE",
    "SELECTION_METRICS",
    "AugmentConfig",
    "BootstrapConfig",
    "Combo",
    "DatasetEvaluateConfig",
    "EarlyStoppingConfig",
    "EvaluateConfig",
    "GalleryConfig",
    "OptimizerConfig",
    "Params",
    "Protocol",
    "ProtocolOverride",
    "ReportConfig",
    "RunSpec",
    "SchedulerConfig",
    "TrackingConfig",
    "TuningConfig",
    "config_hash",
    "flatten",
    "load_params",
    "parse_params",
    "validated_marker",
]


# --------------------------------------------------------------------------- top level


class _RawParams(StrictModel):
    datasets: dict[str, dict[str, Any] | None] = Field(min_length=1)
    backbones: dict[str, dict[str, Any] | None] = Field(min_length=1)
    losses: dict[str, dict[str, Any] | None] = Field(min_length=1)
    dims: list[PositiveInt] = Field(min_length=1)
    seeds: list[NonNegativeInt] = Field(min_length=1)
    protocol: str
    protocols: dict[str, Protocol] = Field(min_length=1)
    evaluate: EvaluateConfig = EvaluateConfig()
    report: ReportConfig = ReportConfig()
    tracking: TrackingConfig = TrackingConfig()
    tuning: TuningConfig = TuningConfig()
    cluster: ClusterConfig = ClusterConfig()

    @model_validator(mode="after")
    def _check(self) -> _RawParams:
        for key in ("dims", "seeds"):
            values = getattr(self, key)
            if len(set(values)) != len(values):
                raise ValueError(f"{key} has repeated values: {values}")
        if self.report.focus_dim is not None and self.report.focus_dim not in self.dims:
            raise ValueError(f"report.focus_dim {self.report.focus_dim} is not one of dims {self.dims}")
        return self


@dataclass(frozen=True)
class Params:
    """Validated ``params.yaml``. Section values are the registry's typed parameter models.

    ``losses`` holds each listed loss's parameters as ``losses.<name>`` sets them over the
    module defaults; what a run trains with is :meth:`loss_params` (the protocol's values for
    the run's dataset and backbone added). ``loss_values`` are the keys ``losses.<name>`` sets.
    """

    datasets: dict[str, BaseModel]
    backbones: dict[str, BaseModel]
    losses: dict[str, BaseModel]
    dims: list[int]
    seeds: list[int]
    protocol_name: str
    protocols: dict[str, Protocol]
    evaluate: EvaluateConfig
    report: ReportConfig
    tracking: TrackingConfig
    tuning: TuningConfig = TuningConfig()
    cluster: ClusterConfig = ClusterConfig()
    loss_values: dict[str, dict[str, Any]] = dataclasses.field(default_factory=dict)
    loss_models: dict[str, type[BaseModel]] = dataclasses.field(default_factory=dict)

    @property
    def protocol(self) -> Protocol:
        return self.protocols[self.protocol_name]

    def loss_params(self, run: RunSpec | Combo) -> BaseModel:
        """The loss hyperparameters of one run: the loss module's defaults, then the protocol's
        ``losses.<name>`` for the run's dataset and backbone, then ``losses.<name>`` of
        ``params.yaml`` (a key set in both is rejected by :func:`parse_params`)."""
        values = {**self.protocol_for(run).losses.get(run.loss, {}), **self.loss_values.get(run.loss, {})}
        return self.loss_models[run.loss].model_validate(values)

    def loss_source(self, run: RunSpec | Combo) -> str:
        """Where a run's loss hyperparameters come from: ``protocol`` when the active protocol
        sets any of them for this dataset/backbone, ``params`` when only ``losses.<name>`` does,
        else ``defaults`` (the loss module's published defaults)."""
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
        """Reject a stage argument that is not a cell of the grid in ``params.yaml`` (a baseline
        cell: its variant in ``tuning.baselines``, its dim ``tuning.dim``)."""
        if run.variant:
            self.check_baseline(run)
        self.check_listed(run.dataset, run.backbone, run.loss, run.dim, getattr(run, "seed", None))

    def check_baseline(self, run: RunSpec | Combo) -> None:
        """Reject a baseline cell that ``tuning.baselines`` / ``tuning.dim`` do not ask for."""
        if run.variant not in self.tuning.baselines:
            raise ConfigError(
                f"variant {run.variant!r} is not in tuning.baselines {self.tuning.baselines} of params.yaml"
            )
        if run.dim != self.tuning.dim:
            raise ConfigError(f"dim {run.dim}: a {run.variant} baseline trains at tuning.dim {self.tuning.dim}")

    def baseline_combos(self) -> list[Combo]:
        """The baseline cells of ``tuning.baselines``: each loss at ``tuning.dim`` per variant."""
        return [
            Combo(d, b, loss, self.tuning.dim, variant)
            for variant in self.tuning.baselines
            for d in self.datasets
            for b in self.backbones
            for loss in self.losses
        ]

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
            if value is not None and value not in allowed:
                raise ConfigError(f"{key}: {value!r} is not in params.yaml; listed: {join_names(allowed)}")


def validated_marker(params: Params, path: str | os.PathLike) -> None:
    """Report what ``params`` will run and write the validate stage's constant marker file."""
    from dmlbench.io import atomic_path

    print(
        f"params.yaml is valid: {len(params.datasets)} dataset(s) x {len(params.backbones)} backbone(s) x "
        f"{len(params.losses)} loss(es) x {len(params.dims)} dim(s) x {len(params.seeds)} seed(s) = "
        f"{len(params.runs())} training runs, protocol {params.protocol_name!r}"
    )
    with atomic_path(path) as tmp:
        tmp.write_text("params.yaml passed validation\n")  # constant: never invalidates downstream stages


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


# --------------------------------------------------------------------------- loading


def load_params(path: str | os.PathLike = PARAMS_FILE) -> Params:
    """Read and validate ``params.yaml``; raise :class:`ConfigError` with a one-line message."""
    path = Path(path)
    try:
        raw = yaml.safe_load(path.read_text())
    except FileNotFoundError:
        raise ConfigError(f"{path}: file not found (run from the repository root)") from None
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" line {mark.line + 1}" if mark is not None else ""
        raise ConfigError(f"{path}:{where}: not valid YAML ({getattr(exc, 'problem', exc)})") from None
    return parse_params(raw, source=str(path))


def parse_params(raw: Any, source: str = PARAMS_FILE) -> Params:
    """Validate an already-loaded params mapping (see :func:`load_params`)."""
    if not isinstance(raw, dict):
        raise ConfigError(f"{source}: expected a mapping of sections, got {type(raw).__name__}")
    try:
        top = _RawParams.model_validate(raw)
    except ValidationError as exc:
        raise ConfigError(one_line(exc, source, prefix="", model=_RawParams)) from None

    unknown = sorted(set(top.evaluate.per_dataset) - set(DATASETS))
    if unknown:
        raise ConfigError(
            f"{source}: evaluate.per_dataset.{unknown[0]}: unknown dataset {unknown[0]!r}; valid: {join_names(DATASETS)}"
        )
    if top.protocol not in top.protocols:
        raise ConfigError(
            f"{source}: protocol: {top.protocol!r} is not a key of protocols; valid: {join_names(top.protocols)}"
        )
    _check_protocol_grid(top, source, BACKBONES, DATASETS)
    _check_protocol_losses(top, source, LOSSES)
    try:
        top.tuning.check(LOSSES, source)
    except ValueError as exc:
        raise ConfigError(str(exc)) from None
    params = Params(
        datasets=_validate_section(top.datasets, "datasets", "dataset", DATASETS, source),
        backbones=_validate_section(top.backbones, "backbones", "backbone", BACKBONES, source),
        losses=_validate_section(top.losses, "losses", "loss", LOSSES, source),
        dims=list(top.dims),
        seeds=list(top.seeds),
        protocol_name=top.protocol,
        protocols=dict(top.protocols),
        evaluate=top.evaluate,
        report=top.report,
        tracking=top.tracking,
        tuning=top.tuning,
        cluster=top.cluster,
        loss_values={name: dict(values or {}) for name, values in top.losses.items()},
        loss_models={name: LOSSES[name].params for name in top.losses},
    )
    _check_grid_losses(params, source)
    _check_tunable(params, source)
    return params


def _check_tunable(params: Params, source: str) -> None:
    """A tuned protocol needs validation classes on every dataset (the search never sees test
    classes, and the ``standard`` scheme has no others); ``tuning.baselines`` needs a tuned
    protocol (else the grid already is the published values) and a grid cell at ``tuning.dim``."""
    baselines = params.tuning.baselines
    if baselines and params.protocol.hyperparameters != "tuned":
        raise ConfigError(
            f"{source}: tuning.baselines: {baselines} compares tuned with published values, but protocol "
            f"{params.protocol_name!r} trains its published values already (set tuning.baselines: [])"
        )
    if baselines and params.tuning.dim not in params.dims:
        raise ConfigError(
            f"{source}: tuning.baselines: the baseline is compared at tuning.dim {params.tuning.dim}, "
            f"which dims {params.dims} does not list (add it, or set tuning.baselines: [])"
        )
    if params.protocol.hyperparameters != "tuned":
        return
    for name, dataset in params.datasets.items():
        scheme = dataset.split.scheme
        if scheme == "standard":
            raise ConfigError(
                f"{source}: datasets.{name}.split.scheme: protocol {params.protocol_name!r} tunes its hyperparameters, "
                "which needs validation classes; scheme 'standard' has none (use fixed_val, rc_cv or kfold)"
            )


def _check_protocol_losses(top: _RawParams, source: str, losses: Mapping[str, Any]) -> None:
    """Every protocol's loss values (its own and each override's, merged as a run would see
    them) name registered losses and validate against each loss's parameter model."""
    for name, protocol in top.protocols.items():
        tables = [(f"protocols.{name}.losses", protocol.losses, None)]
        tables += [
            (f"protocols.{name}.overrides[{i}].set.losses", o.set.get("losses") or {}, o)
            for i, o in enumerate(protocol.overrides)
        ]
        for where, table, override in tables:
            if not isinstance(table, Mapping):
                raise ConfigError(f"{source}: {where}: expected a mapping of loss names, got {type(table).__name__}")
            for loss, values in table.items():
                if loss not in losses:
                    raise ConfigError(f"{source}: {where}.{loss}: unknown loss {loss!r}; valid: {join_names(losses)}")
                if not isinstance(values, Mapping):
                    raise ConfigError(f"{source}: {where}.{loss}: expected a mapping of hyperparameters")
                merged = protocol.losses.get(loss, {}) if override is not None else {}
                merged = deep_merge(dict(merged), values)
                model = losses[loss].params
                try:
                    model.model_validate(merged)
                except ValidationError as exc:
                    raise ConfigError(one_line(exc, source, prefix=f"{where}.{loss}", model=model)) from None


def _check_grid_losses(params: Params, source: str) -> None:
    """Each grid cell's loss parameters validate, and ``losses.<name>`` does not silently
    replace a value the active protocol publishes (edit the protocol to deviate from it)."""
    for combo in params.combos():
        preset = params.protocol_for(combo).losses.get(combo.loss, {})
        clash = sorted(set(preset) & set(params.loss_values.get(combo.loss, {})))
        if clash:
            key = clash[0]
            raise ConfigError(
                f"{source}: losses.{combo.loss}.{key}: protocol {params.protocol_name!r} sets it to {preset[key]!r} "
                f"for {combo.dataset}/{combo.backbone}; remove it here, or edit protocols.{params.protocol_name} "
                "to deviate from the protocol knowingly"
            )
        try:
            params.loss_params(combo)
        except ValidationError as exc:
            model = params.loss_models[combo.loss]
            raise ConfigError(one_line(exc, source, prefix=f"losses.{combo.loss}", model=model)) from None


def _check_protocol_grid(
    top: _RawParams, source: str, backbones: Mapping[str, Any], datasets: Mapping[str, Any]
) -> None:
    """The active protocol's fixed trunk/dims must match the grid; overrides name real backbones/datasets."""
    protocol = top.protocols[top.protocol]
    for key, allowed in (("backbones", protocol.backbones), ("dims", protocol.dims)):
        extra = [v for v in getattr(top, key) if allowed is not None and v not in allowed]
        if extra:
            raise ConfigError(
                f"{source}: {key}: protocol {top.protocol!r} trains only {join_names(allowed)}, not {join_names(extra)} "
                f"(edit protocols.{top.protocol}.{key} to deviate from it knowingly)"
            )
    for name, other in top.protocols.items():
        names = [*(other.backbones or [])] + [b for o in other.overrides for b in (o.backbones or [])]
        unknown = [b for b in names if b not in backbones]
        if unknown:
            raise ConfigError(
                f"{source}: protocols.{name}: unknown backbone {unknown[0]!r}; valid: {join_names(backbones)}"
            )
        unknown = [d for o in other.overrides for d in (o.datasets or []) if d not in datasets]
        if unknown:
            raise ConfigError(
                f"{source}: protocols.{name}: unknown dataset {unknown[0]!r}; valid: {join_names(datasets)}"
            )


def _validate_section(
    section: Mapping[str, Any], key: str, kind: str, registry: Mapping[str, Any], source: str
) -> dict[str, BaseModel]:
    validated: dict[str, BaseModel] = {}
    for name, values in section.items():
        if name not in registry:
            raise ConfigError(f"{source}: {key}.{name}: unknown {kind} {name!r}; valid: {join_names(registry)}")
        model = registry[name].params
        try:
            validated[name] = model.model_validate(values or {})
        except ValidationError as exc:
            raise ConfigError(one_line(exc, source, prefix=f"{key}.{name}", model=model)) from None
    return validated
