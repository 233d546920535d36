"""The runner's device pre-flight, beside :func:`dmlbench.pipeline.preflight.preflight`.

When the grid needs a GPU (:func:`dmlbench.params.device.needs_gpu`) or ``--gpus`` names some,
torch must be able to use one here (:func:`dmlbench.devices.cuda_problem`): else one line naming
the mismatch and the fix, listed with the other pre-flight problems before any stage. On Slurm the
probe job and each GPU job check it on the node instead. :func:`export_device` hands the run's
device to every stage process as ``DMLBENCH_DEVICE``.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path

from dmlbench import devices
from dmlbench.errors import DmlbenchError
from dmlbench.params.device import grid_device, needs_gpu
from dmlbench.params.model import Params
from dmlbench.pipeline.preflight import preflight as input_preflight


def run_device(params: Params, device: str | None = None) -> str:
    """The device this run uses: ``--device`` (``make repro DEVICE=...``) if given, else the
    protocol's ``device`` key (``cuda`` | ``cpu`` | ``auto``)."""
    return device or grid_device(params)


def device_problem(params: Params, gpus: Sequence[str] = (), device: str | None = None) -> str | None:
    """One line when the run needs a CUDA GPU (device ``cuda``, or ``--gpus`` given) and this
    machine's torch build, driver and GPUs cannot give it one (:func:`dmlbench.devices.cuda_problem`,
    the query :func:`dmlbench.devices.cuda_facts`); None when they can, or when the run is on the
    CPU (``device: cpu`` or the ``--device cpu`` override: the CPU knowingly, never checked)."""
    chosen = run_device(params, device)
    if chosen == "cpu" or (chosen == "auto" and not gpus):
        return None
    problem = devices.cuda_problem(devices.cuda_facts())
    if problem is None:
        return None
    if device == "cuda":
        why = "--device cuda"
    elif device is None and needs_gpu(params):
        why = f"protocol {params.protocol_name!r} needs a CUDA GPU (device: cuda)"
    else:
        why = f"--gpus {','.join(gpus)} asks for CUDA GPUs"
    return f"{why}, but {problem}"


def export_device(params: Params, device: str | None = None, local: bool = True) -> str:
    """Set ``DMLBENCH_DEVICE`` to the run's device (:func:`run_device`) in this process's
    environment, which every stage process inherits (the local workers through
    :func:`dmlbench.launch.worker_environment`, Slurm jobs through ``sbatch``'s default
    ``--export=ALL``), so that :func:`dmlbench.devices.default_device` follows it. Left unset for
    ``auto`` (its meaning), and for ``cuda`` with the Slurm executor (``local`` False): there the
    cluster resources decide which jobs get a GPU (an ``evaluate@`` job gets none), and each job
    that asked for one sets ``cuda`` itself (:func:`dmlbench.launch.job_script`)."""
    chosen = run_device(params, device)
    if chosen == "auto" or (chosen == "cuda" and not local):
        os.environ.pop(devices.DEVICE_ENV, None)
    else:
        os.environ[devices.DEVICE_ENV] = chosen
    return chosen


def preflight(
    params: Params, dropbox: Path, gpus: Sequence[str] = (), device: str | None = None, check_device: bool = True
) -> None:
    """The runner's pre-flight: the inputs' (:func:`dmlbench.pipeline.preflight.preflight`) and the
    device check (:func:`device_problem`), every problem at once (one line each), before any
    stage. ``gpus``/``device``: the runner's ``--gpus`` and ``--device``;
    ``check_device``: False where the stages run elsewhere (the Slurm executor) or none runs
    (``--fetch-only``)."""
    problems = []
    try:
        input_preflight(params, dropbox)
    except DmlbenchError as exc:
        problems.append(str(exc))
    if check_device and (problem := device_problem(params, gpus, device)):
        problems.append(problem)
    if problems:
        raise DmlbenchError("\n".join(problems))
