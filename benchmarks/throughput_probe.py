"""Training throughput probes for ``gpu_check.py``, ``train_throughput.py`` and ``gpu_packing.py``:
images/s of the full training step next to the model alone, and the model FLOP utilisation.

* ``full step``: what the training loop does per batch: gather a batch from the uint8 image
  cache (on the device when it fits), batched RandomResizedCrop + flip there, forward (bf16
  autocast and channels_last on CUDA), miner + loss, backward, optimiser steps;
* ``model only``: the same step on a synthetic batch already on the device at the crop size
  (no sampling, no augmentation). ``full / model only`` shows whether data handling limits
  training (target on a GPU: >= 0.6).

``compile_mode``: the step's model compiled with ``torch.compile`` in that mode
(:mod:`dmlbench.train.compiling`; None = eager), so that one process measures a setting eager
and compiled on the same device; ``first_step_seconds`` is the first step's wall time, which
holds the compilation.

Model FLOP utilisation (MFU) = images/s x training FLOPs per image / peak FLOP/s, with the
training FLOPs = 3 x the forward FLOPs (backward ~ 2 x forward: Kaplan et al. 2020, sec. 2.1)
counted by :func:`dmlbench.cost.rates.forward_flops_per_image` (convolutions and matrix products; one
multiply-add = 2 FLOPs) and the peak = a measured dense matrix product on the same device in the
training dtype (:func:`matmul_peak_flops`: bf16 on a GPU), so MFU is relative to what the device
reaches in practice, not to its datasheet.
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass

import numpy as np
import torch

from dmlbench.cost.rates import forward_flops_per_image
from dmlbench.data.augment import train_transform
from dmlbench.losses import LOSSES
from dmlbench.models import BACKBONES, build_model
from dmlbench.train.compiling import EAGER, CompileChoice
from dmlbench.train.sampling import epoch_batches
from dmlbench.train.step import FastPath, ImageSource, TrainStep


@dataclass(frozen=True)
class ThroughputSetting:
    """One measured configuration (a protocol's model, crop and batch)."""

    name: str
    backbone: str
    crop: int
    batch: int
    per_class: int
    dim: int
    image_size: int = 256
    crop_scale: tuple[float, float] = (0.08, 1.0)
    loss: str = "multi_similarity"
    frozen_bn: bool = True
    grad_clip: float | None = None


def add_setting_arguments(parser: argparse.ArgumentParser, backbone: str, dim: int, image_size: int, crop: int) -> None:
    """The options of one measured setting (``benchmarks/train_throughput.py``, ``gpu_packing.py``)."""
    parser.add_argument("--backbone", default=backbone)
    parser.add_argument("--loss", default="multi_similarity")
    parser.add_argument("--dim", type=int, default=dim)
    parser.add_argument("--image-size", type=int, default=image_size, help="side of the cached uint8 images")
    parser.add_argument("--crop", type=int, default=crop, help="training crop size")
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--per-class", type=int, default=4)
    parser.add_argument("--grad-clip", type=float, default=None, help="gradient value clipping (thesis: 10)")
    parser.add_argument("--images", type=int, default=2000, help="size of a training's synthetic image cache")
    parser.add_argument("--classes", type=int, default=100)


def setting_from_arguments(args: argparse.Namespace, name: str = "cli") -> ThroughputSetting:
    """The setting :func:`add_setting_arguments`' options describe."""
    return ThroughputSetting(
        name, args.backbone, args.crop, args.batch, args.per_class, args.dim, args.image_size,
        loss=args.loss, grad_clip=args.grad_clip,
    )  # fmt: skip


@dataclass(frozen=True)
class Throughput:
    setting: ThroughputSetting
    device: str
    placement: str
    full_images_per_s: float
    model_only_images_per_s: float
    train_flops_per_image: float
    peak_flops: float | None
    peak_memory_mib: float | None
    compile_mode: str | None = None  # torch.compile mode of the step's model; None = eager
    first_step_seconds: float | None = None  # the first full step (with compile: the compilation)
    compiled_graphs: int | None = None  # graphs torch.compile made (a recompilation adds one)
    graph_breaks: int | None = None  # where dynamo split the model (0: one graph for the forward)
    cudagraph_skips: int | None = None  # compiled graphs that reduce-overhead ran without a CUDA graph
    precision: str | None = None  # the step's arithmetic (FastPath.precision: bf16, fp16, fp32, ...)

    @property
    def ratio(self) -> float:
        """Full step rate / model-only rate."""
        return self.full_images_per_s / self.model_only_images_per_s

    @property
    def mfu(self) -> float | None:
        """Model FLOP utilisation of the full step (None without a measured peak)."""
        if not self.peak_flops:
            return None
        return self.full_images_per_s * self.train_flops_per_image / self.peak_flops

    def as_dict(self) -> dict:
        return {
            **asdict(self),
            "setting": asdict(self.setting),
            "ratio": self.ratio,
            "mfu": self.mfu,
        }


def matmul_peak_flops(device: torch.device, size: int | None = None, repeats: int = 10) -> float:
    """Measured dense matrix-product FLOP/s on ``device`` in the dtype training computes in
    there (bf16 on a GPU: 8192^3 products; fp32 on a CPU: 1024^3), after warm-up."""
    size = size or (8192 if device.type == "cuda" else 1024)
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    a = torch.randn(size, size, device=device, dtype=dtype)
    b = torch.randn(size, size, device=device, dtype=dtype)
    for _ in range(3):
        a @ b
    _synchronize(device)
    start = time.perf_counter()
    for _ in range(repeats):
        a @ b
    _synchronize(device)
    return 2 * size**3 * repeats / (time.perf_counter() - start)


def _synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _timed(step: Callable[[], torch.Tensor], steps: int, warmup: int, device: torch.device) -> float:
    """Seconds for ``steps`` calls after ``warmup`` calls (the device drained at both ends)."""
    for _ in range(warmup):
        step()
    _synchronize(device)
    start = time.perf_counter()
    for _ in range(steps):
        loss = step()
    float(loss)  # waits for the device
    return time.perf_counter() - start


@dataclass(frozen=True)
class BenchmarkSteps:
    """One training's steps for a benchmark: ``full`` (cache -> augmentation -> training step)
    and ``model_only`` (the same step on a synthetic on-device batch); each call returns the loss."""

    full: Callable[[], torch.Tensor]
    model_only: Callable[[], torch.Tensor]
    placement: str
    train_flops_per_image: float
    precision: str = "fp32"  # the step's arithmetic (FastPath.precision)


def benchmark_steps(
    setting: ThroughputSetting,
    device: torch.device,
    iterations: int,
    images: int = 2000,
    classes: int = 100,
    fast_path: bool | None = None,
    compile_mode: str | None = None,
) -> BenchmarkSteps:
    """The steps :func:`measure_throughput` times for ``setting`` (random-init weights, random
    uint8 images of ``setting.image_size`` px; ``images`` x ``classes`` cache; ``iterations``
    distinct batches, then they repeat); ``compile_mode``: the model runs compiled (None: eager)."""
    if setting.batch % setting.per_class:
        raise ValueError(f"batch {setting.batch} is not a multiple of {setting.per_class} images per class")
    fast = FastPath.for_device(device, fast_path)
    compiled = EAGER if compile_mode is None else CompileChoice(compile_mode, "benchmark")
    torch.manual_seed(0)
    model = build_model(
        setting.backbone, BACKBONES[setting.backbone].params(), setting.dim, frozen_bn=setting.frozen_bn
    )
    model = fast.prepare_model(model)
    flops = 3 * forward_flops_per_image(model, setting.crop, device)
    loss_spec = LOSSES[setting.loss]
    loss_params = loss_spec.params()
    loss_fn = loss_spec.build(loss_params, classes, setting.dim).to(device)
    optimizers = [torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-5)]
    if loss_spec.has_parameters:
        optimizers.append(torch.optim.AdamW(loss_fn.parameters(), lr=1e-3))
    step = TrainStep(
        model.train(), loss_fn, loss_spec.miner(loss_params), optimizers, fast, setting.grad_clip, compiled=compiled
    )

    rng = np.random.default_rng(0)
    side = setting.image_size
    cache = rng.integers(0, 256, (images, side, side, 3), dtype=np.uint8)
    labels = np.arange(images) % classes
    np.random.seed(0)
    batches = epoch_batches(labels, setting.batch, setting.per_class, iterations=iterations)
    source = ImageSource(cache, device)
    targets = torch.from_numpy(labels).to(device)
    generator = torch.Generator().manual_seed(0)
    counter = iter(range(10**12))

    def full_step() -> torch.Tensor:
        batch = batches[next(counter) % len(batches)]
        inputs = train_transform(source.batch(batch), setting.crop, setting.crop_scale, (0.75, 1.3333), True, generator)
        return step(inputs, targets[torch.from_numpy(batch).to(device)])

    synthetic = torch.rand(setting.batch, 3, setting.crop, setting.crop, device=device)
    synthetic_labels = torch.arange(setting.batch, device=device) // setting.per_class

    def model_step() -> torch.Tensor:
        return step(synthetic, synthetic_labels)

    return BenchmarkSteps(full_step, model_step, source.placement, flops, fast.precision)


def measure_throughput(
    setting: ThroughputSetting,
    device: torch.device,
    steps: int = 30,
    warmup: int = 5,
    images: int = 2000,
    classes: int = 100,
    fast_path: bool | None = None,
    peak_flops: float | None = None,
    compile_mode: str | None = None,
) -> Throughput:
    """Images/s of the full step and of the model alone for ``setting`` (see :func:`benchmark_steps`),
    after one first step (timed alone: with ``compile_mode`` it compiles) and ``warmup`` steps."""
    steps_of = benchmark_steps(setting, device, steps + warmup + 1, images, classes, fast_path, compile_mode)
    full_step, model_step = steps_of.full, steps_of.model_only
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
    before = _compile_counts()
    first = _timed(full_step, 1, 0, device)
    full = _timed(full_step, steps, warmup, device)
    model_only = _timed(model_step, steps, warmup, device)
    peak_memory = torch.cuda.max_memory_allocated(device) / 2**20 if device.type == "cuda" else None
    return Throughput(
        setting=setting,
        device=torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
        placement=steps_of.placement,
        full_images_per_s=steps * setting.batch / full,
        model_only_images_per_s=steps * setting.batch / model_only,
        train_flops_per_image=steps_of.train_flops_per_image,
        peak_flops=peak_flops,
        peak_memory_mib=peak_memory,
        compile_mode=compile_mode,
        first_step_seconds=first,
        precision=steps_of.precision,
        **({key: value - before[key] for key, value in _compile_counts().items()} if compile_mode else {}),
    )


def _compile_counts() -> dict[str, int]:
    """What ``torch.compile`` has done in this process so far (dynamo's and Inductor's counters):
    graphs made, graph breaks, graphs run without CUDA graphs under ``reduce-overhead``."""
    from torch._dynamo.utils import counters

    return {
        "compiled_graphs": int(counters["stats"]["unique_graphs"]),
        "graph_breaks": int(sum(counters["graph_break"].values())),
        "cudagraph_skips": int(counters["inductor"]["cudagraph_skips"]),
    }
