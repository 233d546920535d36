"""Small archives in the exact formats of CUB-200-2011, CARS196, SOP and In-Shop (few images, the
published file and folder names, tables and ``.mat`` structs), and the JPEGs they hold."""

from __future__ import annotations

import io
import tarfile
import zipfile
from pathlib import Path


def tar_of(path: Path, entries: list[tuple[dict, bytes | None]]) -> Path:
    """A .tgz at ``path`` whose members are (TarInfo fields incl. ``name``, bytes or None)."""
    with tarfile.open(path, "w:gz") as tar:
        for fields, content in entries:
            fields = dict(fields)
            info = tarfile.TarInfo(fields.pop("name"))
            for key, value in fields.items():
                setattr(info, key, value)
            if content is not None:
                info.size = len(content)
            tar.addfile(info, io.BytesIO(content) if content is not None else None)
    return path


def write_jpeg(path: Path, width: int, height: int, seed: int, gray: bool = False) -> None:
    """A small smooth random JPEG (grayscale if ``gray``)."""
    import numpy as np
    from PIL import Image

    rng = np.random.default_rng(seed)
    coarse = rng.uniform(0, 255, size=(3, 4, 3)).astype(np.uint8)
    image = Image.fromarray(coarse).resize((width, height), Image.BILINEAR)
    path.parent.mkdir(parents=True, exist_ok=True)
    (image.convert("L") if gray else image).save(path, quality=90)


# Sizes cycle through landscape, portrait, square and very wide (cropped to max_aspect).
JPEG_SIZES = ((24, 18), (18, 24), (20, 20), (40, 16))


def _tar(archive: Path, root: Path, names: list[str]) -> None:
    with tarfile.open(archive, "w:gz") as tar:
        for name in names:
            tar.add(root / name, arcname=name)


def _zip(archive: Path, root: Path, names: list[str]) -> None:
    with zipfile.ZipFile(archive, "w") as zf:
        for name in names:
            for file in sorted((root / name).rglob("*")) if (root / name).is_dir() else [root / name]:
                zf.write(file, arcname=file.relative_to(root).as_posix())


def build_cub(out: Path, per_class: int = 2) -> dict:
    """``CUB_200_2011.tgz``: 200 classes x ``per_class`` JPEGs (every 3rd grayscale) with
    ``images.txt``, ``image_class_labels.txt``, ``classes.txt`` and a ``train_test_split.txt``
    that mixes classes (as the real one does), plus top-level ``attributes.txt``."""
    src = out / "cub_src"
    root = src / "CUB_200_2011"
    images, labels, classes, split = [], [], [], []
    image_id = 0
    for label in range(1, 201):
        folder = f"{label:03d}.Bird_{label}"
        classes.append(f"{label} {folder}")
        for k in range(per_class):
            image_id += 1
            rel = f"{folder}/Bird_{label}_{k:04d}_{image_id}.jpg"
            w, h = JPEG_SIZES[image_id % len(JPEG_SIZES)]
            write_jpeg(root / "images" / rel, w, h, seed=image_id, gray=image_id % 3 == 0)
            images.append(f"{image_id} {rel}")
            labels.append(f"{image_id} {label}")
            split.append(f"{image_id} {k % 2}")
    for name, lines in [
        ("images.txt", images),
        ("image_class_labels.txt", labels),
        ("classes.txt", classes),
        ("train_test_split.txt", split),
    ]:
        (root / name).write_text("\n".join(lines) + "\n")
    (src / "attributes.txt").write_text("1 has_bill_shape::curved\n")
    archive = out / "CUB_200_2011.tgz"
    _tar(archive, src, ["attributes.txt", "CUB_200_2011"])
    return {"files": [archive], "per_class": per_class}


def build_cars(out: Path, per_class: int = 2) -> dict:
    """``car_ims.tgz`` (all images under ``car_ims/``) and ``cars_annos.mat`` written with scipy
    in the real layout: ``annotations`` 1 x N struct (relative_im_path, bbox_x1..y2, class, test)
    and ``class_names`` 1 x 196 cell."""
    import numpy as np
    from scipy.io import savemat

    src = out / "cars_src"
    rows = []
    index = 0
    for label in range(1, 197):
        for _ in range(per_class):
            index += 1
            rel = f"car_ims/{index:06d}.jpg"
            w, h = JPEG_SIZES[index % len(JPEG_SIZES)]
            write_jpeg(src / rel, w, h, seed=10_000 + index, gray=index % 50 == 0)
            rows.append((rel, 1, 2, w - 1, h - 1, label, index % 2))
    fields = ["relative_im_path", "bbox_x1", "bbox_y1", "bbox_x2", "bbox_y2", "class", "test"]
    annotations = np.zeros((1, len(rows)), dtype=[(f, "O") for f in fields])
    for i, row in enumerate(rows):
        annotations[0, i] = tuple(
            np.array([[v]], dtype=np.uint16) if f != "relative_im_path" else np.array([v])
            for f, v in zip(fields, row, strict=True)
        )
    class_names = np.empty((1, 196), dtype=object)
    for label in range(1, 197):
        class_names[0, label - 1] = np.array([f"Make{label} Model {label} 2012"])
    savemat(out / "cars_annos.mat", {"annotations": annotations, "class_names": class_names})
    archive = out / "car_ims.tgz"
    _tar(archive, src, ["car_ims"])
    return {"files": [archive, out / "cars_annos.mat"], "per_class": per_class}


SOP_CATEGORIES = ("bicycle", "cabinet", "chair", "coffee_maker")


def build_sop(out: Path, classes: int = 24, per_class: int = 3) -> dict:
    """``Stanford_Online_Products.zip``: ``<category>_final/<product>_<k>.JPG`` plus ``Ebay_train.txt`` /
    ``Ebay_test.txt`` (header ``image_id class_id super_class_id path``); first half of the classes train."""
    src = out / "sop_src"
    root = src / "Stanford_Online_Products"
    tables = {"train": [], "test": []}
    image_id = 0
    for label in range(1, classes + 1):
        super_id = (label - 1) % len(SOP_CATEGORIES) + 1
        split = "train" if label <= classes // 2 else "test"
        for k in range(per_class):
            image_id += 1
            rel = f"{SOP_CATEGORIES[super_id - 1]}_final/{111_000 + label}_{k}.JPG"
            w, h = JPEG_SIZES[image_id % len(JPEG_SIZES)]
            write_jpeg(root / rel, w, h, seed=20_000 + image_id)
            tables[split].append(f"{image_id} {label} {super_id} {rel}")
    for split, lines in tables.items():
        (root / f"Ebay_{split}.txt").write_text("image_id class_id super_class_id path\n" + "\n".join(lines) + "\n")
    archive = out / "Stanford_Online_Products.zip"
    _zip(archive, src, ["Stanford_Online_Products"])
    return {"files": [archive], "classes": classes, "per_class": per_class}


def build_inshop(out: Path) -> dict:
    """``img.zip`` (``img/<GENDER>/<category>/id_XXXXXXXX/NN_k_view.jpg``) and ``list_eval_partition.txt``
    (line 1: count, line 2: header, then ``image_name item_id evaluation_status``)."""
    src = out / "inshop_src"
    lines = []
    layout = {"train": range(1, 9), "test": range(9, 17)}
    n = 0
    for split, items in layout.items():
        for item in items:
            category = ("WOMEN/Dresses", "MEN/Denim")[item % 2]
            views = ["front", "side", "back"] if item != 3 else ["front"]  # a single-image training item
            for k, view in enumerate(views):
                n += 1
                rel = f"img/{category}/id_{item:08d}/{k + 1:02d}_{k + 1}_{view}.jpg"
                w, h = JPEG_SIZES[n % len(JPEG_SIZES)]
                write_jpeg(src / rel, w, h, seed=30_000 + n)
                status = split if split == "train" else ("query" if k == 0 else "gallery")
                lines.append(f"{rel}    id_{item:08d}    {status}")
    (out / "list_eval_partition.txt").write_text(
        f"{len(lines)}\nimage_name item_id evaluation_status\n" + "\n".join(lines) + "\n"
    )
    archive = out / "img.zip"
    _zip(archive, src, ["img"])
    return {"files": [archive, out / "list_eval_partition.txt"], "images": len(lines)}
