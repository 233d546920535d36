"""The base of every params model (a leaf module: the registries' parameter models and the
params schema in ``params/`` both build on it)."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict


class StrictModel(BaseModel):
    """Base for every params section: unknown keys are errors, values are immutable."""

    model_config = ConfigDict(extra="forbid", frozen=True)
