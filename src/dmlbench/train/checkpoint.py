"""Resumable per-epoch checkpoints (``last.pt``, written atomically after every epoch).

A checkpoint is only resumed when its config hash and code fingerprint match the current
run: a run restarted after a code change starts over instead of mixing two versions.
"""

from __future__ import annotations

import hashlib
from functools import lru_cache
from pathlib import Path
from typing import Any

import torch

from dmlbench.io import atomic_path

LAST = "last.pt"


@lru_cache(maxsize=1)
def code_fingerprint() -> str:
    """Hash of every ``.py`` file of the dmlbench package (what training results depend on)."""
    package = Path(__file__).resolve().parents[1]
    digest = hashlib.sha256()
    for path in sorted(package.rglob("*.py")):
        digest.update(path.relative_to(package).as_posix().encode())
        digest.update(path.read_bytes())
    return digest.hexdigest()[:16]


def save_checkpoint(directory: Path, state: dict[str, Any]) -> None:
    with atomic_path(directory / LAST) as tmp:
        torch.save(state, tmp)


def load_checkpoint(directory: Path, config_hash: str) -> dict[str, Any] | None:
    """The saved state if it belongs to this exact config and code, else None."""
    path = directory / LAST
    if not path.exists():
        return None
    state = torch.load(path, map_location="cpu", weights_only=False)
    if state.get("config_hash") != config_hash or state.get("code") != code_fingerprint():
        return None
    return state


def clear_checkpoint(directory: Path) -> None:
    (directory / LAST).unlink(missing_ok=True)
