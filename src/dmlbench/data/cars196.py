"""CARS196 / Stanford Cars (Krause et al., 3dRR 2013): 16,185 photos of 196 car models; DML split:
classes 1-98 train, 99-196 test. Stanford's URLs are 404 since 2023 (pytorch/vision#7545): files go
into ``data/`` by hand in one of the layouts ``stanford``, ``devkit``, ``folders``
(docs/datasets.md#cars196-layouts, :mod:`dmlbench.data.cars_layouts`)."""

from __future__ import annotations

import os
import shutil
import sys
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
from dmlbench.data.base import Archive, Counts, DatasetParams, DatasetSpec, UrlCheck
from dmlbench.data.cars_layouts import devkit_table, folders_table, unpack_nested_devkit
from dmlbench.data.content import content_check
from dmlbench.errors import DataError
from dmlbench.io import atomic_dir, write_json

NAME = "cars196"
TRAIN_CLASSES = 98  # class ids 1..98 train, 99..196 test
ANNOTATIONS = "cars_annos.mat"
TABLE = "image_table.csv"  # the devkit / folders layout's images and classes, written by fetch
LAYOUT_DIR = "stanford_cars"  # torchvision's folder name
DOCS = "docs/datasets.md#cars196-layouts"
# 16,185 images of 196 classes: Krause et al. 2013 (the dataset page; torchvision's StanfordCars);
# the DML halves, 8,054 / 8,131 images: Oh Song et al., CVPR 2016, section 6 ("Experiments").
COUNTS = Counts(
    16_185, 196, (("train", 8_054, 98), ("test", 8_131, 98)), source="Krause et al. 2013; Oh Song et al. 2016"
)
# An image listed but absent: the usual cause on this dataset.
MISSING_HINT = (
    " (the .mat files of some Kaggle copies do not match their folders, OpenGVLab/CaFo#4; car_devkit.tgz of "
    "pytorch/vision#7545 matches them)"
)

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
# The devkit layout: one archive (downloadable from a mirror set in params.yaml), Kaggle's
# downloads, the pieces of the classification release, or the folder.
LAYOUT = Archive(key="stanford_cars", filename=f"{LAYOUT_DIR}.zip", url=None, md5=None, how_to_get=DOCS)
PIECES = tuple(
    Archive(key="", filename=name, url=None, md5=None, extract=not name.endswith(".mat"))
    for name in (
        "stanford-cars-dataset.zip",  # Kaggle jessicali9530/stanford-cars-dataset (the Kaggle CLI's name)
        "standford-cars-dataset-meta.zip",  # Kaggle abdelrahmant11/standford-cars-dataset-meta
        "car_devkit.tgz",
        "cars_train.tgz",
        "cars_test.tgz",
        "cars_test_annos_withlabels.mat",
        "cars_test_annos_withlabels (1).mat",  # its name in Kaggle's meta download
    )
)
# Kaggle jutrera/stanford-car-dataset-by-classes-folder: the CLI's name, and PML's (no extension).
FOLDERS_NAME = "stanford-car-dataset-by-classes-folder"
FOLDERS = tuple(Archive(key="", filename=name, url=None, md5=None) for name in (f"{FOLDERS_NAME}.zip", FOLDERS_NAME))
LAYOUTS = ("stanford", "devkit", "folders")  # the precedence


class Cars196Source(ArchiveSourceParams):
    images: ArchiveSource = ArchiveSource()
    annotations: ArchiveSource = ArchiveSource()
    stanford_cars: ArchiveSource = ArchiveSource()


class Cars196Params(DatasetParams):
    source: Cars196Source = Cars196Source()


def _present(dropbox: Path, archives: tuple[Archive, ...], folder: str = "") -> list[str]:
    """The files of ``archives`` in ``dropbox``, and ``folder/`` if that folder is there."""
    names = [a.filename for a in archives if (dropbox / a.filename).is_file()]
    return names + ([f"{folder}/"] if folder and (dropbox / folder).is_dir() else [])


def layout_files(source: Cars196Source, dropbox: Path) -> dict[str, list[str]]:
    """The files of each layout in ``dropbox`` (a URL set in params.yaml counts as its file)."""
    return {
        "stanford": _present(dropbox, STANFORD)
        + [a.filename for a in STANFORD if getattr(source, a.key).url and not (dropbox / a.filename).exists()],
        "devkit": _present(dropbox, (LAYOUT, *PIECES), LAYOUT_DIR)
        + ([LAYOUT.filename] if source.stanford_cars.url and not (dropbox / LAYOUT.filename).exists() else []),
        "folders": _present(dropbox, FOLDERS[:1]) + _present(dropbox, FOLDERS[1:], FOLDERS_NAME),
    }


def choose_layout(source: Cars196Source, dropbox: Path) -> tuple[str | None, str]:
    """The layout this run uses (None: none) and a line naming the files it ignores (or ""):
    Stanford when ``car_ims.tgz`` is there, a Stanford URL is set, or its files are alone; else devkit, folders."""
    files = layout_files(source, Path(dropbox))
    stanford = files["stanford"]
    if IMAGES.filename in stanford or source.images.url or source.annotations.url:
        chosen = "stanford"
    else:
        chosen = next((name for name in LAYOUTS[1:] if files[name]), "stanford" if stanford else None)
    ignored = [name for layout in LAYOUTS if layout != chosen for name in files[layout]]
    if chosen is None or not ignored:
        return chosen, ""
    why = " (the Stanford layout needs car_ims.tgz beside it)" if ignored == [ANNOTATIONS] else ""
    note = (
        f"{NAME}: using the {chosen} layout ({', '.join(files[chosen])}); ignored in {dropbox}/: "
        f"{', '.join(ignored)}{why} (precedence: {DOCS})"
    )
    return chosen, note


def nothing_there(dropbox: Path) -> str:
    return (
        f"{NAME}: no Cars196 files in {dropbox}/ (no public download since 2023): place those of one route of "
        f"{DOCS} there, e.g. car_ims.tgz + {ANNOTATIONS}, or Kaggle's stanford-cars-dataset.zip + "
        "standford-cars-dataset-meta.zip"
    )


def archives_for(params: Cars196Params, dropbox: Path) -> tuple[Archive, ...]:
    """The archives of the chosen layout (what ``make fetch`` verifies or downloads)."""
    chosen, _ = choose_layout(params.source, Path(dropbox))
    if chosen == "folders":
        return tuple(a for a in FOLDERS if (Path(dropbox) / a.filename).is_file())
    return {"stanford": STANFORD, "devkit": (LAYOUT, *PIECES)}.get(chosen or "", ())


def preflight(params: Cars196Params, dropbox: Path, unreachable: UrlCheck) -> list[str]:
    """The pre-flight lines: the chosen layout's files must be in ``dropbox`` or downloadable."""
    chosen, _ = choose_layout(params.source, dropbox)
    if chosen == "stanford":
        return archive_problems(NAME, STANFORD, params.source, dropbox, unreachable)
    if chosen == "devkit" and not _present(dropbox, (LAYOUT, *PIECES), LAYOUT_DIR):
        return archive_problems(NAME, (LAYOUT,), params.source, dropbox, unreachable)
    return [] if chosen else [nothing_there(dropbox)]


def fetch(params: Cars196Params, raw_dir: Path, dropbox: Path) -> None:
    """Unpack the chosen layout's files into ``raw_dir``, checked (and tabled, for devkit / folders)."""
    raw_dir, dropbox = Path(raw_dir), Path(dropbox)
    chosen, note = choose_layout(params.source, dropbox)
    if chosen is None:
        raise DataError(nothing_there(dropbox))
    if note:
        print(note, file=sys.stderr)
    check = content_check(NAME, read_annotations, COUNTS, params, MISSING_HINT)
    if chosen == "stanford":
        fetch_archives(NAME, STANFORD, params.source, raw_dir, dropbox, check)
        return
    unpacked = []
    if chosen == "devkit" and ((dropbox / LAYOUT.filename).exists() or params.source.stanford_cars.url):
        (item,) = resolve((LAYOUT,), params.source)
        unpacked.append((item, *ensure_archive(NAME, item, dropbox)))
    for piece in PIECES if chosen == "devkit" else FOLDERS:
        if (dropbox / piece.filename).is_file():
            item = ResolvedArchive(piece, url=None, md5=None)
            unpacked.append((item, *ensure_archive(NAME, item, dropbox)))
    records = [record for _, _, record in unpacked]
    folders = [dropbox / name for name in ((LAYOUT_DIR,) if chosen == "devkit" else (FOLDERS_NAME,))]
    folders = [folder for folder in folders if folder.is_dir()]
    for folder in folders:
        records.append({"filename": f"{folder.name}/", "url": None, "md5": None, "sha256": tree_sha256(folder)})
        check_recorded(folder, records[-1]["sha256"])
    names = " + ".join([r["filename"] for r in records])
    with atomic_dir(raw_dir) as tmp:
        for item, path, _ in unpacked:
            unpack(item, path, tmp)
        for folder in folders:
            shutil.copytree(folder, tmp / folder.name, copy_function=_link_or_copy, dirs_exist_ok=True)
        try:
            if chosen == "devkit":
                unpack_nested_devkit(tmp)
            table = devkit_table(tmp) if chosen == "devkit" else folders_table(tmp)
        except DataError as exc:
            raise DataError(f"{NAME}: {names}: {exc}") from None
        table.to_csv(tmp / TABLE, index=False)
        found = check(tmp, names)  # a refused copy leaves no raw_dir and no record
        write_json(tmp / ARCHIVES_RECORD, records)
    if found.get("missing"):
        return
    record_archives(NAME, unpacked)  # only now that the content proved good
    for folder, record in zip(folders, records[len(unpacked) :], strict=True):
        record_first_use(NAME, folder, record["sha256"])


def _link_or_copy(source: str, target: str) -> None:
    """A hard link where the file system allows it (no second copy of 1.9 GB), else a copy."""
    try:
        os.link(source, target)
    except OSError:
        shutil.copy2(source, target)


def read_annotations(params: Cars196Params, raw_dir: Path) -> pd.DataFrame:
    """Every image with its class (``cars_annos.mat``, or the devkit / folders table); split by class id."""
    from scipy.io import loadmat

    raw_dir = Path(raw_dir)
    if (raw_dir / TABLE).exists():
        frame = pd.read_csv(raw_dir / TABLE, dtype={"path": str, "class_name": str}, keep_default_na=False)
    elif not (raw_dir / ANNOTATIONS).is_file():
        raise DataError(f"no {ANNOTATIONS} and no {TABLE}; expected the files one of the layouts unpacks ({DOCS})")
    else:
        try:
            mat = loadmat(raw_dir / ANNOTATIONS, squeeze_me=True)
            annotations = np.atleast_1d(mat["annotations"])
            class_names = [str(name) for name in np.atleast_1d(mat["class_names"])]
            paths, labels = annotations["relative_im_path"], np.array([int(c) for c in annotations["class"]])
        except Exception as exc:  # noqa: BLE001 - scipy / numpy raise many types for a wrong file
            raise DataError(
                f"{ANNOTATIONS} is not the Stanford release's (annotations with relative_im_path and class, "
                f"class_names): {type(exc).__name__}: {' '.join(str(exc).split())[:120]}"
            ) from None
        if labels.min() < 1 or labels.max() > len(class_names):
            raise DataError(f"{ANNOTATIONS}: class ids {labels.min()}-{labels.max()}, {len(class_names)} class names")
        frame = pd.DataFrame(
            {
                "path": [str(p) for p in paths],
                "label": labels,
                "class_name": [class_names[c - 1] for c in labels],
            }
        )
    frame["split"] = np.where(frame["label"] <= TRAIN_CLASSES, "train", "test")
    return frame.sort_values(["label", "path"], kind="stable")


SPEC = DatasetSpec(
    name="cars196",
    params=Cars196Params,
    fetch=fetch,
    read_annotations=read_annotations,
    description="CARS196 (Stanford Cars): 196 models, 16,185 images (classes 1-98 train, 99-196 test)",
    archives=(*STANFORD, LAYOUT, *PIECES, *FOLDERS),
    homepage="https://ai.stanford.edu/~jkrause/cars/car_dataset.html",
    preflight=preflight,
    archives_for=archives_for,
    counts=COUNTS,
)
