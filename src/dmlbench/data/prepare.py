"""Decode every image once into a compact cache that training and evaluation read fast.

Output directory (``artifacts/prepared/<dataset>/``):

* ``images.npy``   - uint8 array ``N x S x S x 3`` (RGB; short side resized to ``S`` =
  ``image_size`` px, then centre-cropped to a square), memory-mappable;
* ``manifest.csv`` - one row per image, in cache order: ``path,label,class_name,split``;
* ``info.json``    - dataset name, image size, images and classes per split.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from dmlbench.data.base import DatasetParams, DatasetSpec, check_annotations
from dmlbench.data.splits import assign_splits, split_summary
from dmlbench.errors import DataError
from dmlbench.io import atomic_dir, write_json

MANIFEST = "manifest.csv"
IMAGES = "images.npy"
INFO = "info.json"


def load_image(path: Path, size: int) -> np.ndarray:
    """Decode ``path`` as RGB (grayscale/CMYK/palette converted), resize short side, centre crop."""
    from PIL import Image

    with Image.open(path) as image:
        image.draft("RGB", (size, size))  # JPEG: decode at reduced scale when possible
        image = image.convert("RGB")
        width, height = image.size
        scale = size / min(width, height)
        new_w, new_h = max(size, round(width * scale)), max(size, round(height * scale))
        image = image.resize((new_w, new_h), Image.BILINEAR, reducing_gap=3.0)
        left, top = (new_w - size) // 2, (new_h - size) // 2
        image = image.crop((left, top, left + size, top + size))
        return np.asarray(image, dtype=np.uint8)


def prepare_dataset(spec: DatasetSpec, params: DatasetParams, raw_dir: Path, out_dir: Path) -> dict:
    """Read annotations, assign splits, decode all images; write the cache atomically."""
    from tqdm import tqdm

    frame = check_annotations(spec.read_annotations(params, raw_dir), spec.name)
    frame["split"] = assign_splits(frame, params.split)
    size = params.image_size

    with atomic_dir(out_dir) as tmp:
        images = np.lib.format.open_memmap(tmp / IMAGES, mode="w+", dtype=np.uint8, shape=(len(frame), size, size, 3))
        failures: list[str] = []
        for index, rel in enumerate(tqdm(frame["path"], desc=f"{spec.name}: decode", unit="img", mininterval=1.0)):
            try:
                images[index] = load_image(raw_dir / rel, size)
            except Exception as exc:  # PIL raises many types for corrupt files
                failures.append(f"{rel} ({type(exc).__name__}: {exc})")
        if failures:
            raise DataError(f"{spec.name}: {len(failures)} unreadable image(s), first: {failures[0]}")
        images.flush()
        del images
        frame.to_csv(tmp / MANIFEST, index=False)
        info = {
            "dataset": spec.name,
            "image_size": size,
            "num_images": int(len(frame)),
            "splits": split_summary(frame),
        }
        write_json(tmp / INFO, info)
    return info
