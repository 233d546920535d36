"""Training throughput: images/s of the full training step next to the model alone.

Prints, in one run and on the same device:

* ``full step``: what the training loop does per batch: gather a batch from the uint8 image
  cache (kept on the device when it fits), batched RandomResizedCrop + flip on that device,
  forward (bf16 autocast on GPU), miner + loss, backward, optimiser steps;
* ``model only``: forward + loss + backward + step of the same model on a synthetic batch that
  already sits on the device at the final crop size (no sampling, no augmentation);

plus the peak memory (GPU: ``torch.cuda.max_memory_allocated``; CPU: peak RSS). The ratio shows
whether data handling limits training.

    python benchmarks/train_throughput.py                       # CPU, small settings
    python benchmarks/train_throughput.py --backbone bn_inception --image-size 256 --crop 224 \\
        --batch 180 --loss proxy_anchor --dim 512 --images 20000 --steps 50   # on a GPU
"""

from __future__ import annotations

import argparse
import resource
import sys
import time

import numpy as np
import torch

from dmlbench.data.augment import train_transform
from dmlbench.losses import LOSSES
from dmlbench.models import BACKBONES, build_model
from dmlbench.train.sampling import epoch_batches
from dmlbench.train.step import FastPath, ImageSource, TrainStep


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--backbone", default="tiny_cnn")
    parser.add_argument("--loss", default="multi_similarity")
    parser.add_argument("--dim", type=int, default=64)
    parser.add_argument("--image-size", type=int, default=36, help="side of the cached uint8 images")
    parser.add_argument("--crop", type=int, default=32, help="training crop size")
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--per-class", type=int, default=4)
    parser.add_argument("--images", type=int, default=2000, help="size of the synthetic image cache")
    parser.add_argument("--classes", type=int, default=100)
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--no-fast-path", action="store_true", help="disable bf16/channels_last on GPU")
    return parser.parse_args()


def make_step(args, fast: FastPath) -> TrainStep:
    torch.manual_seed(0)
    spec, loss_spec = BACKBONES[args.backbone], LOSSES[args.loss]
    model = fast.prepare_model(build_model(args.backbone, spec.params(), args.dim, frozen_bn=True))
    loss_params = loss_spec.params()
    loss_fn = loss_spec.build(loss_params, args.classes, args.dim).to(fast.device)
    optimizers = [torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-4)]
    if loss_spec.has_parameters:
        optimizers.append(torch.optim.AdamW(loss_fn.parameters(), lr=1e-2))
    return TrainStep(model.train(), loss_fn, loss_spec.miner(loss_params), optimizers, fast, grad_clip=10.0)


def timed(fn, steps: int, warmup: int, device: torch.device) -> float:
    for _ in range(warmup):
        fn()
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    start = time.perf_counter()
    for _ in range(steps):
        loss = fn()
    float(loss)  # waits for the device
    return time.perf_counter() - start


def main() -> None:
    args = parse_args()
    device = torch.device(args.device)
    fast = FastPath.for_device(device, enabled=not args.no_fast_path)
    rng = np.random.default_rng(0)
    cache = rng.integers(0, 256, (args.images, args.image_size, args.image_size, 3), dtype=np.uint8)
    labels = np.arange(args.images) % args.classes
    np.random.seed(0)
    batches = epoch_batches(labels, args.batch, args.per_class, iterations=args.steps + args.warmup)
    source = ImageSource(cache, device)
    targets = torch.from_numpy(labels).to(device)
    generator = torch.Generator().manual_seed(0)
    step = make_step(args, fast)
    counter = iter(range(10**9))

    def full_step():
        batch = batches[next(counter) % len(batches)]
        inputs = train_transform(source.batch(batch), args.crop, (0.16, 1.0), (0.75, 1.33), True, generator)
        return step(inputs, targets[torch.from_numpy(batch).to(device)])

    synthetic = torch.rand(args.batch, 3, args.crop, args.crop, device=device)
    synthetic_labels = torch.arange(args.batch, device=device) // args.per_class

    def model_step():
        return step(synthetic, synthetic_labels)

    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
    full = timed(full_step, args.steps, args.warmup, device)
    model_only = timed(model_step, args.steps, args.warmup, device)
    images = args.steps * args.batch
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else f"cpu ({torch.get_num_threads()} threads)"
    print(f"device: {name}; fast path: bf16={fast.amp_dtype is not None}, channels_last={fast.channels_last}")
    print(
        f"setting: {args.backbone} + {args.loss}, dim {args.dim}, batch {args.batch} ({args.per_class}/class), "
        f"cache {args.images} x {args.image_size}px uint8 on {source.placement}, crop {args.crop}px, {args.steps} steps"
    )
    print(f"full step   : {images / full:9.1f} images/s")
    print(f"model only  : {images / model_only:9.1f} images/s   (full step = {model_only / full:.0%} of it)")
    if device.type == "cuda":
        print(f"peak memory : {torch.cuda.max_memory_allocated(device) / 2**20:9.1f} MiB (GPU, allocated)")
    else:
        scale = 1 if sys.platform == "darwin" else 1024
        print(f"peak memory : {resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * scale / 2**20:9.1f} MiB (peak RSS)")


if __name__ == "__main__":
    main()
