"""Prepare throughput: images/s per core of the decode step of ``prepare@<dataset>``.

Generates ``--images`` (default 2,000) JPEGs of CUB-like size and content in a temporary
directory (long side 500 px, aspect 0.6-1.8 either way, quality 90, photo-like texture;
~60-80 kB each; CUB averages 98 kB), then runs :func:`dmlbench.data.prepare.decode_images`
(exactly what ``prepare@<dataset>`` runs: decode, resize to the short side ``--size``, centre-crop
to ``ceil(size * 4/3)``, write into a memory-mapped canvas) with 1..n worker processes, and
prints images/s and images/s per worker.

    .venv/bin/python benchmarks/prepare_throughput.py                 # 2,000 images, 1..n workers
    .venv/bin/python benchmarks/prepare_throughput.py --workers 1 2 4 --size 224 --json out.json
"""

from __future__ import annotations

import argparse
import json
import math
import platform
import tempfile
import time
from pathlib import Path

import numpy as np
from PIL import Image

from dmlbench.data.prepare import available_cpus, decode_images


def photo_like(rng: np.random.Generator, width: int, height: int) -> Image.Image:
    """Smooth colour regions plus edges and sensor-like noise, so JPEG sizes resemble photos."""
    coarse = rng.uniform(0, 255, size=(6, 8, 3)).astype(np.uint8)
    base = np.asarray(Image.fromarray(coarse).resize((width, height), Image.BICUBIC), dtype=np.float32)
    mid = rng.uniform(-40, 40, size=(height // 4 + 1, width // 4 + 1, 3)).astype(np.float32)
    mid = (
        np.asarray(
            Image.fromarray(((mid + 128).clip(0, 255)).astype(np.uint8)).resize((width, height), Image.BILINEAR),
            dtype=np.float32,
        )
        - 128
    )
    noise = rng.normal(0, 9, size=(height, width, 3)).astype(np.float32)
    return Image.fromarray(np.clip(base + mid + noise, 0, 255).astype(np.uint8))


def generate(directory: Path, count: int, seed: int = 0) -> list[str]:
    from tqdm import tqdm

    rng = np.random.default_rng(seed)
    paths = []
    for index in tqdm(range(count), desc="generate JPEGs", unit="img", mininterval=1.0):
        aspect = math.exp(rng.uniform(math.log(1 / 1.8), math.log(1.8)))  # w / h
        width, height = (500, round(500 / aspect)) if aspect >= 1 else (round(500 * aspect), 500)
        path = directory / f"{index:05d}.jpg"
        image = photo_like(rng, width, height)
        (image.convert("L") if index % 50 == 0 else image).save(path, quality=90)  # a few grayscale, like CUB
        paths.append(str(path))
    return paths


def measure(paths: list[str], directory: Path, size: int, workers: int) -> float:
    canvas = math.ceil(size * 4 / 3 - 1e-9)
    target = directory / f"images_{workers}.npy"
    np.lib.format.open_memmap(target, mode="w+", dtype=np.uint8, shape=(len(paths), canvas, canvas, 3))
    started = time.perf_counter()
    _, failures = decode_images(paths, target, size, canvas, workers=workers, desc=f"decode x{workers}")
    seconds = time.perf_counter() - started
    target.unlink()
    if failures:
        raise SystemExit(f"{len(failures)} images failed to decode: {failures[:3]}")
    return seconds


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--images", type=int, default=2000)
    parser.add_argument("--size", type=int, default=256, help="short side of the prepared images (px)")
    parser.add_argument("--workers", type=int, nargs="+", default=None, help="default: 1..usable CPUs")
    parser.add_argument("--json", type=Path, default=None, help="also write the figures here")
    args = parser.parse_args()
    if args.images < 2000:
        print(f"note: {args.images} images (the target measures >= 2,000)")
    cpus = available_cpus()
    worker_counts = args.workers or list(range(1, cpus + 1))

    with tempfile.TemporaryDirectory(prefix="dmlbench-prepare-") as tmp:
        directory = Path(tmp)
        paths = generate(directory, args.images)
        sizes = [Path(p).stat().st_size for p in paths]
        measure(paths[:64], directory, args.size, 1)  # warm the page cache and imports
        rows = []
        for workers in worker_counts:
            seconds = measure(paths, directory, args.size, workers)
            rate = len(paths) / seconds
            rows.append({"workers": workers, "seconds": seconds, "images_per_s": rate, "per_worker": rate / workers})

    print(
        f"\n{len(paths)} JPEGs, mean {np.mean(sizes) / 1e3:.0f} kB, long side 500 px -> short side {args.size} px "
        f"(canvas {math.ceil(args.size * 4 / 3 - 1e-9)}); {cpus} usable CPU(s), "
        f"{platform.processor() or platform.machine()}"
    )
    print(f"{'workers':>7} {'seconds':>8} {'images/s':>9} {'images/s per worker':>20}")
    for row in rows:
        print(f"{row['workers']:>7} {row['seconds']:>8.2f} {row['images_per_s']:>9.1f} {row['per_worker']:>20.1f}")
    if args.json:
        args.json.write_text(
            json.dumps(
                {
                    "images": len(paths),
                    "mean_bytes": float(np.mean(sizes)),
                    "size": args.size,
                    "cpus": cpus,
                    "rows": rows,
                },
                indent=2,
            )
            + "\n"
        )


if __name__ == "__main__":
    main()
