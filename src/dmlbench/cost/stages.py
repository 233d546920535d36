"""The stages of a grid, exactly as DVC expands ``dvc.yaml``'s ``foreach``/``matrix`` entries over
its params (``dvc.parsing.DataResolver``, as ``dvc stage list`` does): no count of our own.
A preset is counted from its composed params in a scratch folder, without creating its workspace.
"""

from __future__ import annotations

import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

PIPELINE_FILE = "dvc.yaml"


@dataclass(frozen=True)
class PlannedStage:
    """One stage DVC generates: its name, its ``dvc.yaml`` entry (the kind) and its matrix item."""

    name: str
    kind: str
    item: dict[str, Any]


def expand_stages(root: Path, params_text: str | None = None) -> list[PlannedStage]:
    """Every stage of ``root``'s ``dvc.yaml`` over its params (or a preset's ``params_text``), in order."""
    from dmlbench import dvc_adapter as dvc

    definition = yaml.safe_load((root / PIPELINE_FILE).read_text())
    with tempfile.TemporaryDirectory(prefix="dmlbench-plan-") as scratch, dvc.open_repo(root) as repo:
        wdir = str(root.resolve())
        if params_text is not None:
            Path(scratch, "params.yaml").write_text(params_text)
            wdir = scratch
        stages: list[PlannedStage] = []
        for kind, definition_kind, entry in dvc.stage_definitions(repo, wdir, definition):
            if definition_kind == "matrix":
                stages += [
                    PlannedStage(f"{kind}@{key}", kind, {k: _plain(v) for k, v in item.items()})
                    for key, item in entry.normalized_iterable.items()
                ]
            elif definition_kind == "foreach":
                iterable = entry.normalized_iterable
                keys = iterable if not isinstance(iterable, dict) else list(iterable)
                stages += [PlannedStage(f"{kind}@{key}", kind, {"key": _plain(key)}) for key in keys]
            else:
                stages.append(PlannedStage(kind, kind, {}))
    return stages


def _plain(value: Any) -> Any:
    """A matrix value as Python (DVC wraps them in its context's ``Value`` nodes)."""
    return getattr(value, "value", value)
