"""Reading ``params.yaml`` (or a preset) as a mapping, with one-line errors: the first step of
every loader in :mod:`dmlbench.params`."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import yaml

from dmlbench.errors import ConfigError


def read_yaml(path: str | os.PathLike) -> Any:
    """The YAML document in ``path``; :class:`ConfigError` naming the file (and line) when it is
    missing or not valid YAML."""
    path = Path(path)
    try:
        return yaml.safe_load(path.read_text())
    except FileNotFoundError:
        raise ConfigError(f"{path}: file not found (run from the repository root)") from None
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" line {mark.line + 1}" if mark is not None else ""
        raise ConfigError(f"{path}:{where}: not valid YAML ({getattr(exc, 'problem', exc)})") from None


def read_params_file(path: str | os.PathLike) -> dict[str, Any]:
    """``params.yaml`` as a mapping of sections (:func:`read_yaml`, then its top level checked)."""
    raw = read_yaml(path)
    if not isinstance(raw, dict):
        raise ConfigError(f"{path}: expected a mapping of sections, got {type(raw).__name__}")
    return raw
