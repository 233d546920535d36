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
* ``evaluate``, ``report``, ``tracking`` - evaluation, report and MLflow settings.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import typing
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal, Mapping

import yaml
from pydantic import (
    BaseModel,
    Field,
    NonNegativeFloat,
    NonNegativeInt,
    PositiveFloat,
    PositiveInt,
    ValidationError,
    field_validator,
    model_validator,
)

from dmlbench.data import DATASETS
from dmlbench.errors import ConfigError
from dmlbench.grid import Combo, RunSpec
from dmlbench.losses import LOSSES
from dmlbench.models import BACKBONES
from dmlbench.schema import StrictModel

PARAMS_FILE = "params.yaml"

SELECTION_METRICS = ("precision_at_1", "r_precision", "map_at_r")


# --------------------------------------------------------------------------- protocol


class OptimizerConfig(StrictModel):
    """Optimiser of the trunk and embedding head; ``lr`` in 1/step units of the optimiser."""

    name: Literal["adamw", "adam", "rmsprop", "sgd"] = "adamw"
    lr: PositiveFloat
    weight_decay: NonNegativeFloat = 0.0
    momentum: NonNegativeFloat = 0.0


class SchedulerConfig(StrictModel):
    """Learning-rate schedule, stepped once per epoch. ``step``: lr *= gamma every step_size epochs."""

    name: Literal["constant", "step", "cosine"] = "constant"
    step_size: PositiveInt = 10
    gamma: PositiveFloat = 0.1


class AugmentConfig(StrictModel):
    """Image transforms. Train: RandomResizedCrop(crop_size, scale, ratio) + optional flip.
    Eval: resize short side to ``eval_resize`` px, then centre crop ``crop_size`` px."""

    crop_size: PositiveInt
    eval_resize: PositiveInt
    crop_scale: tuple[PositiveFloat, PositiveFloat] = (0.16, 1.0)
    crop_ratio: tuple[PositiveFloat, PositiveFloat] = (3 / 4, 4 / 3)
    hflip: bool = True

    @model_validator(mode="after")
    def _check(self) -> "AugmentConfig":
        if self.eval_resize < self.crop_size:
            raise ValueError(f"eval_resize ({self.eval_resize}) must be >= crop_size ({self.crop_size})")
        if not (0 < self.crop_scale[0] <= self.crop_scale[1] <= 1):
            raise ValueError(f"crop_scale must satisfy 0 < low <= high <= 1, got {list(self.crop_scale)}")
        if not (self.crop_ratio[0] <= self.crop_ratio[1]):
            raise ValueError(f"crop_ratio must satisfy low <= high, got {list(self.crop_ratio)}")
        return self


class EarlyStoppingConfig(StrictModel):
    """Validation schedule: every ``validate_every`` epochs; stop after ``patience`` validations
    without a new best ``selection_metric`` (None: never stop early). Reality Check: CUB every
    2 epochs with patience 9 (powerful-benchmarker ``save_interval``/``patience``)."""

    validate_every: PositiveInt = 1
    patience: PositiveInt | None = None


# Protocol keys that an override may change for some datasets/backbones. Keys that change the
# model or the evaluation (augment, pooling, pretrained, selection) stay the same for the
# whole grid: the embed and report stages read them from the protocol itself.
OVERRIDABLE_KEYS = (
    "epochs",
    "iterations_per_epoch",
    "batch_size",
    "samples_per_class",
    "classification_samples_per_class",
    "optimizer",
    "scheduler",
    "warmup_epochs",
    "loss_lr_multiplier",
    "frozen_bn",
    "grad_clip",
    "early_stopping",
    "losses",
)


class ProtocolOverride(StrictModel):
    """Row of a protocol's per-dataset/backbone table (e.g. thesis Table 3: lr and step size by
    dataset x backbone). Applies to runs whose dataset is in ``datasets`` and backbone in
    ``backbones`` (a missing list matches all); ``set`` holds protocol keys (nested keys merge)."""

    datasets: list[str] | None = Field(None, min_length=1)
    backbones: list[str] | None = Field(None, min_length=1)
    set: dict[str, Any] = Field(min_length=1)

    @model_validator(mode="after")
    def _check(self) -> "ProtocolOverride":
        unknown = sorted(set(self.set) - set(OVERRIDABLE_KEYS))
        if unknown:
            raise ValueError(f"set: cannot override {unknown}; allowed: {', '.join(OVERRIDABLE_KEYS)}")
        return self

    def matches(self, dataset: str, backbone: str) -> bool:
        return (self.datasets is None or dataset in self.datasets) and (
            self.backbones is None or backbone in self.backbones
        )


class Protocol(StrictModel):
    """A training protocol, written out in full: the same for every loss, as fairness demands.

    Batches: losses that need several images per class (``LossSpec.sampler == "m_per_class"``)
    get ``batch_size / samples_per_class`` classes x ``samples_per_class`` images (PML
    ``MPerClassSampler``); classification/proxy losses get ``classification_samples_per_class``
    per class, or uniformly random batches (``random``), or the same as the others (unset).
    An epoch is ``iterations_per_epoch`` batches, or one pass over the training images.
    ``warmup_epochs``: only the embedding head and the loss's own parameters train (Proxy-Anchor).
    ``losses.<name>``: the hyperparameters this protocol publishes for a loss (e.g. the Reality
    Check's tuned values; per dataset through ``overrides``), validated against the loss's own
    parameter model in :func:`parse_params`; a loss the protocol does not list keeps its defaults.
    """

    description: str = ""
    epochs: PositiveInt
    iterations_per_epoch: PositiveInt | None = None
    batch_size: PositiveInt
    samples_per_class: PositiveInt = 4
    classification_samples_per_class: PositiveInt | Literal["random"] | None = None
    optimizer: OptimizerConfig
    scheduler: SchedulerConfig = SchedulerConfig()
    warmup_epochs: NonNegativeInt = 0
    loss_lr_multiplier: PositiveFloat | None = None  # overrides every loss's param_lr_multiplier
    augment: AugmentConfig
    pretrained: bool = False
    frozen_bn: bool = False
    pooling: Literal["gap", "gmp", "gap+gmp"] = "gap"
    grad_clip: PositiveFloat | None = None  # clip each gradient value to [-grad_clip, grad_clip]
    selection_metric: Literal[SELECTION_METRICS] = "map_at_r"  # type: ignore[valid-type]
    early_stopping: EarlyStoppingConfig = EarlyStoppingConfig()
    test_feedback: bool = True  # also score the test split at each validation (analysis only)
    test_feedback_metric: Literal[SELECTION_METRICS] = "precision_at_1"  # type: ignore[valid-type]
    eval_batch_size: PositiveInt = 256
    backbones: list[str] | None = Field(None, min_length=1)  # if set, the grid may only use these
    dims: list[PositiveInt] | None = Field(None, min_length=1)  # if set, the grid may only use these
    losses: dict[str, dict[str, Any]] = Field(default_factory=dict)
    overrides: list[ProtocolOverride] = Field(default_factory=list)

    @model_validator(mode="after")
    def _check(self) -> "Protocol":
        if self.batch_size % self.samples_per_class:
            raise ValueError(
                f"batch_size ({self.batch_size}) must be a multiple of samples_per_class ({self.samples_per_class})"
            )
        m = self.classification_samples_per_class
        if isinstance(m, int) and self.batch_size % m:
            raise ValueError(
                f"batch_size ({self.batch_size}) must be a multiple of classification_samples_per_class ({m})"
            )
        if self.warmup_epochs >= self.epochs:
            raise ValueError(f"warmup_epochs ({self.warmup_epochs}) must be < epochs ({self.epochs})")
        for index, override in enumerate(self.overrides):
            try:
                self.with_override(override)
            except ValidationError as exc:
                err = exc.errors(include_url=False)[0]
                where = "".join(f"{part}: " for part in [".".join(str(p) for p in err["loc"])] if part)
                raise ValueError(f"overrides[{index}]: {where}{err['msg'].replace('Value error, ', '')}") from None
        return self

    def with_override(self, override: ProtocolOverride) -> "Protocol":
        merged = _deep_merge(self.model_dump(exclude={"overrides"}), override.set)
        return Protocol.model_validate(merged)

    def for_run(self, dataset: str, backbone: str) -> "Protocol":
        """This protocol with every matching override applied, in order (overrides dropped)."""
        protocol = self.model_copy(update={"overrides": []})
        for override in self.overrides:
            if override.matches(dataset, backbone):
                protocol = protocol.with_override(override)
        return protocol

    def sampling_for(self, loss_sampler: str) -> int | Literal["random"]:
        """Images per class in a batch for a loss with ``LossSpec.sampler`` (or ``random``)."""
        if loss_sampler == "m_per_class" or self.classification_samples_per_class is None:
            return self.samples_per_class
        return self.classification_samples_per_class


def _deep_merge(base: dict[str, Any], update: Mapping[str, Any]) -> dict[str, Any]:
    merged = dict(base)
    for key, value in update.items():
        if isinstance(value, Mapping) and isinstance(merged.get(key), dict):
            merged[key] = _deep_merge(merged[key], value)
        else:
            merged[key] = value
    return merged


# --------------------------------------------------------------------------- other sections


def _distinct_sorted(values: list[int] | None, key: str) -> list[int] | None:
    if values is not None and len(set(values)) != len(values):
        raise ValueError(f"{key} has repeated values: {values}")
    return None if values is None else sorted(values)


class DatasetEvaluateConfig(StrictModel):
    """Per-dataset overrides of ``evaluate`` (unset keys fall back to the section's values)."""

    recall_at: list[PositiveInt] | None = Field(None, min_length=1)
    clustering: bool | None = None

    @field_validator("recall_at")
    @classmethod
    def _recall_at(cls, values: list[int] | None) -> list[int] | None:
        return _distinct_sorted(values, "recall_at")


class BootstrapConfig(StrictModel):
    """Per-query bootstrap interval of one run: ``resamples`` resamples of the test queries,
    ``method`` as in ``scipy.stats.bootstrap`` (BCa costs O(queries^2)), seeded."""

    resamples: int = Field(1000, ge=100, le=100_000)
    method: Literal["percentile", "basic", "BCa"] = "percentile"
    seed: NonNegativeInt = 0


class EvaluateConfig(StrictModel):
    """Test-set evaluation (``dmlbench.evaluate``).

    ``recall_at``: the K of Recall@K; ``per_dataset.<name>`` overrides it (and
    ``clustering``) for one dataset, e.g. ``sop: {recall_at: [1, 10, 100, 1000]}``.
    ``clustering``: also NMI/AMI from k-means (``kmeans_niter`` iterations, k = classes).
    ``confidence``: of the t-interval over seeds and of the per-query bootstrap interval.
    ``backend``: neighbour search (``auto``: faiss on GPUs, torch on CUDA, the certified bf16
    ``screened`` search on CPUs with native bf16, else faiss on the CPU); all give the same results.
    """

    recall_at: list[PositiveInt] = Field(default_factory=lambda: [1, 2, 4, 8], min_length=1)
    per_dataset: dict[str, DatasetEvaluateConfig] = Field(default_factory=dict)
    clustering: bool = True
    kmeans_niter: PositiveInt = 20
    confidence: float = Field(0.95, gt=0, lt=1)
    bootstrap: BootstrapConfig = BootstrapConfig()
    backend: Literal["auto", "faiss", "torch", "screened"] = "auto"

    @field_validator("recall_at")
    @classmethod
    def _recall_at(cls, values: list[int]) -> list[int]:
        return _distinct_sorted(values, "recall_at")

    def recall_ks(self, dataset: str) -> tuple[int, ...]:
        """The K of Recall@K for ``dataset`` (its override, else ``recall_at``), ascending."""
        override = self.per_dataset.get(dataset)
        return tuple(override.recall_at if override and override.recall_at else self.recall_at)

    def clustering_for(self, dataset: str) -> bool:
        override = self.per_dataset.get(dataset)
        return self.clustering if override is None or override.clustering is None else override.clustering


class GalleryConfig(StrictModel):
    """Retrieval gallery: ``queries`` test images of distinct classes (drawn with ``seed``), top ``neighbours``."""

    queries: PositiveInt = Field(4, le=12)
    neighbours: PositiveInt = Field(4, le=8)
    max_losses: PositiveInt = Field(4, le=10)
    seed: NonNegativeInt = 0


class ReportConfig(StrictModel):
    """What the report ranks by and how it tests differences.

    ``focus_dim``: embedding size of the backbone comparison, convergence and papers-vs-reality
    figures (default: 512 if in ``dims``, else the largest). ``blocks``: the Friedman/Nemenyi
    blocks, ``experiment`` (one per dataset x backbone x dim, scored by the seed mean: the
    independent blocks Demšar 2006 asks for) or ``experiment_seed`` (each seed of each
    experiment; seeds of one experiment are not independent, so the tests' p-values are then
    optimistic). ``alpha``: level of the Friedman and Nemenyi tests. ``rope``: half-width of
    the region of practical equivalence of the Bayesian comparison, in metric units
    (0.01 = 1 point of a metric reported in percent).
    """

    primary_metric: Literal["precision_at_1", "r_precision", "map_at_r", "recall_at_1"] = "map_at_r"
    title: str = "dmlbench report"
    focus_dim: PositiveInt | None = None
    blocks: Literal["experiment", "experiment_seed"] = "experiment"
    alpha: float = Field(0.05, gt=0, lt=0.5)
    rope: float = Field(0.01, gt=0, lt=0.5)
    gallery: GalleryConfig = GalleryConfig()


class TrackingConfig(StrictModel):
    """MLflow settings; the store is ``$MLFLOW_TRACKING_URI`` or ``sqlite:///<repo>/mlflow.db``."""

    experiment: str = Field("dmlbench", min_length=1)


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

    @model_validator(mode="after")
    def _check(self) -> "_RawParams":
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
        """Reject a stage argument that is not a cell of the grid in ``params.yaml``."""
        checks = [
            ("datasets", run.dataset, list(self.datasets)),
            ("backbones", run.backbone, list(self.backbones)),
            ("losses", run.loss, list(self.losses)),
            ("dims", run.dim, self.dims),
        ]
        if isinstance(run, RunSpec):
            checks.append(("seeds", run.seed, self.seeds))
        for key, value, allowed in checks:
            if value not in allowed:
                raise ConfigError(f"{key}: {value!r} is not in params.yaml; listed: {_join(allowed)}")

    def resolved(self, run: RunSpec) -> dict[str, Any]:
        """Everything that determines one run's result, as plain data (logged and hashed)."""
        self.check_run(run)
        return {
            "dataset": {"name": run.dataset, **self.datasets[run.dataset].model_dump(mode="json")},
            "backbone": {"name": run.backbone, **self.backbones[run.backbone].model_dump(mode="json")},
            "loss": {"name": run.loss, **self.loss_params(run).model_dump(mode="json")},
            "dim": run.dim,
            "seed": run.seed,
            "protocol": {
                "name": self.protocol_name,
                **self.protocol_for(run).model_dump(mode="json", exclude={"overrides", "backbones", "dims", "losses"}),
            },
        }


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
        raise ConfigError(_one_line(exc, source, prefix="", model=_RawParams)) from None

    unknown = sorted(set(top.evaluate.per_dataset) - set(DATASETS))
    if unknown:
        raise ConfigError(
            f"{source}: evaluate.per_dataset.{unknown[0]}: unknown dataset {unknown[0]!r}; valid: {_join(DATASETS)}"
        )
    if top.protocol not in top.protocols:
        raise ConfigError(
            f"{source}: protocol: {top.protocol!r} is not a key of protocols; valid: {_join(top.protocols)}"
        )
    _check_protocol_grid(top, source, BACKBONES, DATASETS)
    _check_protocol_losses(top, source, LOSSES)
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
        loss_values={name: dict(values or {}) for name, values in top.losses.items()},
        loss_models={name: LOSSES[name].params for name in top.losses},
    )
    _check_grid_losses(params, source)
    return params


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
                    raise ConfigError(f"{source}: {where}.{loss}: unknown loss {loss!r}; valid: {_join(losses)}")
                if not isinstance(values, Mapping):
                    raise ConfigError(f"{source}: {where}.{loss}: expected a mapping of hyperparameters")
                merged = protocol.losses.get(loss, {}) if override is not None else {}
                merged = _deep_merge(dict(merged), values)
                model = losses[loss].params
                try:
                    model.model_validate(merged)
                except ValidationError as exc:
                    raise ConfigError(_one_line(exc, source, prefix=f"{where}.{loss}", model=model)) from None


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
            raise ConfigError(_one_line(exc, source, prefix=f"losses.{combo.loss}", model=model)) from None


def _check_protocol_grid(
    top: _RawParams, source: str, backbones: Mapping[str, Any], datasets: Mapping[str, Any]
) -> None:
    """The active protocol's fixed trunk/dims must match the grid; overrides name real backbones/datasets."""
    protocol = top.protocols[top.protocol]
    for key, allowed in (("backbones", protocol.backbones), ("dims", protocol.dims)):
        extra = [v for v in getattr(top, key) if allowed is not None and v not in allowed]
        if extra:
            raise ConfigError(
                f"{source}: {key}: protocol {top.protocol!r} trains only {_join(allowed)}, not {_join(extra)} "
                f"(edit protocols.{top.protocol}.{key} to deviate from it knowingly)"
            )
    for name, other in top.protocols.items():
        names = [*(other.backbones or [])] + [b for o in other.overrides for b in (o.backbones or [])]
        unknown = [b for b in names if b not in backbones]
        if unknown:
            raise ConfigError(f"{source}: protocols.{name}: unknown backbone {unknown[0]!r}; valid: {_join(backbones)}")
        unknown = [d for o in other.overrides for d in (o.datasets or []) if d not in datasets]
        if unknown:
            raise ConfigError(f"{source}: protocols.{name}: unknown dataset {unknown[0]!r}; valid: {_join(datasets)}")


def _validate_section(
    section: Mapping[str, Any], key: str, kind: str, registry: Mapping[str, Any], source: str
) -> dict[str, BaseModel]:
    validated: dict[str, BaseModel] = {}
    for name, values in section.items():
        if name not in registry:
            raise ConfigError(f"{source}: {key}.{name}: unknown {kind} {name!r}; valid: {_join(registry)}")
        model = registry[name].params
        try:
            validated[name] = model.model_validate(values or {})
        except ValidationError as exc:
            raise ConfigError(_one_line(exc, source, prefix=f"{key}.{name}", model=model)) from None
    return validated


def _one_line(exc: ValidationError, source: str, prefix: str, model: type[BaseModel]) -> str:
    """Turn pydantic's first error into ``source: dotted.key: what is wrong (got X)``."""
    err = exc.errors(include_url=False)[0]
    loc = [str(part) for part in err["loc"]]
    if loc and loc[-1] in {"[key]"}:
        loc = loc[:-1]
    key = ".".join(part for part in [prefix, *loc] if part)
    if err["type"] == "extra_forbidden":
        allowed = _allowed_keys(model, loc[:-1])
        message = f"unknown key; allowed: {_join(allowed)}" if allowed else "unknown key"
    elif err["type"] == "missing":
        message = "required key is missing"
    else:
        message = err["msg"].replace("Value error, ", "")
    if err["type"] not in {"missing", "extra_forbidden"} and "input" in err and not isinstance(err["input"], dict):
        message += f" (got {err['input']!r})"
    where = f"{key}: " if key else ""
    return f"{source}: {where}{message}"


def _allowed_keys(model: type[BaseModel], loc: list[str]) -> list[str]:
    """Field names of the (possibly nested) model that ``loc`` points into."""
    current: Any = model
    parts = list(loc)
    while parts:
        part = parts.pop(0)
        field = getattr(current, "model_fields", {}).get(part)
        if field is None:
            return []
        annotation = field.annotation
        if typing.get_origin(annotation) is dict:  # dict[str, Model]: skip the user's key
            annotation = typing.get_args(annotation)[1]
            if parts:
                parts.pop(0)
        if isinstance(annotation, type) and issubclass(annotation, BaseModel):
            current = annotation
        else:
            return []
    return sorted(getattr(current, "model_fields", {}))


def _join(values: Any) -> str:
    return ", ".join(str(v) for v in sorted(values, key=str))
