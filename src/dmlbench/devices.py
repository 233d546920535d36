"""Where work runs when no device is named: the one rule every stage and library call shares."""

from __future__ import annotations

import torch


def default_device(device: str | torch.device | None = None) -> torch.device:
    """``device`` as given; else CUDA when torch sees a GPU, else the CPU."""
    if device is not None:
        return torch.device(device)
    return torch.device("cuda" if torch.cuda.is_available() else "cpu")
