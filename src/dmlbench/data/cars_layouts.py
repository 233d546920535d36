"""CARS196's image tables from the non-Stanford layouts, at any depth (docs/datasets.md names the files):
devkit (torchvision's ``StanfordCars``; every labelled test-annotation copy must agree) and folders
(pytorch-metric-learning 2.9's Kaggle copy, ``car_data/car_data/{train,test}/<class>/``); both give
``path,label,class_name`` (checked by :mod:`dmlbench.data.content`)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd

from dmlbench.data.base import integer_column, read_table
from dmlbench.data.extract import extract_archive
from dmlbench.errors import DataError

LABEL_FILES = {"cars_train": "cars_train_annos.mat", "cars_test": "cars_test_annos_withlabels*.mat"}
META = "cars_meta.mat"
DEVKIT_ARCHIVE = "car_devkit.tgz"
DEVKIT_URL = "https://github.com/pytorch/vision/files/11644847/car_devkit.tgz"  # pytorch/vision#7545
IMAGES_KAGGLE = "Kaggle's jessicali9530/stanford-cars-dataset (as stanford-cars-dataset.zip)"
META_KAGGLE = "Kaggle's abdelrahmant11/standford-cars-dataset-meta (as standford-cars-dataset-meta.zip)"
WITH_LABELS = (
    "the labelled test annotations cars_test_annos_withlabels.mat (any of its published names, e.g. "
    f"'cars_test_annos_withlabels (1).mat' of {META_KAGGLE}; pytorch/vision#7545, comment 1631441616)"
)
FOLDERS_ROOT = ("car_data", "car_data")
FOLDERS_FILES = ("names.csv", "anno_train.csv", "anno_test.csv")


def hits(root: Path, pattern: str) -> list[Path]:
    """Everything matching ``pattern`` at any depth under ``root`` (macOS resource forks left out)."""
    return sorted(p for p in root.rglob(pattern) if "__MACOSX" not in p.parts and not p.name.startswith("._"))


def unpack_nested_devkit(root: Path) -> None:
    """Unpack the ``car_devkit.tgz`` inside Kaggle's meta download when no ``cars_meta.mat`` is there yet."""
    if hits(root, META):
        return
    for archive in hits(root, DEVKIT_ARCHIVE):
        extract_archive(archive, archive.parent)


def _image_folder(root: Path, name: str) -> Path:
    """The one folder called ``name`` that holds .jpg files (Kaggle nests ``cars_train/cars_train/``)."""
    found = [p for p in hits(root, name) if p.is_dir() and any(c.suffix.lower() == ".jpg" for c in p.iterdir())]
    if not found:
        raise DataError(
            f"no {name}/ with .jpg files: add {IMAGES_KAGGLE}, the release's {name}.tgz or torchvision's "
            "stanford_cars/ folder"
        )
    if len(found) > 1:
        shown = ", ".join(p.relative_to(root).as_posix() for p in found[:2])
        raise DataError(f"{len(found)} {name}/ folders with images ({shown}); keep one")
    return found[0]


def _load(root: Path, path: Path, key: str, fields: tuple[str, ...] = ()) -> list:
    """Variable ``key`` of a .mat file (the ``fields`` of each struct, or each value); one line if it is not there."""
    from scipy.io import loadmat

    rel = path.relative_to(root).as_posix()
    try:
        value = np.atleast_1d(loadmat(path, squeeze_me=True)[key])
    except Exception as exc:  # noqa: BLE001 - scipy raises many types for a wrong or corrupt file
        raise DataError(f"{rel} has no {key} ({type(exc).__name__}: {' '.join(str(exc).split())[:120]})") from None
    if not fields:
        return [str(item) for item in value]
    names = value.dtype.names or ()
    absent = [field for field in fields if field not in names]
    if absent:
        if "class" in absent and "withlabels" not in path.name:
            raise DataError(
                f"{rel} has no class labels (the devkit's test annotations are unlabelled); add {WITH_LABELS}"
            )
        raise DataError(f"{rel}: {key} has no {', '.join(absent)} (its fields: {', '.join(names) or 'none'})")
    return list(zip(*(value[field].tolist() for field in fields), strict=True))


def _read_one(root: Path, pattern: str, key: str, fields: tuple[str, ...], missing: str) -> list:
    """``key`` of the .mat files matching ``pattern``; several copies (the zip's and one beside it) must agree."""
    values = [(path, _load(root, path, key, fields)) for path in hits(root, pattern) if path.is_file()]
    if not values:
        raise DataError(missing)
    for path, value in values[1:]:
        if value != values[0][1]:
            shown = f"{values[0][0].relative_to(root).as_posix()}, {path.relative_to(root).as_posix()}"
            raise DataError(f"{pattern} differs between {shown}; keep one")
    return values[0][1]


def devkit_table(root: Path) -> pd.DataFrame:
    """``path,label,class_name`` of every image of the classification release's layout under ``root``."""
    no_devkit = (
        f"no devkit (devkit/{META}, devkit/cars_train_annos.mat): {IMAGES_KAGGLE} holds the images only; add "
        f"{DEVKIT_ARCHIVE} ({DEVKIT_URL}) or {META_KAGGLE}"
    )
    names = _read_one(root, META, "class_names", (), no_devkit)
    parts = []
    for folder, pattern in LABEL_FILES.items():
        missing = no_devkit if folder == "cars_train" else f"no {WITH_LABELS.removeprefix('the ')}"
        annotations = _read_one(root, pattern, "annotations", ("fname", "class"), missing)
        prefix = _image_folder(root, folder).relative_to(root).as_posix()
        parts.append(
            pd.DataFrame(
                {"path": [f"{prefix}/{fname}" for fname, _ in annotations], "label": [int(c) for _, c in annotations]}
            )
        )
    frame = pd.concat(parts, ignore_index=True)
    unnamed = frame["label"][(frame["label"] < 1) | (frame["label"] > len(names))]
    if len(unnamed):
        raise DataError(f"class {unnamed.iloc[0]} of the annotations has no name in {META} ({len(names)} names)")
    frame["class_name"] = [names[label - 1] for label in frame["label"]]
    return frame


def folders_table(root: Path) -> pd.DataFrame:
    """``path,label,class_name`` of every image of the class-folder layout under ``root``."""
    found = hits(root, FOLDERS_FILES[1])
    if len(found) != 1:
        where = "none" if not found else ", ".join(p.relative_to(root).as_posix() for p in found[:2])
        raise DataError(
            f"{len(found)} anno_train.csv ({where}); expected one, beside names.csv, anno_test.csv and "
            f"{'/'.join(FOLDERS_ROOT)}/ (Kaggle's jutrera/stanford-car-dataset-by-classes-folder)"
        )
    base = found[0].parent
    prefix = base.relative_to(root)
    expected = "Kaggle's jutrera/stanford-car-dataset-by-classes-folder layout"
    names_table = read_table(
        root, (prefix / "names.csv").as_posix(), ["name"], f"{expected} (one class name a line)", sep="\t"
    )
    names = [name.strip() for name in names_table["name"] if name.strip()]
    images = base.joinpath(*FOLDERS_ROOT)
    if not (images / "train").is_dir() or not (images / "test").is_dir():
        raise DataError(f"no {(prefix.joinpath(*FOLDERS_ROOT)).as_posix()}/train/ and test/; expected {expected}")
    columns = ["fname", "x1", "y1", "x2", "y2", "label"]
    parts = []
    for split in ("train", "test"):
        rel = (prefix / f"anno_{split}.csv").as_posix()
        table = read_table(root, rel, columns, f"{expected} (fname,x1,y1,x2,y2,class a line, no header)", sep=",")
        labels = integer_column(table, "label", rel)
        unnamed = labels[(labels < 1) | (labels > len(names))]
        if len(unnamed):
            raise DataError(f"{rel}: class {unnamed.iloc[0]} has no name in names.csv ({len(names)} names)")
        folder = (prefix.joinpath(*FOLDERS_ROOT) / split).as_posix()
        class_names = [names[label - 1] for label in labels]
        paths = [
            f"{folder}/{name.replace('/', '-')}/{fname}"
            for name, fname in zip(class_names, table["fname"], strict=True)
        ]
        parts.append(pd.DataFrame({"path": paths, "label": labels.to_numpy(), "class_name": class_names}))
    return pd.concat(parts, ignore_index=True)
