"""``torch.compile`` of the training step's model: the protocol's ``compile`` key (auto | on | off).

Why: a small-batch step on a fast GPU is launch-bound; ``reduce-overhead`` (:data:`CUDA_MODE`) replays
the model's forward and backward as CUDA graphs (miner, loss and evaluation stay eager). State dicts
come from the model itself, so compiled and eager runs resume each other. ``auto``: a Triton-capable
GPU (>= 7.0) for >= :data:`MIN_STEPS` steps, never the CPU. Measurements: docs/gpu.md."""

from __future__ import annotations

import importlib.util
import os
import shutil
from dataclasses import dataclass

import torch

from dmlbench.errors import ConfigError

COMPILE_SETTINGS = ("auto", "on", "off")
CUDA_MODE = "reduce-overhead"  # torch.compile mode on CUDA: Inductor kernels replayed as CUDA graphs
OTHER_MODE = "default"  # elsewhere (CUDA graphs exist only on CUDA)
MIN_STEPS = 2000  # auto: fewer planned steps than this are not worth a compilation
MIN_CAPABILITY = (7, 0)  # Triton's oldest supported GPU (Volta)
COMPILE_BACKEND = "inductor"  # tests on the CPU use "aot_eager" (graph capture without code generation)


@dataclass(frozen=True)
class CompileChoice:
    """How a training step runs its model: ``mode`` (a ``torch.compile`` mode) or eager (None),
    and why (``reason``: a phrase for the run log)."""

    mode: str | None
    reason: str

    @property
    def enabled(self) -> bool:
        return self.mode is not None

    def describe(self) -> str:
        """``on (reduce-overhead)``, ``off (protocol)``, ... : what ``run.json`` records."""
        return f"on ({self.mode})" if self.mode else f"off ({self.reason})"

    def step_begin(self) -> None:
        """Mark a new training iteration for CUDA-graph trees (outputs of the previous replay may
        be overwritten from here on)."""
        if self.mode == CUDA_MODE:
            torch.compiler.cudagraph_mark_step_begin()


EAGER = CompileChoice(None, "not requested")


def check_compile_setting(value: str) -> str:
    """``value`` if it is a valid ``compile`` setting, else a one-line :class:`ConfigError`."""
    if value not in COMPILE_SETTINGS:
        raise ConfigError(f"compile: {value!r} is not allowed; use one of {', '.join(COMPILE_SETTINGS)}")
    return value


def compile_problem(device: torch.device) -> str | None:
    """Why ``torch.compile`` cannot run the model on ``device`` here (one phrase), or None."""
    if device.type == "cuda":
        if importlib.util.find_spec("triton") is None:
            return "Triton is not installed (torch's CUDA wheels bring it)"
        capability = torch.cuda.get_device_capability(device)
        if capability < MIN_CAPABILITY:
            major, minor = capability
            return f"the GPU's compute capability {major}.{minor} is below Triton's 7.0"
        return None
    if device.type == "cpu":
        compiler = os.environ.get("CXX") or shutil.which("g++") or shutil.which("c++") or shutil.which("clang++")
        if COMPILE_BACKEND == "inductor" and not compiler:
            return "no C++ compiler (g++, c++, clang++ or $CXX) for Inductor's CPU code"
        return None
    return f"torch.compile is not supported here on {device.type}"


def choose_compile(setting: str, device: torch.device, planned_steps: int) -> CompileChoice:
    """The protocol's ``compile`` setting resolved for a run on ``device`` with ``planned_steps``
    training steps (epochs x batches per epoch; early stopping may end it sooner)."""
    check_compile_setting(setting)
    if setting == "off":
        return CompileChoice(None, "protocol")
    mode = CUDA_MODE if device.type == "cuda" else OTHER_MODE
    if setting == "on":
        problem = compile_problem(device)
        if problem:
            raise ConfigError(f"compile: on, but {problem}; set compile: auto or off")
        return CompileChoice(mode, "protocol")
    if device.type != "cuda":
        return CompileChoice(None, f"auto: {device.type}")
    problem = compile_problem(device)
    if problem:
        return CompileChoice(None, f"auto: {problem}")
    if planned_steps < MIN_STEPS:
        return CompileChoice(None, f"auto: {planned_steps} steps < {MIN_STEPS}")
    return CompileChoice(mode, "auto")


def compile_model(model: torch.nn.Module, choice: CompileChoice) -> torch.nn.Module:
    """``model`` itself (eager), or a compiled wrapper sharing its parameters, after
    ``torch._dynamo.reset()`` so earlier trainings in the process neither count against dynamo's
    recompilation limit (past it a model silently runs eager) nor keep their CUDA graphs."""
    if choice.mode is None:
        return model
    torch._dynamo.reset()
    if COMPILE_BACKEND != "inductor":  # a test backend takes no mode
        return torch.compile(model, backend=COMPILE_BACKEND, dynamic=False)
    return torch.compile(model, mode=choice.mode, dynamic=False)
