"""One-line messages for invalid ``params.yaml`` values (pydantic's first error, the allowed keys)."""

from __future__ import annotations

import typing
from typing import Any

from pydantic import BaseModel, ValidationError


def one_line(exc: ValidationError, source: str, prefix: str, model: type[BaseModel]) -> str:
    """Turn pydantic's first error into ``source: dotted.key: what is wrong (got X)``."""
    err = exc.errors(include_url=False)[0]
    loc = [str(part) for part in err["loc"]]
    if loc and loc[-1] in {"[key]"}:
        loc = loc[:-1]
    key = ".".join(part for part in [prefix, *loc] if part)
    if err["type"] == "extra_forbidden":
        allowed = allowed_keys(model, loc[:-1])
        message = f"unknown key; allowed: {join_names(allowed)}" if allowed else "unknown key"
    elif err["type"] == "missing":
        message = "required key is missing"
    else:
        message = err["msg"].replace("Value error, ", "")
    if err["type"] not in {"missing", "extra_forbidden"} and "input" in err and not isinstance(err["input"], dict):
        message += f" (got {err['input']!r})"
    where = f"{key}: " if key else ""
    return f"{source}: {where}{message}"


def first_error(exc: ValidationError, with_location: bool = True) -> str:
    """Pydantic's first error as ``dotted.key: what is wrong`` (``what is wrong`` alone without
    ``with_location`` or when it has none), for values checked inside a model's own validator."""
    err = exc.errors(include_url=False)[0]
    key = ".".join(str(part) for part in err["loc"])
    message = err["msg"].replace("Value error, ", "")
    return f"{key}: {message}" if key and with_location else message


def allowed_keys(model: type[BaseModel], loc: list[str]) -> list[str]:
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


def join_names(values: Any) -> str:
    return ", ".join(str(v) for v in sorted(values, key=str))
