"""``torch.compile`` of the training step's model: the protocol's ``compile`` key (auto | on | off).

A small-batch training step on a fast GPU is bound by the host launching kernels one by one, not
by the GPU running them (docs/gpu.md: the Reality Check's BN-Inception at batch 32 uses ~1 % of an
H100's matrix rate). Compiling the model fuses its elementwise work (BatchNorm, ReLU, the bf16
casts) into fewer Inductor kernels, and mode ``reduce-overhead`` (:data:`CUDA_MODE`) replays each
compiled forward and backward as one CUDA graph, which removes the per-kernel launch cost.

What is compiled: the embedding model's forward as the training step calls it (and, through
AOTAutograd, its backward). Not the miner and loss (PML's miners return index tuples whose sizes
depend on the batch), not the optimiser, not the embedding of validation/test splits (another
batch size, eval mode: it stays eager, so no graph is recorded for it). Training batches are
always full (:func:`dmlbench.train.sampling.epoch_batches`), so the shapes are static
(``dynamic=False``); the warm-up epochs' frozen trunk is one recompilation.

Checkpoints: the compiled wrapper shares the model's parameters and buffers, and every state dict
is taken from the model itself, so no key carries the wrapper's ``_orig_mod.`` prefix; a run
compiled or not resumes from the other's checkpoint. ``compile`` is not part of a run's identity
(its config hash): like the device's kernel choice it changes how the step is computed, not what.

``auto`` compiles on a CUDA GPU that Triton supports (compute capability >= 7.0) when the run plans
at least :data:`MIN_STEPS` training steps (compiling takes about a minute; fewer steps would not
repay it), and never on the CPU, whose results stay bitwise what they were. ``on`` compiles on
any device (on the CPU Inductor needs a C++ compiler) and refuses in one line where it cannot;
``off`` never compiles.
"""

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
    """``model`` itself (eager), or a compiled wrapper of it that shares its parameters.

    Compiling starts from a clean slate (``torch._dynamo.reset()``): one compiled model per
    process at a time, so that the models of earlier trainings in the process (tuning trials, a
    benchmark's settings) neither count against dynamo's recompilation limit (past it, a model
    silently runs eager) nor keep their CUDA graphs' memory."""
    if choice.mode is None:
        return model
    torch._dynamo.reset()
    if COMPILE_BACKEND != "inductor":  # a test backend takes no mode
        return torch.compile(model, backend=COMPILE_BACKEND, dynamic=False)
    return torch.compile(model, mode=choice.mode, dynamic=False)
