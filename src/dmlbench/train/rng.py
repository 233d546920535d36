"""Seeding from (seed, epoch) and every generator's state saved with a checkpoint (tensors and plain
values only, for ``weights_only=True``), so a resumed run repeats an uninterrupted one.
"""

from __future__ import annotations

import random
from typing import Any

import numpy as np
import torch


def epoch_seed(seed: int, epoch: int) -> int:
    """A 32-bit seed that depends only on (run seed, epoch)."""
    return int(np.random.SeedSequence([seed, epoch]).generate_state(1)[0])


def seed_everything(seed: int) -> torch.Generator:
    """Seed python, numpy, torch and PML's sampler RNG; return a generator for augmentation."""
    from pytorch_metric_learning.utils import common_functions as pml_common

    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)
    pml_common.NUMPY_RANDOM = np.random.RandomState(seed)
    return torch.Generator().manual_seed(seed)


def plain(value: Any) -> Any:
    """``value`` with numpy arrays as lists and numpy scalars as Python numbers, in nested dicts,
    lists and tuples (tuples become lists): what a numpy RNG state is made of."""
    if isinstance(value, np.ndarray):
        return value.tolist()
    if isinstance(value, np.generic):
        return value.item()
    if isinstance(value, dict):
        return {key: plain(item) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return [plain(item) for item in value]
    return value


def python_state() -> dict[str, Any]:
    """The state of Python's ``random`` module in plain values."""
    version, internal, gauss_next = random.getstate()
    return {"version": version, "internal": list(internal), "gauss_next": gauss_next}


def set_python_state(state: dict[str, Any]) -> None:
    random.setstate((state["version"], tuple(state["internal"]), state["gauss_next"]))


def rng_state(generator: torch.Generator) -> dict[str, Any]:
    """Every RNG state of the process: ByteTensors (torch, CUDA, augmentation) and plain values
    (numpy's and PML's: ``get_state(legacy=False)`` with the key as a list, which ``set_state`` takes)."""
    from pytorch_metric_learning.utils import common_functions as pml_common

    return {
        "python": python_state(),
        "numpy": plain(np.random.get_state(legacy=False)),
        "torch": torch.get_rng_state(),
        "cuda": torch.cuda.get_rng_state_all() if torch.cuda.is_available() else [],
        "pml_sampler": plain(pml_common.NUMPY_RANDOM.get_state(legacy=False)),
        "augment": generator.get_state(),
    }


def restore_rng_state(state: dict[str, Any], generator: torch.Generator) -> None:
    from pytorch_metric_learning.utils import common_functions as pml_common

    set_python_state(state["python"])
    np.random.set_state(state["numpy"])
    torch.set_rng_state(state["torch"])
    if state["cuda"] and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])
    pml_common.NUMPY_RANDOM.set_state(state["pml_sampler"])
    generator.set_state(state["augment"])
