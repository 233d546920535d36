"""Memory of N processes reading one prepared image cache at once: the sum of their PSS.

Each process does what a training or tuning worker does with the cache: loads it
(:meth:`PreparedDataset.load`), takes the training half (what tuning reads) and a
non-contiguous fold of it, and gathers every training image in batches; then it holds and the
parent reads every process's PSS (``/proc/<pid>/smaps_rollup``: a shared page counts 1/k in each of
the k processes that map it, so the sum is what the box really holds; RSS would count it k times).

    python benchmarks/cache_memory.py                                   # 8 processes, 6,000 x 342 px
    python benchmarks/cache_memory.py --images 60000 --px 342           # SOP size (21 GB on disk)
    python benchmarks/cache_memory.py --in-memory                       # each process reads its own copy

Target: eight processes on an SOP-size cache hold <= 1.2 x one cache in total.
The fabricated cache is written once to ``--dir`` (default: a temporary directory).
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))  # run from a checkout without installing

BATCH = 64


def fabricate_cache(directory: Path, images: int, px: int, seed: int = 0) -> int:
    """A prepared-cache directory (images.npy, manifest.csv, info.json) of ``images`` random
    ``px`` x ``px`` x 3 images in 4-image classes, train and test classes interleaved in cache
    order (so the training half is not contiguous); its images' size in bytes."""
    import pandas as pd

    from dmlbench.data.prepare import IMAGES, INFO, MANIFEST
    from dmlbench.io import write_json

    directory.mkdir(parents=True, exist_ok=True)
    path = directory / IMAGES
    shape = (images, px, px, 3)
    if not path.exists() or np.load(path, mmap_mode="r").shape != shape:
        array = np.lib.format.open_memmap(path, mode="w+", dtype=np.uint8, shape=shape)
        rng = np.random.default_rng(seed)
        for start in range(0, images, 1024):
            stop = min(images, start + 1024)
            array[start:stop] = rng.integers(0, 256, (stop - start, px, px, 3), dtype=np.uint8)
        array.flush()
        del array
    labels = np.arange(images) // 4
    split = np.where(labels % 2 == 0, "train", "test")
    folds = np.where(split == "train", (labels // 2 % 4).astype(str), "")  # rc_cv-like: 4 folds
    pd.DataFrame(
        {"path": [f"{i}.jpg" for i in range(images)], "label": labels, "class_name": labels.astype(str),
         "split": split, "fold": folds}
    ).to_csv(directory / MANIFEST, index=False)  # fmt: skip
    write_json(directory / INFO, {"dataset": "fabricated", "image_size": px, "canvas_size": px, "num_folds": 4})
    return int(np.prod(shape))


def pss_bytes(pid: int | str = "self") -> int:
    """Proportional set size of a process (bytes), from ``/proc/<pid>/smaps_rollup``."""
    for line in Path(f"/proc/{pid}/smaps_rollup").read_text().splitlines():
        if line.startswith("Pss:"):
            return int(line.split()[1]) * 1024
    raise RuntimeError(f"no Pss line in /proc/{pid}/smaps_rollup")


def reader(directory: str, in_memory: bool, ready: Any, hold: Any, result: Any) -> None:
    """One worker: baseline PSS, then load, training half, a fold, every training image gathered."""
    from dmlbench.data.cache import PreparedDataset
    from dmlbench.train.step import host_rows

    baseline = pss_bytes()
    data = PreparedDataset.load(directory, in_memory=in_memory)
    half = data.training_half()
    fold = half.split("train", fold=1)  # not contiguous
    whole = half.split("train")
    checksum = 0
    for split in (whole, fold):
        for start in range(0, len(split), BATCH):
            index = np.arange(start, min(start + BATCH, len(split)))
            checksum += int(host_rows(split.images, index)[:, 0, 0, 0].sum())
    result.put({"baseline": baseline, "checksum": checksum})
    ready.set()
    hold.wait()


def measure(directory: Path, processes: int, in_memory: bool = False) -> dict[str, float]:
    """Start ``processes`` readers, wait until all touched the cache, read their PSS; figures in
    bytes (``pss_sum``: the sum of the readers' PSS above their own baseline)."""
    context = multiprocessing.get_context("spawn")
    hold = context.Event()
    result: multiprocessing.queues.Queue = context.Queue()
    readies = [context.Event() for _ in range(processes)]
    workers = [
        context.Process(target=reader, args=(str(directory), in_memory, ready, hold, result)) for ready in readies
    ]
    for worker in workers:
        worker.start()
    try:
        deadline = time.monotonic() + 600
        while not all(ready.is_set() for ready in readies):
            dead = [worker for worker in workers if worker.exitcode is not None]
            if dead:
                raise RuntimeError(f"a reader exited with code {dead[0].exitcode} before reading the cache")
            if time.monotonic() > deadline:
                raise RuntimeError("a reader did not finish within 600 s")
            time.sleep(0.1)
        reports = [result.get(timeout=60) for _ in workers]
        pss = [pss_bytes(worker.pid) for worker in workers if worker.pid is not None]
    finally:
        hold.set()
        for worker in workers:
            worker.join(60)
    checksums = {report["checksum"] for report in reports}
    if len(checksums) != 1:
        raise RuntimeError(f"the readers saw different images: {checksums}")
    baseline = sum(report["baseline"] for report in reports)
    return {"pss_sum": float(sum(pss) - baseline), "processes": float(processes)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--images", type=int, default=6000)
    parser.add_argument("--px", type=int, default=342)
    parser.add_argument("--processes", type=int, default=8)
    parser.add_argument("--in-memory", action="store_true", help="each process reads the cache into its memory")
    parser.add_argument("--dir", type=Path, default=None, help="where the fabricated cache goes (kept)")
    args = parser.parse_args()
    directory = args.dir or Path(tempfile.mkdtemp(prefix="cache-memory-"))
    size = fabricate_cache(directory, args.images, args.px)
    figures = measure(directory, args.processes, args.in_memory)
    ratio = figures["pss_sum"] / size
    print(json.dumps({"images": args.images, "px": args.px, "cache_gb": round(size / 2**30, 3),
                      "processes": args.processes, "in_memory": args.in_memory,
                      "pss_sum_gb": round(figures["pss_sum"] / 2**30, 3),
                      "pss_sum_over_cache": round(ratio, 3)}))  # fmt: skip
    print(f"{args.processes} processes, cache {size / 2**30:.2f} GB ({args.images} x {args.px} px): sum of PSS "
          f"{figures['pss_sum'] / 2**30:.2f} GB = {ratio:.2f} x one cache (target <= 1.2)")  # fmt: skip


if __name__ == "__main__":
    main()
