"""Decode every image once into a memory-mappable cache: RGB (EXIF orientation ignored, as DML loaders
do), torchvision's ``Resize(S)``, the long side centre-cropped to ``L = ceil(S * max_aspect)``
(docs/datasets.md, "Prepared cache"). ``images.npy`` (uint8 ``N x L x L x 3``, image ``i`` at
``[:h_i, :w_i]``, the rest 0), ``sizes.npy`` (int32 ``N x 2``), ``manifest.csv`` and ``info.json``.
Rows are written at their own index: ``workers`` change nothing.
"""

from __future__ import annotations

import math
import os
import sys
from pathlib import Path

import numpy as np
import pandas as pd

from dmlbench.data.archives import ARCHIVES_RECORD
from dmlbench.data.base import Counts, DatasetParams, DatasetSpec
from dmlbench.data.content import (
    allow_subset,
    check_counts,
    missing_images,
    missing_line,
    prepared_counts,
    read_checked,
)
from dmlbench.data.splits import assign_splits, fold_summary, split_summary
from dmlbench.errors import DataError
from dmlbench.io import atomic_dir, read_json, write_json

MANIFEST = "manifest.csv"
IMAGES = "images.npy"
SIZES = "sizes.npy"
INFO = "info.json"
MANIFEST_COLUMNS = ("path", "label", "class_name", "split", "fold")
SPLIT_ORDER = ("train", "val", "test", "query", "gallery")
CHUNK_ROWS = 32
SHOWN_FAILURES = 3


def available_cpus() -> int:
    """CPUs this process may run on (respects affinity / container limits)."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        return os.cpu_count() or 1


def target_geometry(width: int, height: int, size: int, long_max: int) -> tuple[int, int, tuple[float, ...]]:
    """Output ``(w, h)`` and the crop box ``(left, top, right, bottom)`` in source pixels: torchvision's
    ``Resize(size)`` (long side ``n = int(size * long / short)``), then if ``n > long_max`` the
    ``CenterCrop`` from offset ``round((n - long_max) / 2)``."""
    long_side = max(width, height)
    full = int(size * long_side / min(width, height))
    out_long = min(full, long_max)
    offset = int(round((full - out_long) / 2.0))
    start, end = offset * long_side / full, (offset + out_long) * long_side / full
    if width <= height:
        return size, out_long, (0.0, start, float(width), end)
    return out_long, size, (start, 0.0, end, float(height))


def decode_image(path: str | Path, size: int, long_max: int) -> np.ndarray:
    """One image as uint8 ``h x w x 3`` RGB: short side ``size``, long side <= ``long_max``."""
    from PIL import Image

    with Image.open(path) as image:
        width, height = image.size
        out_w, out_h, box = target_geometry(width, height, size, long_max)
        scale = size / min(width, height)
        # JPEG: let libjpeg downscale by 2/4/8 while the result stays >= the full image at `scale`.
        image.draft("RGB", (math.ceil(width * scale), math.ceil(height * scale)))
        fx, fy = image.size[0] / width, image.size[1] / height
        image = image.convert("RGB")
        box = (box[0] * fx, box[1] * fy, box[2] * fx, box[3] * fy)
        image = image.resize((out_w, out_h), Image.BILINEAR, box=box, reducing_gap=3.0)
        return np.asarray(image, dtype=np.uint8)


def _decode_chunk(task: tuple[str, int, list[str], int, int]) -> tuple[int, np.ndarray, list[tuple[int, str]]]:
    """Decode ``paths`` into rows ``start...`` of the ``.npy`` canvas file; return sizes and failures."""
    images_path, start, paths, size, long_max = task
    canvas = np.load(images_path, mmap_mode="r+")
    sizes = np.zeros((len(paths), 2), dtype=np.int32)
    failures: list[tuple[int, str]] = []
    for offset, path in enumerate(paths):
        try:
            pixels = decode_image(path, size, long_max)
        except Exception as exc:  # PIL raises many types for corrupt or unreadable files
            failures.append((start + offset, f"{type(exc).__name__}: {exc}"))
            continue
        h, w = pixels.shape[:2]
        canvas[start + offset, :h, :w] = pixels
        sizes[offset] = (h, w)
    canvas.flush()
    del canvas
    return start, sizes, failures


def decode_images(
    paths: list[str], images_path: Path, size: int, long_max: int, workers: int = 1, desc: str = "decode"
) -> tuple[np.ndarray, list[tuple[int, str]]]:
    """Fill the existing ``N x L x L x 3`` ``.npy`` at ``images_path``; return sizes (N x 2) and failures.
    Workers are forked on Linux (they run only PIL and numpy, as DataLoader's do), spawned elsewhere."""
    import multiprocessing
    from concurrent.futures import ProcessPoolExecutor, as_completed
    from concurrent.futures.process import BrokenProcessPool

    from tqdm import tqdm

    sizes = np.zeros((len(paths), 2), dtype=np.int32)
    failures: list[tuple[int, str]] = []
    tasks = [
        (str(images_path), start, paths[start : start + CHUNK_ROWS], size, long_max)
        for start in range(0, len(paths), CHUNK_ROWS)
    ]
    workers = max(1, min(workers, len(tasks)))
    context = multiprocessing.get_context("fork" if sys.platform.startswith("linux") else "spawn")

    def collect(result) -> None:
        start, chunk_sizes, chunk_failures = result
        sizes[start : start + len(chunk_sizes)] = chunk_sizes
        failures.extend(chunk_failures)
        bar.update(len(chunk_sizes))

    with tqdm(total=len(paths), desc=desc, unit="img", mininterval=1.0) as bar:
        if workers == 1:
            for task in tasks:
                collect(_decode_chunk(task))
        else:  # a worker that dies raises BrokenProcessPool (multiprocessing.Pool would hang)
            try:
                with ProcessPoolExecutor(workers, mp_context=context) as pool:
                    for future in as_completed([pool.submit(_decode_chunk, task) for task in tasks]):
                        collect(future.result())
            except BrokenProcessPool as exc:
                raise DataError(
                    f"{desc}: a decoding process died ({exc}); re-run with --workers 1 to see why"
                ) from None
    return sizes, sorted(failures)


def _drop_rows(images_path: Path, keep: np.ndarray) -> None:
    """Rewrite the canvas file without the rows where ``keep`` is False."""
    source = np.load(images_path, mmap_mode="r")
    kept_path = images_path.with_name("kept." + images_path.name)
    target = np.lib.format.open_memmap(kept_path, mode="w+", dtype=np.uint8, shape=(int(keep.sum()), *source.shape[1:]))
    rows = np.flatnonzero(keep)
    for begin in range(0, len(rows), 256):
        target[begin : begin + 256] = source[rows[begin : begin + 256]]
    target.flush()
    del target, source
    os.replace(kept_path, images_path)


def order_by_split(frame: pd.DataFrame) -> pd.DataFrame:
    """Rows grouped by split (train, val, test, query, gallery), the dataset's order kept within each."""
    rank = frame["split"].map({name: i for i, name in enumerate(SPLIT_ORDER)})
    return frame.iloc[np.argsort(rank.to_numpy(), kind="stable")].reset_index(drop=True)


def prepare_dataset(
    spec: DatasetSpec, params: DatasetParams, raw_dir: Path, out_dir: Path, workers: int | None = None
) -> dict:
    """Read annotations, assign splits, decode all images in parallel; write the cache atomically."""
    raw_dir, out_dir = Path(raw_dir), Path(out_dir)
    if not raw_dir.is_dir():
        raise DataError(f"{raw_dir}: no raw files (run the download@{spec.name} stage first)")
    frame = read_checked(spec.name, spec.read_annotations, params, raw_dir, str(raw_dir))
    counts = check_counts(spec.name, Counts.of(frame), spec.counts, allow_subset(params), str(raw_dir))
    missing = missing_images(frame, raw_dir)
    if missing and not params.skip_corrupt:  # before any decoding
        raise DataError(
            missing_line(spec.name, missing, str(raw_dir))
            + f": the archive lacks them; set datasets.{spec.name}.skip_corrupt: true to leave them out (counted)"
        )
    skipped = [{"path": path, "error": "listed but not in the archive"} for path in missing]
    frame = frame[~frame["path"].isin(set(missing))].reset_index(drop=True)
    frame["official"] = frame["split"]
    frame[["split", "fold"]] = assign_splits(frame, params.split)
    frame = order_by_split(frame)
    size, canvas = params.image_size, params.canvas_size
    workers = workers or available_cpus()

    with atomic_dir(out_dir) as tmp:
        images = np.lib.format.open_memmap(
            tmp / IMAGES, mode="w+", dtype=np.uint8, shape=(len(frame), canvas, canvas, 3)
        )
        del images  # zero-filled; workers write their rows through their own maps
        paths = [str(raw_dir / rel) for rel in frame["path"]]
        sizes, failures = decode_images(paths, tmp / IMAGES, size, canvas, workers, desc=f"{spec.name}: decode")
        unreadable = [{"path": frame["path"].iloc[i], "error": message} for i, message in failures]
        if unreadable and not params.skip_corrupt:
            shown = ", ".join(f"{s['path']} ({s['error']})" for s in unreadable[:SHOWN_FAILURES])
            more = f" and {len(unreadable) - SHOWN_FAILURES} more" if len(unreadable) > SHOWN_FAILURES else ""
            raise DataError(
                f"{spec.name}: {len(unreadable)} unreadable image(s): {shown}{more}; "
                f"set datasets.{spec.name}.skip_corrupt: true to leave them out"
            )
        if unreadable:
            keep = np.ones(len(frame), dtype=bool)
            keep[[i for i, _ in failures]] = False
            _drop_rows(tmp / IMAGES, keep)
            frame, sizes = frame[keep].reset_index(drop=True), sizes[keep]
        prepared = Counts.of(frame[["label"]].assign(split=frame["official"]))
        counts = prepared_counts(counts, prepared, len(skipped), len(unreadable))
        skipped += unreadable
        np.save(tmp / SIZES, sizes)
        frame.loc[:, list(MANIFEST_COLUMNS)].to_csv(tmp / MANIFEST, index=False)
        num_folds = params.split.folds
        info = {
            "dataset": spec.name,
            "image_size": size,
            "max_aspect": params.max_aspect,
            "canvas_size": canvas,
            "num_images": int(len(frame)),
            "split": params.split.model_dump(mode="json"),
            "num_folds": num_folds,
            "splits": split_summary(frame),
            "folds": fold_summary(frame, num_folds),
            "skipped": skipped,
            "counts": counts,
            "archives": read_json(raw_dir / ARCHIVES_RECORD) if (raw_dir / ARCHIVES_RECORD).exists() else [],
        }
        write_json(tmp / INFO, info)
    if skipped:  # left out, never silently
        print(
            f"{spec.name}: {len(skipped):,} listed image(s) left out (skip_corrupt: true): {len(missing):,} not in "
            f"the archive, {len(unreadable):,} unreadable; {prepared.images:,} of {counts['listed']['images']:,} "
            f"listed images prepared (listed in {out_dir / INFO})",
            file=sys.stderr,
        )
    return info
