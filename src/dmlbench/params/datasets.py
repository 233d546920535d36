"""One dataset's section of ``params.yaml`` alone, what ``download@`` and ``prepare@`` load, so their
code dependencies stop at the data registry (``validate`` checks the whole file first)."""

from __future__ import annotations

import os

from pydantic import ValidationError

from dmlbench.data import DATASETS
from dmlbench.data.base import DatasetParams
from dmlbench.errors import ConfigError
from dmlbench.messages import join_names, one_line
from dmlbench.params.files import read_params_file


def load_dataset_params(path: str | os.PathLike, name: str) -> DatasetParams:
    """``datasets.<name>`` of the params file at ``path``, validated by the dataset's own model;
    :class:`ConfigError` in one line when the dataset is not listed or a key is wrong."""
    raw = read_params_file(path)
    section = raw.get("datasets") or {}
    if name not in section:
        raise ConfigError(f"datasets: {name!r} is not in {path}; listed: {join_names(section)}")
    if name not in DATASETS:
        raise ConfigError(f"{path}: datasets.{name}: unknown dataset {name!r}; valid: {join_names(DATASETS)}")
    model = DATASETS[name].params
    try:
        return model.model_validate(section[name] or {})
    except ValidationError as exc:
        raise ConfigError(one_line(exc, str(path), prefix=f"datasets.{name}", model=model)) from None
