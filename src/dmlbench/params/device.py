"""When a grid needs a GPU (the protocol's ``device: cuda``): the one definition the device
pre-flight and the Slurm resources read."""

from __future__ import annotations

from typing import Literal

from dmlbench.params.model import Params

Device = Literal["cuda", "cpu", "auto"]


def grid_device(params: Params) -> Device:
    """The device the active protocol asks for (``cuda`` | ``cpu`` | ``auto``)."""
    return params.protocol.device


def needs_gpu(params: Params) -> bool:
    """True when every train, tune and embed stage of the grid needs a CUDA GPU."""
    return grid_device(params) == "cuda"
