"""Load and validate ``params.yaml``: every key of the sections every stage reads, in one line.

A typo or wrong type fails the first stage, in one line naming the key and what is allowed.
``tuning:`` and ``cluster:`` are checked where read (:func:`dmlbench.params.complete.load_complete`),
so other stages do not depend on their code. ``losses.<name>`` values override the protocol's, which
override the loss module's defaults. Layout: docs/pipeline.md."""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping
from typing import Any

from pydantic import Field, NonNegativeInt, PositiveInt, ValidationError, model_validator

from dmlbench.data import DATASETS
from dmlbench.errors import ConfigError
from dmlbench.io import atomic_path
from dmlbench.losses import LOSSES
from dmlbench.messages import join_names, one_line
from dmlbench.models import BACKBONES
from dmlbench.params.files import read_params_file
from dmlbench.params.model import PARAMS_FILE, Params
from dmlbench.params.protocol import Protocol, ProtocolOverride, deep_merge
from dmlbench.params.sections import EvaluateConfig, ReportConfig, TrackingConfig
from dmlbench.schema import StrictModel


class RawParams(StrictModel):
    """The top level of ``params.yaml``: every section named, the grid's lists checked."""

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
    tuning: dict[str, Any] = Field(default_factory=dict)  # params.tuning validates it
    cluster: dict[str, Any] = Field(default_factory=dict)  # params.cluster validates it

    @model_validator(mode="after")
    def _check(self) -> RawParams:
        for key in ("dims", "seeds"):
            values = getattr(self, key)
            if len(set(values)) != len(values):
                raise ValueError(f"{key} has repeated values: {values}")
        if self.report.focus_dim is not None and self.report.focus_dim not in self.dims:
            raise ValueError(f"report.focus_dim {self.report.focus_dim} is not one of dims {self.dims}")
        return self


def validated_marker(params: Params, path: str | os.PathLike) -> None:
    """Report what ``params`` will run and write the validate stage's constant marker file."""
    print(
        f"params.yaml is valid: {len(params.datasets)} dataset(s) x {len(params.backbones)} backbone(s) x "
        f"{len(params.losses)} loss(es) x {len(params.dims)} dim(s) x {len(params.seeds)} seed(s) = "
        f"{len(params.runs())} training runs, protocol {params.protocol_name!r}"
    )
    with atomic_path(path) as tmp:
        tmp.write_text("params.yaml passed validation\n")  # constant: never invalidates downstream stages


def load_params(path: str | os.PathLike = PARAMS_FILE) -> Params:
    """Read and validate ``params.yaml``; raise :class:`ConfigError` with a one-line message."""
    return parse_params(read_params_file(path), source=str(path))


def parse_params(raw: Any, source: str = PARAMS_FILE) -> Params:
    """Validate an already-loaded params mapping (see :func:`load_params`)."""
    if not isinstance(raw, dict):
        raise ConfigError(f"{source}: expected a mapping of sections, got {type(raw).__name__}")
    try:
        top = RawParams.model_validate(raw)
    except ValidationError as exc:
        raise ConfigError(one_line(exc, source, prefix="", model=RawParams)) from None

    unknown = sorted(set(top.evaluate.per_dataset) - set(DATASETS))
    if unknown:
        raise _unknown(source, f"evaluate.per_dataset.{unknown[0]}", "dataset", unknown[0], DATASETS)
    if top.protocol not in top.protocols:
        raise ConfigError(
            f"{source}: protocol: {top.protocol!r} is not a key of protocols; valid: {join_names(top.protocols)}"
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
        tuning=top.tuning,
        cluster=top.cluster,
        loss_values={name: dict(values or {}) for name, values in top.losses.items()},
        loss_models={name: LOSSES[name].params for name in top.losses},
    )
    _check_grid_losses(params, source)
    _check_tunable(params, source)
    return params


def _unknown(source: str, where: str, kind: str, name: str, valid: Iterable[str]) -> ConfigError:
    """The one-line error for a ``kind`` named at ``where`` that is none of ``valid``."""
    return ConfigError(f"{source}: {where}: unknown {kind} {name!r}; valid: {join_names(valid)}")


def _check_tunable(params: Params, source: str) -> None:
    """A tuned protocol needs validation classes on every dataset: the search never sees test
    classes, and the ``standard`` scheme has no others."""
    if params.protocol.hyperparameters != "tuned":
        return
    for name, dataset in params.datasets.items():
        scheme = dataset.split.scheme
        if scheme == "standard":
            raise ConfigError(
                f"{source}: datasets.{name}.split.scheme: protocol {params.protocol_name!r} tunes its hyperparameters, "
                "which needs validation classes; scheme 'standard' has none (use fixed_val, last_val, rc_cv or kfold)"
            )


def _check_protocol_losses(top: RawParams, source: str, losses: Mapping[str, Any]) -> None:
    """Every protocol's loss values (its own and each override's, merged as a run would see
    them) name registered losses and validate against each loss's parameter model."""
    for name, protocol in top.protocols.items():
        if protocol.reference_loss is not None and protocol.reference_loss not in losses:
            raise _unknown(source, f"protocols.{name}.reference_loss", "loss", protocol.reference_loss, losses)
        tables: list[tuple[str, Any, ProtocolOverride | None]] = [(f"protocols.{name}.losses", protocol.losses, None)]
        tables += [
            (f"protocols.{name}.overrides[{i}].set.losses", o.set.get("losses") or {}, o)
            for i, o in enumerate(protocol.overrides)
        ]
        for where, table, override in tables:  # each a mapping of mappings: Protocol validated the overrides
            for loss, values in table.items():
                if loss not in losses:
                    raise _unknown(source, f"{where}.{loss}", "loss", loss, losses)
                base: dict[str, Any] = dict(protocol.losses.get(loss, {})) if override is not None else {}
                merged = deep_merge(base, values)
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
    top: RawParams, source: str, backbones: Mapping[str, Any], datasets: Mapping[str, Any]
) -> None:
    """The active protocol's fixed trunk/dims must match the grid; overrides name real backbones/datasets."""
    protocol = top.protocols[top.protocol]
    for key, allowed in (("backbones", protocol.backbones), ("dims", protocol.dims)):
        extra = [v for v in getattr(top, key) if allowed is not None and v not in allowed]
        if extra:
            raise ConfigError(
                f"{source}: {key}: protocol {top.protocol!r} trains only {join_names(allowed)}, not "
                f"{join_names(extra)} "
                f"(edit protocols.{top.protocol}.{key} to deviate from it knowingly)"
            )
    for name, other in top.protocols.items():
        names = [*(other.backbones or [])] + [b for o in other.overrides for b in (o.backbones or [])]
        unknown = [b for b in names if b not in backbones]
        if unknown:
            raise _unknown(source, f"protocols.{name}", "backbone", unknown[0], backbones)
        unknown = [d for o in other.overrides for d in (o.datasets or []) if d not in datasets]
        if unknown:
            raise _unknown(source, f"protocols.{name}", "dataset", unknown[0], datasets)


def _validate_section(
    section: Mapping[str, Any], key: str, kind: str, registry: Mapping[str, Any], source: str
) -> dict[str, Any]:
    """Each entry of a registry-keyed section validated by its registry entry's own model (one line
    naming the key otherwise); the values are the registry's parameter models."""
    validated: dict[str, Any] = {}
    for name, values in section.items():
        if name not in registry:
            raise _unknown(source, f"{key}.{name}", kind, name, registry)
        model = registry[name].params
        try:
            validated[name] = model.model_validate(values or {})
        except ValidationError as exc:
            raise ConfigError(one_line(exc, source, prefix=f"{key}.{name}", model=model)) from None
    return validated
