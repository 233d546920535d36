"""Embed-stage CPU cost: wall, user and system seconds of ``compute_embeddings`` with ResNet50.

Random-init ResNet50 (no weights needed), random uint8 images in a memory-mapped ``.npy`` (as
the prepared cache is read), the thesis evaluation transform (Resize(256) -> CenterCrop(224)),
``--threads`` intra-op threads. ``--sizes`` stores the images on a 4:3 canvas with per-image
valid sizes (the CUB cache's layout). Also times the model's forward alone on the transformed
batches, to show how much of the system time is PyTorch's own activations (each large tensor
is a fresh ``mmap`` from glibc, page-faulted on first touch and unmapped when freed).
``--mallopt`` runs everything inside :func:`dmlbench.evaluate.embed.heap_kept` (glibc
``mallopt``), as the embed stages do.

    python benchmarks/embed_memory.py                      # 64 images, batch 32, 2 threads
    python benchmarks/embed_memory.py --mallopt            # the same inside heap_kept()

Prints one line per phase: wall, user and sys seconds (``resource.getrusage``) and minor page
faults.
"""

from __future__ import annotations

import argparse
import contextlib
import resource
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))  # run from a checkout without installing


class Phase:
    """Wall, user and sys seconds and minor page faults of the block (``RUSAGE_SELF``)."""

    def __init__(self, name: str):
        self.name = name

    def __enter__(self):
        self.wall, self.usage = time.perf_counter(), resource.getrusage(resource.RUSAGE_SELF)
        return self

    def __exit__(self, *exc):
        after = resource.getrusage(resource.RUSAGE_SELF)
        wall = time.perf_counter() - self.wall
        user, sys_s = after.ru_utime - self.usage.ru_utime, after.ru_stime - self.usage.ru_stime
        faults = after.ru_minflt - self.usage.ru_minflt
        print(f"{self.name:<28} wall {wall:6.2f} s  user {user:6.2f} s  sys {sys_s:6.2f} s  minor faults {faults:>9,}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--images", type=int, default=64)
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--image-size", type=int, default=256, help="px, short side of the cached images")
    parser.add_argument("--eval-resize", type=int, default=256)
    parser.add_argument("--crop", type=int, default=224)
    parser.add_argument("--sizes", action="store_true", help="4:3 canvas with per-image valid sizes")
    parser.add_argument("--repeats", type=int, default=2, help="timed passes (after one warm-up pass)")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--mallopt", action="store_true", help="run inside embed.heap_kept()")
    args = parser.parse_args()

    import torch

    from dmlbench.evaluate.embed import heap_kept

    torch.set_num_threads(args.threads)
    with contextlib.ExitStack() as stack:
        if args.mallopt:
            print(f"heap_kept(): {stack.enter_context(heap_kept())}")
        run(args)


def run(args: argparse.Namespace) -> None:
    """Embed the images (warm-up + ``repeats`` timed passes), then the transform and forward alone."""
    import numpy as np
    import torch

    from dmlbench.data.augment import eval_transform
    from dmlbench.evaluate import embed
    from dmlbench.models import BACKBONES, build_model

    torch.manual_seed(0)
    model = build_model("resnet50", BACKBONES["resnet50"].params(), dim=512, pooling="gap+gmp").to(args.device)
    rng = np.random.default_rng(0)
    side = args.image_size
    canvas, sizes = (side, side), None
    if args.sizes:  # landscape 4:3, portrait 3:4 (short side = side) and square images on one canvas
        canvas = (side * 4 // 3, side * 4 // 3)
        sizes = np.array([[side, side * 4 // 3], [side * 4 // 3, side], [side, side]])[np.arange(args.images) % 3]
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "images.npy"
        np.save(path, rng.integers(0, 256, size=(args.images, *canvas, 3), dtype=np.uint8))
        images = np.load(path, mmap_mode="r")
        print(
            f"resnet50 (random init), {args.images} images {canvas[0]}x{canvas[1]} px (memmap), "
            f"Resize({args.eval_resize}) -> CenterCrop({args.crop}), batch {args.batch}, "
            f"{torch.get_num_threads()} threads, device {args.device}, torch {torch.__version__}"
        )

        def embed_all():
            return embed.compute_embeddings(
                model, images, args.eval_resize, args.crop, args.batch, args.device, sizes=sizes
            )

        embed_all()  # warm-up: weights paged in, kernels chosen
        for repeat in range(args.repeats):
            with Phase(f"compute_embeddings #{repeat + 1}"):
                embed_all()

        starts = range(0, args.images, args.batch)
        inputs = [
            eval_transform(
                torch.from_numpy(np.array(images[s : s + args.batch])),
                args.eval_resize,
                args.crop,
                sizes=None if sizes is None else sizes[s : s + args.batch],
            ).to(args.device)
            for s in starts
        ]
        with Phase("transform only"), torch.no_grad():
            for s in starts:
                chunk = torch.from_numpy(np.array(images[s : s + args.batch]))
                eval_transform(chunk, args.eval_resize, args.crop, None if sizes is None else sizes[s : s + args.batch])
        model.eval()
        with Phase("model forward only"), torch.no_grad():
            for batch in inputs:
                model(batch)
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20
    print(f"peak RSS {peak:.2f} GB")


if __name__ == "__main__":
    main()
