"""Published benchmark setups as presets: ``presets/<name>.yaml`` beside ``params.yaml``.

A preset replaces the grid and ``protocol`` (one of params.yaml's), may merge other sections over
params.yaml's, and runs in a workspace of its own (``make repro PRESET=<name>``). docs/presets.md.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from dmlbench.errors import ConfigError
from dmlbench.messages import join_names
from dmlbench.params.complete import complete_params
from dmlbench.params.files import read_yaml
from dmlbench.params.load import parse_params
from dmlbench.params.model import Params
from dmlbench.params.protocol import deep_merge

PRESETS_DIR = "presets"  # beside params.yaml
GRID_SECTIONS = ("datasets", "backbones", "losses", "dims", "seeds", "protocol")  # required, replace params.yaml's
SETTINGS_SECTIONS = ("evaluate", "report", "tracking", "tuning", "cluster")  # optional, merged over params.yaml's
NAME_PATTERN = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]*$")


@dataclass(frozen=True)
class Preset:
    """A validated preset: its file, the composed params mapping (what the workspace's
    params.yaml holds) and the validated :class:`Params`."""

    name: str
    path: Path
    description: str
    raw: dict[str, Any]
    params: Params


def presets_dir(params_file: str | Path) -> Path:
    """``presets/`` beside ``params_file``."""
    return Path(params_file).parent / PRESETS_DIR


def available(directory: str | Path) -> list[str]:
    """The preset names in ``directory`` (its ``*.yaml`` files), sorted."""
    return sorted(p.stem for p in Path(directory).glob("*.yaml") if NAME_PATTERN.match(p.stem))


def compose(name: str, preset: Any, base: Any, source: str) -> dict[str, Any]:
    """params.yaml (``base``) with the preset's sections: grid sections replaced, settings merged."""
    if not isinstance(preset, dict):
        raise ConfigError(f"{source}: expected a mapping of params.yaml sections, got {type(preset).__name__}")
    if not isinstance(base, dict):
        raise ConfigError(f"{source}: the params.yaml it builds on is not a mapping of sections")
    allowed = ("description", *GRID_SECTIONS, *SETTINGS_SECTIONS)
    if "protocols" in preset:
        raise ConfigError(
            f"{source}: protocols: a preset names one of params.yaml's protocols (protocol: <name>) and cannot "
            f"define its own; valid protocols: {join_names(base.get('protocols') or {})}"
        )
    unknown = [key for key in preset if key not in allowed]
    if unknown:
        raise ConfigError(f"{source}: {unknown[0]}: not a preset section; allowed: {join_names(allowed)}")
    missing = [key for key in GRID_SECTIONS if key not in preset]
    if missing:
        raise ConfigError(
            f"{source}: {missing[0]}: required key is missing (a preset names its whole grid: "
            f"{', '.join(GRID_SECTIONS)})"
        )
    raw = {key: value for key, value in base.items()}
    raw.update({key: preset[key] for key in GRID_SECTIONS})
    raw["tracking"] = deep_merge(dict(base.get("tracking") or {}), {"experiment": name})
    for key in SETTINGS_SECTIONS:
        if key in preset:
            if not isinstance(preset[key], dict):
                raise ConfigError(f"{source}: {key}: expected a mapping, got {type(preset[key]).__name__}")
            raw[key] = deep_merge(dict(raw.get(key) or {}), preset[key])
    return raw


def load_preset(name: str, params_file: str | Path = "params.yaml") -> Preset:
    """Read ``presets/<name>.yaml`` over ``params_file`` and validate the result like params.yaml; an
    unknown name or a bad key fails in one line."""
    directory = presets_dir(params_file)
    names = available(directory)
    if name not in names:
        listed = join_names(names) if names else f"none (no *.yaml in {directory}/)"
        raise ConfigError(f"preset {name!r} is unknown; available presets: {listed}")
    path = directory / f"{name}.yaml"
    preset = read_yaml(path)
    try:
        base = read_yaml(Path(params_file))
    except FileNotFoundError:
        raise ConfigError(f"{params_file}: file not found (run from the repository root)") from None
    raw = compose(name, preset, base, str(path))
    description = str(preset.get("description") or "")
    return Preset(name, path, description, raw, complete_params(parse_params(raw, source=str(path)), str(path)))


def listing(params_file: str | Path = "params.yaml") -> str:
    """One line per preset: its name and description (``--list-presets``)."""
    directory = presets_dir(params_file)
    lines = []
    for name in available(directory):
        preset = read_yaml(directory / f"{name}.yaml")
        description = preset.get("description", "") if isinstance(preset, dict) else ""
        lines.append(f"{name:16s} {description}")
    return "\n".join(lines) if lines else f"no presets in {directory}/"


def params_text(preset: Preset) -> str:
    """The workspace's params.yaml: the composed mapping, with a header saying where it comes from."""
    header = (
        f"# Written by `python -m dmlbench.pipeline --preset {preset.name}` from {PRESETS_DIR}/{preset.name}.yaml\n"
        "# over the main checkout's params.yaml (its protocols, evaluate and report settings).\n"
        "# Edit those files, not this one: the next run of the preset rewrites it.\n"
    )
    raw = {key: value for key, value in preset.raw.items()}
    return header + yaml.safe_dump(raw, sort_keys=False)
