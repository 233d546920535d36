"""Where work runs (:func:`default_device`, :func:`gpu_share`), and whether this machine's GPUs can
run this torch build (:func:`cuda_facts`, :func:`cuda_problem`): the one place for both.

Compatibility rules (NVIDIA, CUDA C++ Programming Guide, "Binary Compatibility" and "PTX
Compatibility"): a cubin built for ``sm_XY`` runs on compute capability X.Z with Z >= Y (same
major; ``sm_XYa`` only on X.Y itself); PTX ``compute_XY`` is JIT-compiled by the driver for any
capability >= X.Y. A CUDA build runs on a driver of the same CUDA major release family at least
as new as NVIDIA's minimum for minor version compatibility (CUDA Compatibility guide, table
"Minimum Required Driver Version", https://docs.nvidia.com/deploy/cuda-compatibility/): 13.x
>= 580, 12.x >= 525.60.13, 11.x >= 450.80.02.
"""

from __future__ import annotations

import os
import re
import shutil
import socket
import subprocess
from collections.abc import Mapping
from dataclasses import dataclass

import torch

from dmlbench.errors import DmlbenchError
from dmlbench.gres import gres_counts, per_gpu

DEVICE_ENV = "DMLBENCH_DEVICE"
DEVICES = ("cuda", "cpu", "auto")
# CUDA major -> oldest Linux driver that runs its builds (NVIDIA's minor version compatibility)
MIN_DRIVER = {11: (450, 80, 2), 12: (525, 60, 13), 13: (580,)}
# torch 2.14's CUDA builds for Linux x86_64 and the architectures each carries (PyTorch's
# RELEASE.md support matrix, pytorch/pytorch#190355): TORCH_BACKEND values of `make setup`
TORCH_BUILDS: dict[str, tuple[str, ...]] = {
    "cu126": ("sm_50", "sm_60", "sm_70", "sm_75", "sm_80", "sm_86", "sm_90"),
    "cu130": ("sm_75", "sm_80", "sm_86", "sm_90", "sm_100", "sm_120", "compute_120"),
}
CPU_FIX = "or run on the CPU knowingly: make repro DEVICE=cpu (python -m dmlbench.pipeline --device cpu)"


class DeviceError(DmlbenchError):
    """No usable CUDA GPU where the grid needs one, or a bad device name: one line with the fix."""


def requested_device() -> str:
    """``DMLBENCH_DEVICE`` (``cuda`` | ``cpu`` | ``auto``; unset: ``auto``)."""
    value = os.environ.get(DEVICE_ENV, "auto").strip().lower() or "auto"
    if value not in DEVICES:
        raise DeviceError(f"{DEVICE_ENV}={value!r} is not a device; allowed: {', '.join(DEVICES)}")
    return value


def where() -> str:
    """Where this process runs, for a refusal: ``Slurm job 42 on node gpu07`` or ``host gpu07``."""
    job = os.environ.get("SLURM_JOB_ID")
    node = os.environ.get("SLURMD_NODENAME") or socket.gethostname()
    return f"Slurm job {job} on node {node}" if job else f"host {node}"


def default_device(device: str | torch.device | None = None) -> torch.device:
    """``device`` as given; else as :func:`requested_device` says: ``cpu``; ``cuda`` (refused in
    one line when torch cannot use a CUDA GPU here, :func:`cuda_problem`); ``auto``: CUDA when
    torch sees a GPU, else the CPU."""
    if device is not None:
        return torch.device(device)
    requested = requested_device()
    if requested == "cpu":
        return torch.device("cpu")
    if requested == "cuda":
        problem = cuda_problem(cuda_facts())
        if problem is not None:
            raise DeviceError(
                f"{where()} needs a CUDA GPU ({DEVICE_ENV}=cuda: the protocol's device, or a Slurm job that asked "
                f"for a GPU) but {problem}"
            )
        return torch.device("cuda")
    return torch.device("cuda" if torch.cuda.is_available() else "cpu")


SHARE_VARIABLE = "DMLBENCH_GPU_SHARE"  # the local executor's: how many workers share this one's GPU
SHARDS_VARIABLE = "SLURM_SHARDS_ON_NODE"  # a Slurm job's shards of the node's GPUs (--gres=shard:N)
MPS_PERCENT_VARIABLE = "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"  # set by Slurm's MPS plugin (--gres=mps:N)


def node_gres(node: str) -> dict[str, int]:
    """The generic resources ``scontrol show node`` lists for ``node`` (``Gres=gpu:h100:4(S:0-1),
    shard:h100:32``): count per name, summed over types; empty when it cannot be asked."""
    try:
        shown = subprocess.run(["scontrol", "--oneliner", "show", "node", node], capture_output=True, text=True,
                               timeout=20, check=False).stdout  # fmt: skip
    except (OSError, subprocess.TimeoutExpired):
        return {}
    match = re.search(r"(?:^|\s)Gres=(\S+)", shown)
    return gres_counts(match[1]) if match else {}


def gpu_share(environ: Mapping[str, str] | None = None) -> float:
    """How many trainings share this process's GPU, as the divisor of its free memory
    (:func:`dmlbench.train.step.cache_fits`). In a Slurm job it is read from Slurm: under MPS,
    ``100 / CUDA_MPS_ACTIVE_THREAD_PERCENTAGE`` (the job's percentage of the GPU, which Slurm
    computes from the site's MPS count per GPU; https://slurm.schedmd.com/gres.html#MPS_Management);
    with shards, the node's shards per GPU over the job's ``SLURM_SHARDS_ON_NODE``
    (https://slurm.schedmd.com/gres.html#Sharding; the node's counts from ``scontrol show node``);
    a whole GPU otherwise. Outside a job (or where the node cannot be asked): the local executor's
    ``DMLBENCH_GPU_SHARE``; 1 without it."""
    env = os.environ if environ is None else environ
    percent = env.get(MPS_PERCENT_VARIABLE, "")
    if percent.replace(".", "", 1).isdigit() and 0 < float(percent) <= 100:
        return 100.0 / float(percent)
    shards = env.get(SHARDS_VARIABLE, "")
    if env.get("SLURM_JOB_ID") and shards.isdigit() and int(shards) > 0:
        node_shards = per_gpu(node_gres(env.get("SLURMD_NODENAME") or socket.gethostname()), "shard")
        if node_shards:
            return max(1.0, node_shards / int(shards))
    elif env.get("SLURM_JOB_ID"):
        return 1.0  # a job without shards or MPS has its GPUs to itself
    value = env.get(SHARE_VARIABLE, "1")
    return float(value) if value.isdigit() and int(value) > 0 else 1.0


@dataclass(frozen=True)
class Gpu:
    name: str
    capability: tuple[int, int]


@dataclass(frozen=True)
class CudaFacts:
    """What torch and the driver report: ``build`` is ``torch.version.cuda`` (None: CPU-only
    build); ``gpus`` come from torch, or from ``nvidia-smi`` when torch cannot use CUDA;
    ``driver`` from ``nvidia-smi`` (None without it)."""

    torch_version: str
    build: str | None
    available: bool
    arch_list: tuple[str, ...]
    gpus: tuple[Gpu, ...]
    driver: str | None


def nvidia_smi() -> tuple[str | None, tuple[Gpu, ...]]:
    """The driver version and the GPUs as ``nvidia-smi`` lists them; ``(None, ())`` without it."""
    if shutil.which("nvidia-smi") is None:
        return None, ()
    query = ["nvidia-smi", "--query-gpu=driver_version,name,compute_cap", "--format=csv,noheader"]
    try:
        result = subprocess.run(query, capture_output=True, text=True, timeout=20, check=False)
    except (OSError, subprocess.TimeoutExpired):
        return None, ()
    if result.returncode != 0:
        return None, ()
    driver, gpus = None, []
    for line in result.stdout.strip().splitlines():
        fields = [field.strip() for field in line.split(",")]
        if len(fields) != 3:
            continue
        driver = fields[0]
        major, _, minor = fields[2].partition(".")
        if major.isdigit() and minor.isdigit():
            gpus.append(Gpu(fields[1], (int(major), int(minor))))
    return driver, tuple(gpus)


def cuda_facts() -> CudaFacts:
    """The one device query (faked in tests): torch's build, arch list and GPUs, and the driver.
    ``nvidia-smi`` is asked only when something is wrong (no CUDA for torch, or a GPU its build has
    no code for): where CUDA works, the driver is new enough for the build by definition."""
    available = torch.cuda.is_available()
    driver: str | None = None
    gpus: tuple[Gpu, ...] = ()
    arch_list: tuple[str, ...] = ()
    if available:
        arch_list = tuple(torch.cuda.get_arch_list())
        count = torch.cuda.device_count()
        gpus = tuple(Gpu(torch.cuda.get_device_name(i), torch.cuda.get_device_capability(i)) for i in range(count))
    if not available or not all(runs_on(gpu.capability, arch_list) for gpu in gpus):
        driver, smi_gpus = nvidia_smi()
        gpus = gpus or smi_gpus
    return CudaFacts(torch.__version__, torch.version.cuda, available, arch_list, gpus, driver)


def version_tuple(version: str) -> tuple[int, ...]:
    """``"575.57.08"`` -> ``(575, 57, 8)`` (non-numeric parts dropped)."""
    return tuple(int(part) for part in re.findall(r"\d+", version))


def runs_on(capability: tuple[int, int], arch_list: tuple[str, ...]) -> bool:
    """Whether a build with ``arch_list`` (``torch.cuda.get_arch_list()``) has code for a GPU of
    ``capability``: a cubin of the same major and an equal or lower minor, or PTX to JIT."""
    for arch in arch_list:
        match = re.fullmatch(r"(sm|compute)_(\d+)(\d)([af]?)", arch)
        if not match:
            continue
        kind, built, suffix = match[1], (int(match[2]), int(match[3])), match[4]
        if kind == "compute" and built <= capability:
            return True
        same_major = built[0] == capability[0]
        if kind == "sm" and same_major and (built[1] == capability[1] if suffix == "a" else built[1] <= capability[1]):
            return True
    return False


def build_for(capability: tuple[int, int]) -> str | None:
    """The first torch 2.14 CUDA build (:data:`TORCH_BUILDS`) with code for ``capability``."""
    return next((name for name, archs in TORCH_BUILDS.items() if runs_on(capability, archs)), None)


def fix_for(capability: tuple[int, int] | None) -> str:
    build = build_for(capability) if capability else None
    if capability and build:
        return f"install the build that has it: make setup TORCH_BACKEND={build} (docs/gpu.md), {CPU_FIX}"
    if capability:
        return f"no torch 2.14 build carries compute capability {capability[0]}.{capability[1]}; {CPU_FIX}"
    return f"docs/gpu.md says which build (make setup TORCH_BACKEND=...) fits which GPU and driver; {CPU_FIX}"


def driver_problem(facts: CudaFacts) -> str | None:
    """The driver is older than NVIDIA's minimum for the build's CUDA major: one line, or None."""
    if not (facts.driver and facts.build):
        return None
    major = version_tuple(facts.build)[0]
    needed = MIN_DRIVER.get(major)
    if needed is None or version_tuple(facts.driver) >= needed:
        return None
    older = [name for name in TORCH_BUILDS if MIN_DRIVER[int(name[2:4])] <= version_tuple(facts.driver)]
    switch = f"make setup TORCH_BACKEND={older[0]}, " if older else ""
    return (
        f"NVIDIA driver {facts.driver} is older than the {'.'.join(map(str, needed))} that torch "
        f"{facts.torch_version}'s CUDA {facts.build} build needs (NVIDIA's CUDA compatibility table); update the "
        f"driver, or {switch}{CPU_FIX}"
    )


def cuda_problem(facts: CudaFacts) -> str | None:
    """Why these GPUs cannot run this torch build (one line: the mismatch and the fix), or None."""
    if facts.build is None:
        return f"torch {facts.torch_version} is a CPU-only build (no CUDA); {fix_for(None)}"
    if problem := driver_problem(facts):
        return problem
    if not facts.available:
        seen = f" (nvidia-smi: driver {facts.driver}, {len(facts.gpus)} GPU(s))" if facts.driver else ""
        visible = os.environ.get("CUDA_VISIBLE_DEVICES")
        hidden = f" with CUDA_VISIBLE_DEVICES={visible!r}" if visible is not None else ""
        first = facts.gpus[0].capability if facts.gpus else None
        return (
            f"torch {facts.torch_version} (CUDA {facts.build} build) sees no CUDA GPU{hidden}{seen}; {fix_for(first)}"
        )
    unfit = [(i, gpu) for i, gpu in enumerate(facts.gpus) if not runs_on(gpu.capability, facts.arch_list)]
    if not unfit:
        return None
    named = "; ".join(
        f"GPU {i} ({gpu.name}) has compute capability {'.'.join(map(str, gpu.capability))}" for i, gpu in unfit
    )
    archs = ", ".join(facts.arch_list) or "empty"
    return (
        f"{named}, which torch {facts.torch_version}'s CUDA {facts.build} build has no code for (its arch list: "
        f"{archs}; driver {facts.driver or 'unknown'}); {fix_for(unfit[0][1].capability)}"
    )
