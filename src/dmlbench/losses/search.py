"""Hyperparameter search spaces, declared next to each loss and checked against its params model.

A loss module lists the dimensions the Reality Check searched (``SEARCH_SPACE``, cited there);
``tuning.space.<loss>`` in ``params.yaml`` replaces dimensions or adds others. A dimension is

* ``FloatRange(low, high, log)`` - a real interval (``log``: searched on the log scale, low > 0);
* ``IntRange(low, high, log)``   - an integer interval;
* ``Choice(values)``             - a grid of values (any type the hyperparameter accepts).

In ``params.yaml``: ``{low: 0.0, high: 2.0}``, ``{low: 1e-6, high: 1e-1, log: true}``,
``{low: 5, high: 50, int: true}`` or ``[8, 16, 32]``. :func:`check_space` rejects an unknown
hyperparameter, an empty or inverted range, a bound or grid value the hyperparameter does not
accept, and a real range on an integer hyperparameter, in one line naming the key.
"""

from __future__ import annotations

import math
import types
import typing
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Annotated, Any, Union

from pydantic import BaseModel, TypeAdapter, ValidationError

from dmlbench.messages import first_error


@dataclass(frozen=True)
class FloatRange:
    low: float
    high: float
    log: bool = False

    def describe(self) -> str:
        return f"[{self.low:g}, {self.high:g}]" + (" log" if self.log else "")


@dataclass(frozen=True)
class IntRange:
    low: int
    high: int
    log: bool = False

    def describe(self) -> str:
        return f"{{{self.low}..{self.high}}}" + (" log" if self.log else "")


@dataclass(frozen=True)
class Choice:
    values: tuple[Any, ...]

    def describe(self) -> str:
        return "{" + ", ".join(str(v) for v in self.values) + "}"


Dimension = FloatRange | IntRange | Choice

# The learning rate of a loss's own parameters (proxies, class weights), as the Reality Check
# searched it for every such loss: log-uniform on [1e-6, 1] (powerful-benchmarker, branch
# metric-learning, configs/config_optimizers/with_metric_loss_optimizer_bayes_opt.yaml)
PARAM_LR = FloatRange(1e-6, 1.0, log=True)
SearchSpace = Mapping[str, Dimension]
ALLOWED_FORMS = "{low, high[, log][, int]} or a list of values"


def parse_dimension(raw: Any) -> Dimension:
    """A dimension from its ``params.yaml`` form (see the module docstring)."""
    if isinstance(raw, (list, tuple)):
        if not raw:
            raise ValueError("empty list of values")
        return Choice(tuple(raw))
    if isinstance(raw, Mapping):
        unknown = sorted(set(raw) - {"low", "high", "log", "int"})
        if unknown or not {"low", "high"} <= set(raw):
            raise ValueError(f"expected {ALLOWED_FORMS}, got keys {sorted(raw)}")
        low, high, log, integer = raw["low"], raw["high"], bool(raw.get("log", False)), bool(raw.get("int", False))
        for name, value in (("low", low), ("high", high)):
            if isinstance(value, bool) or not isinstance(value, (int, float)):
                raise ValueError(f"{name} must be a number, got {value!r}")
        if integer:
            if int(low) != low or int(high) != high:
                raise ValueError(f"an int range needs integer bounds, got [{low}, {high}]")
            return IntRange(int(low), int(high), log)
        return FloatRange(float(low), float(high), log)
    raise ValueError(f"expected {ALLOWED_FORMS}, got {raw!r}")


def _is_integer(annotation: Any) -> bool:
    """Whether a field annotation accepts ints only (``int``, ``PositiveInt``, ``int | None``)."""
    origin = typing.get_origin(annotation)
    if origin is Annotated:
        return _is_integer(typing.get_args(annotation)[0])
    if origin in (Union, types.UnionType):
        return all(_is_integer(a) for a in typing.get_args(annotation) if a is not type(None))
    return annotation is int


def _field_adapter(model: type[BaseModel], key: str) -> TypeAdapter[Any]:
    field = model.model_fields[key]
    annotation: Any = Annotated[field.annotation, *field.metadata] if field.metadata else field.annotation
    return TypeAdapter(annotation)


def check_dimension(model: type[BaseModel], key: str, dimension: Dimension) -> None:
    """Raise ValueError (one line, without the key) if ``dimension`` does not fit ``model.key``."""
    adapter = _field_adapter(model, key)
    field = model.model_fields[key]
    if isinstance(dimension, Choice):
        values = dimension.values
    else:
        if not dimension.low < dimension.high:
            raise ValueError(f"empty or inverted range [{dimension.low}, {dimension.high}]: low must be < high")
        if dimension.log and dimension.low <= 0:
            raise ValueError(f"a log range needs low > 0, got [{dimension.low}, {dimension.high}]")
        if isinstance(dimension, FloatRange) and _is_integer(field.annotation):
            raise ValueError("integer hyperparameter: give an int range ({low, high, int: true}) or a list")
        values = (dimension.low, dimension.high)
    for value in values:
        try:
            adapter.validate_python(value, strict=True)
        except ValidationError as exc:
            raise ValueError(f"value {value!r} is not allowed ({first_error(exc, with_location=False)})") from None


def check_space(loss: str, model: type[BaseModel], space: SearchSpace, where: str) -> None:
    """Every dimension of ``space`` names a hyperparameter of ``model`` and fits its type and
    bounds; raise ValueError ``"<where>.<key>: ..."`` naming the loss, the key and what is allowed."""
    tunable = [k for k in model.model_fields if k != "param_lr_multiplier"]
    for key, dimension in space.items():
        if key not in tunable:
            raise ValueError(f"{where}.{key}: {loss} has no hyperparameter {key!r}; tunable: {', '.join(tunable)}")
        try:
            check_dimension(model, key, dimension)
        except ValueError as exc:
            raise ValueError(f"{where}.{key}: {exc}") from None


def grid_points(dimension: Dimension, count: int) -> list[Any]:
    """``count`` values spread over ``dimension`` (log-spaced on a log range; a Choice's values):
    the candidates of the one-at-a-time search."""
    if isinstance(dimension, Choice):
        return list(dimension.values)
    low, high = dimension.low, dimension.high
    if count == 1:
        points = [math.sqrt(low * high) if dimension.log else (low + high) / 2]
    elif dimension.log:
        step = (math.log(high) - math.log(low)) / (count - 1)
        points = [math.exp(math.log(low) + i * step) for i in range(count)]
    else:
        points = [low + i * (high - low) / (count - 1) for i in range(count)]
    if isinstance(dimension, IntRange):
        return sorted({int(round(p)) for p in points})
    return [float(f"{p:.6g}") for p in points]
