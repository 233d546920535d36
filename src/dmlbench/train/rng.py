"""Seeding and the RNG state of a training run: randomness derived from (seed, epoch), and every
generator's state saved with a checkpoint so that a resumed run repeats an uninterrupted one."""

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


def rng_state(generator: torch.Generator) -> dict[str, Any]:
    from pytorch_metric_learning.utils import common_functions as pml_common

    return {
        "python": random.getstate(),
        "numpy": np.random.get_state(),
        "torch": torch.get_rng_state(),
        "cuda": torch.cuda.get_rng_state_all() if torch.cuda.is_available() else [],
        "pml_sampler": pml_common.NUMPY_RANDOM.get_state(),
        "augment": generator.get_state(),
    }


def restore_rng_state(state: dict[str, Any], generator: torch.Generator) -> None:
    from pytorch_metric_learning.utils import common_functions as pml_common

    random.setstate(state["python"])
    np.random.set_state(state["numpy"])
    torch.set_rng_state(state["torch"])
    if state["cuda"] and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])
    pml_common.NUMPY_RANDOM.set_state(state["pml_sampler"])
    generator.set_state(state["augment"])
