"""The whole ``params.yaml`` checked: the sections every stage reads plus ``tuning:`` and
``cluster:`` (what the ``validate`` stage, the runners and presets ask before anything runs)."""

from __future__ import annotations

import os
from typing import Any

from dmlbench.params.cluster import cluster_settings
from dmlbench.params.load import load_params, parse_params
from dmlbench.params.model import PARAMS_FILE, Params
from dmlbench.params.tuning import tuning_settings


def complete_params(params: Params, source: str = PARAMS_FILE) -> Params:
    """``params`` once its ``tuning:`` and ``cluster:`` sections validate (one-line ConfigError)."""
    tuning_settings(params, source)
    cluster_settings(params, source)
    return params


def load_complete(path: str | os.PathLike = PARAMS_FILE) -> Params:
    """:func:`dmlbench.params.load.load_params` plus every other section of the file."""
    return complete_params(load_params(path), str(path))


def parse_complete(raw: Any, source: str = PARAMS_FILE) -> Params:
    """:func:`dmlbench.params.load.parse_params` of an already-read mapping, plus every other section."""
    return complete_params(parse_params(raw, source), source)
