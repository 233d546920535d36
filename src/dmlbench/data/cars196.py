"""CARS196 / Stanford Cars (Krause et al., 3dRR 2013): 16,185 photos of 196 car models.

DML split: classes 1-98 train, 99-196 test, over all images (the classification split into
``cars_train`` / ``cars_test``, 8,144 / 8,041 images, is ignored). Every Stanford URL has
returned 404 since 2023 (pytorch/vision#7545), so the files go into ``data/`` by hand, in
either layout:

* ``stanford``: ``car_ims.tgz`` + ``cars_annos.mat`` (``annotations``: relative_im_path,
  bbox_x1..y2, class, test; ``class_names``), the files of the DML papers; md5s published.
* ``devkit``: the Kaggle / torchvision layout (torchvision's ``StanfordCars``): ``cars_train/``,
  ``cars_test/``, ``devkit/cars_train_annos.mat`` and ``cars_test_annos_withlabels.mat``
  (``annotations``: bbox_x1..y2, class, fname) and ``devkit/cars_meta.mat`` (``class_names``),
  found at any depth in ``stanford_cars.zip`` (any zip or tar under that name, e.g. the Kaggle
  download), the unpacked folder ``stanford_cars/``, and/or the release's separate
  ``car_devkit.tgz``, ``cars_train.tgz``, ``cars_test.tgz``, ``cars_test_annos_withlabels.mat``.
  No checksum is published for these copies, so the content is checked (every listed image
  present, 8,144 + 8,041 images, 196 classes) and each file's sha256 is recorded on first use
  (``data/<file>.sha256``; :mod:`dmlbench.data.archives`).
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import numpy as np
import pandas as pd

from dmlbench.data.archives import (
    ARCHIVES_RECORD,
    ArchiveSource,
    ArchiveSourceParams,
    ResolvedArchive,
    archive_problems,
    check_recorded,
    ensure_archive,
    fetch_archives,
    record_archives,
    record_first_use,
    resolve,
    tree_sha256,
    unpack,
)
from dmlbench.data.base import Archive, DatasetParams, DatasetSpec, UrlCheck
from dmlbench.errors import DataError
from dmlbench.io import atomic_dir, write_json

NAME = "cars196"
TRAIN_CLASSES = 98  # class ids 1..98 train, 99..196 test
NUM_CLASSES = 196
PUBLISHED_IMAGES = {"cars_train": 8_144, "cars_test": 8_041}  # 16,185 in all (torchvision's StanfordCars)
ANNOTATIONS = "cars_annos.mat"
DEVKIT_TABLE = "devkit_annotations.csv"  # the devkit layout's images and classes, written by fetch
LAYOUT_DIR = "stanford_cars"  # torchvision's folder name
LABEL_FILES = {"cars_train": "cars_train_annos.mat", "cars_test": "cars_test_annos_withlabels.mat"}
META = "cars_meta.mat"
DOCS = "docs/datasets.md#cars196-layouts"

# md5s: powerful-benchmarker (branch metric-learning) src/powerful_benchmarker/datasets/cars196.py.
# Both URLs are dead (pytorch/vision issues #7545, #7681): url=None.
STANFORD_HINT = f"a Stanford-release copy, or use another layout: {DOCS}"
IMAGES = Archive(
    key="images", filename="car_ims.tgz", url=None, md5="d5c8f0aa497503f355e17dc7886c3f14", how_to_get=STANFORD_HINT
)
ANNOTATIONS_FILE = Archive(
    key="annotations",
    filename=ANNOTATIONS,
    url=None,
    md5="b407c6086d669747186bd1d764ff9dbc",
    extract=False,
    how_to_get=STANFORD_HINT,
)
STANFORD = (IMAGES, ANNOTATIONS_FILE)
# The devkit layout: one archive (downloadable from a mirror set in params.yaml), or the pieces
# of the classification release (pytorch/vision#7545 re-uploads car_devkit.tgz), or the folder.
LAYOUT = Archive(key="stanford_cars", filename=f"{LAYOUT_DIR}.zip", url=None, md5=None, how_to_get=DOCS)
PIECES = tuple(
    Archive(key="", filename=name, url=None, md5=None, extract=not name.endswith(".mat"))
    for name in ("car_devkit.tgz", "cars_train.tgz", "cars_test.tgz", "cars_test_annos_withlabels.mat")
)


class Cars196Source(ArchiveSourceParams):
    images: ArchiveSource = ArchiveSource()
    annotations: ArchiveSource = ArchiveSource()
    stanford_cars: ArchiveSource = ArchiveSource()


class Cars196Params(DatasetParams):
    source: Cars196Source = Cars196Source()


def _devkit_inputs(dropbox: Path) -> list[Path]:
    """The devkit layout's files (and folder) present in the drop-box."""
    names = [LAYOUT.filename, LAYOUT_DIR, *(piece.filename for piece in PIECES)]
    return [dropbox / name for name in names if (dropbox / name).exists()]


def layout(source: Cars196Source, dropbox: Path) -> str | None:
    """``stanford`` or ``devkit``: which files this run uses (the Stanford ones when any is there), or None."""
    if any((dropbox / a.filename).exists() for a in STANFORD) or source.images.url or source.annotations.url:
        return "stanford"
    if _devkit_inputs(dropbox) or source.stanford_cars.url:
        return "devkit"
    return None


def nothing_there(dropbox: Path) -> str:
    return (
        f"{NAME}: place {LAYOUT.filename} (the Kaggle/torchvision layout) or car_ims.tgz + {ANNOTATIONS} "
        f"in {dropbox}/; no public download since 2023 ({DOCS})"
    )


def preflight(params: Cars196Params, dropbox: Path, unreachable: UrlCheck) -> list[str]:
    """The pre-flight lines: the chosen layout's files must be in ``dropbox`` or downloadable."""
    chosen = layout(params.source, dropbox)
    if chosen == "stanford":
        return archive_problems(NAME, STANFORD, params.source, dropbox, unreachable)
    if chosen == "devkit":
        return [] if _devkit_inputs(dropbox) else archive_problems(NAME, (LAYOUT,), params.source, dropbox, unreachable)
    return [nothing_there(dropbox)]


def fetch(params: Cars196Params, raw_dir: Path, dropbox: Path) -> None:
    """Unpack the Stanford files, or the Kaggle/torchvision layout (checked, tabled), into ``raw_dir``."""
    raw_dir, dropbox = Path(raw_dir), Path(dropbox)
    chosen = layout(params.source, dropbox)
    if chosen is None:
        raise DataError(nothing_there(dropbox))
    if chosen == "stanford":
        fetch_archives(NAME, STANFORD, params.source, raw_dir, dropbox)
        return
    unpacked = []
    if (dropbox / LAYOUT.filename).exists() or params.source.stanford_cars.url:
        (item,) = resolve((LAYOUT,), params.source)
        unpacked.append((item, *ensure_archive(NAME, item, dropbox)))
    for piece in PIECES:
        if (dropbox / piece.filename).exists():
            item = ResolvedArchive(piece, url=None, md5=None)
            unpacked.append((item, *ensure_archive(NAME, item, dropbox)))
    records = [record for _, _, record in unpacked]
    folder = dropbox / LAYOUT_DIR
    if folder.is_dir():
        records.append({"filename": f"{LAYOUT_DIR}/", "url": None, "md5": None, "sha256": tree_sha256(folder)})
        check_recorded(folder, records[-1]["sha256"])
    with atomic_dir(raw_dir) as tmp:
        for item, path, _ in unpacked:
            unpack(item, path, tmp)
        if folder.is_dir():
            shutil.copytree(folder, tmp / LAYOUT_DIR, copy_function=_link_or_copy, dirs_exist_ok=True)
        devkit_table(tmp).to_csv(tmp / DEVKIT_TABLE, index=False)
        write_json(tmp / ARCHIVES_RECORD, records)
    record_archives(NAME, unpacked)  # only now that the content proved good
    if folder.is_dir():
        record_first_use(NAME, folder, records[-1]["sha256"])


def _link_or_copy(source: str, target: str) -> None:
    """A hard link where the file system allows it (no second copy of 1.9 GB), else a copy."""
    try:
        os.link(source, target)
    except OSError:
        shutil.copy2(source, target)


# --------------------------------------------------------------------------- the devkit layout


def _missing(what: str) -> DataError:
    return DataError(
        f"{NAME}: no {what} in the Kaggle/torchvision files; the layout needs cars_train/, cars_test/, "
        f"devkit/{LABEL_FILES['cars_train']}, devkit/{META} and {LABEL_FILES['cars_test']} (see {DOCS})"
    )


def _hits(root: Path, name: str) -> list[Path]:
    """Everything called ``name`` at any depth under ``root`` (macOS resource forks left out)."""
    return sorted(p for p in root.rglob(name) if "__MACOSX" not in p.parts)


def _image_folder(root: Path, name: str) -> Path:
    """The one folder called ``name`` that holds .jpg files (Kaggle nests ``cars_train/cars_train/``)."""
    hits = [p for p in _hits(root, name) if p.is_dir() and any(c.suffix.lower() == ".jpg" for c in p.iterdir())]
    if not hits:
        raise _missing(f"{name}/ with .jpg files")
    if len(hits) > 1:
        shown = ", ".join(p.relative_to(root).as_posix() for p in hits[:2])
        raise DataError(f"{NAME}: {len(hits)} {name}/ folders in the Kaggle/torchvision files ({shown}); keep one")
    return hits[0]


def _load(path: Path, key: str, fields: tuple[str, ...] = ()) -> list:
    """Variable ``key`` of a .mat file (the ``fields`` of each struct, or each value); one line if it is not there."""
    from scipy.io import loadmat

    try:
        value = np.atleast_1d(loadmat(path, squeeze_me=True)[key])
        if fields:
            return list(zip(*(value[field].tolist() for field in fields), strict=True))
        return [str(item) for item in value]
    except Exception as exc:  # noqa: BLE001 - scipy raises many types for a wrong or corrupt file
        detail = f"no {key} with {', '.join(fields)}" if fields else f"no {key}"
        raise DataError(f"{NAME}: {path.name} has {detail} ({type(exc).__name__}: {exc})") from None


def _read_one(root: Path, name: str, key: str, fields: tuple[str, ...] = ()) -> list:
    """``key`` of the .mat file ``name``; several copies (the zip's and one beside it) must agree."""
    values = [(path, _load(path, key, fields)) for path in _hits(root, name) if path.is_file()]
    if not values:
        raise _missing(name)
    for path, value in values[1:]:
        if value != values[0][1]:
            shown = f"{values[0][0].relative_to(root).as_posix()}, {path.relative_to(root).as_posix()}"
            raise DataError(f"{NAME}: {name} differs between {shown}; keep one")
    return values[0][1]


def devkit_table(root: Path) -> pd.DataFrame:
    """``path,label,class_name`` of every image of the devkit layout under ``root``, checked
    against the published release: 196 classes, 8,144 + 8,041 images, each one present."""
    names = _read_one(root, META, "class_names")
    if len(names) != NUM_CLASSES:
        raise DataError(f"{NAME}: {META} names {len(names)} classes, the release has {NUM_CLASSES}")
    parts = []
    for folder, label_file in LABEL_FILES.items():
        annotations = _read_one(root, label_file, "annotations", ("fname", "class"))
        if len(annotations) != PUBLISHED_IMAGES[folder]:
            raise DataError(
                f"{NAME}: {label_file} lists {len(annotations):,} images, the published release has "
                f"{PUBLISHED_IMAGES[folder]:,} in {folder}/ (16,185 in all): another release or an incomplete copy"
            )
        prefix = _image_folder(root, folder).relative_to(root).as_posix()
        paths, labels = [f"{prefix}/{fname}" for fname, _ in annotations], [int(c) for _, c in annotations]
        parts.append(pd.DataFrame({"path": paths, "label": labels}))
    frame = pd.concat(parts, ignore_index=True)
    labels = set(frame["label"])
    if labels != set(range(1, NUM_CLASSES + 1)):
        raise DataError(
            f"{NAME}: the annotations have {len(labels)} classes (ids {min(labels)}-{max(labels)}), "
            f"the release has {NUM_CLASSES} (1-{NUM_CLASSES})"
        )
    missing = [path for path in frame["path"] if not (root / path).is_file()]
    if missing:
        raise DataError(
            f"{NAME}: {len(missing):,} listed image(s) are missing, e.g. {missing[0]} (the .mat files of some "
            f"Kaggle copies do not match their folders, OpenGVLab/CaFo#4; use car_devkit.tgz of pytorch/vision#7545)"
        )
    frame["class_name"] = [names[label - 1] for label in frame["label"]]
    return frame


def read_annotations(params: Cars196Params, raw_dir: Path) -> pd.DataFrame:
    """Every image with its class (``cars_annos.mat``, or the devkit layout's table); split by class id."""
    from scipy.io import loadmat

    raw_dir = Path(raw_dir)
    if (raw_dir / DEVKIT_TABLE).exists():
        frame = pd.read_csv(raw_dir / DEVKIT_TABLE, dtype={"path": str, "class_name": str}, keep_default_na=False)
    else:
        mat = loadmat(raw_dir / ANNOTATIONS, squeeze_me=True)
        annotations = np.atleast_1d(mat["annotations"])
        class_names = [str(name) for name in np.atleast_1d(mat["class_names"])]
        labels = np.array([int(c) for c in annotations["class"]])
        frame = pd.DataFrame(
            {
                "path": [str(p) for p in annotations["relative_im_path"]],
                "label": labels,
                "class_name": [class_names[c - 1] for c in labels],
            }
        )
    frame["split"] = np.where(frame["label"] <= TRAIN_CLASSES, "train", "test")
    return frame.sort_values(["label", "path"], kind="stable")


SPEC = DatasetSpec(
    name="cars196",  # a literal: tests/test_dvc_deps.py reads registry names from the source
    params=Cars196Params,
    fetch=fetch,
    read_annotations=read_annotations,
    description="CARS196 (Stanford Cars): 196 models, 16,185 images (classes 1-98 train, 99-196 test)",
    archives=(*STANFORD, LAYOUT, *PIECES),
    homepage="https://ai.stanford.edu/~jkrause/cars/car_dataset.html",
    preflight=preflight,
)
