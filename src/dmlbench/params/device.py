"""When a grid needs a GPU: the one definition the device pre-flight and the Slurm resources read.

The active protocol's ``device`` key (:class:`dmlbench.params.protocol.Protocol`): ``cuda`` for the
real-data protocols (a ResNet50 run on a CPU takes weeks), ``auto`` for the offline demo.
"""

from __future__ import annotations

from typing import Literal

from dmlbench.params.model import Params

Device = Literal["cuda", "cpu", "auto"]


def grid_device(params: Params) -> Device:
    """The device the active protocol asks for (``cuda`` | ``cpu`` | ``auto``)."""
    return params.protocol.device


def needs_gpu(params: Params) -> bool:
    """True when the grid's protocol says ``device: cuda``: every train, tune and embed stage of it
    needs a CUDA GPU."""
    return grid_device(params) == "cuda"
