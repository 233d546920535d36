"""Loading checkpoints and model files safely: tensors and plain values only, never code.

Checkpoints and models come from shared filesystems and DVC caches that others write to: they
are data, never code, read with ``torch.load(..., weights_only=True)``, which refuses any other
pickled object instead of running it (https://pytorch.org/docs/stable/generated/torch.load.html,
https://pytorch.org/docs/stable/notes/serialization.html#weights-only). A leaf shared by
training (resumable checkpoints) and evaluation (trained models).
"""

from __future__ import annotations

import pickle
import re
from pathlib import Path
from typing import Any

import torch

from dmlbench.errors import DataError

UNPICKLER_GLOBAL = re.compile(r"GLOBAL (\S+)")  # in torch.load's weights-only error message


class UnsafeFile(DataError):
    """A checkpoint or model file holds more than tensors and plain values (refused, never run)."""


def load_plain(path: Path, remedy: str) -> Any:
    """``path`` read with ``torch.load(weights_only=True)`` onto the CPU; :class:`UnsafeFile`
    (naming the file, what it holds and ``remedy``) for any other pickled object, which is never run."""
    try:
        return torch.load(path, map_location="cpu", weights_only=True)
    except pickle.UnpicklingError as exc:
        raise UnsafeFile(
            f"{path}: holds something other than tensors and plain values ({unsafe_content(path, exc)}); "
            f"refused, as loading it could run code; {remedy}"
        ) from None


def unsafe_content(path: Path, error: Exception) -> str:
    """What makes ``path`` fail a weights-only load: the globals it imports, as far as known."""
    try:
        names = torch.serialization.get_unsafe_globals_in_checkpoint(path)
    except Exception:  # noqa: BLE001 - not a torch.save zip file: the unpickler names the first one
        names = UNPICKLER_GLOBAL.findall(str(error))[:1]
    return ", ".join(names) or "not a file of tensors"
