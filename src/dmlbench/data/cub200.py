"""CUB-200-2011 (Wah et al., Caltech 2011): 11,788 photos of 200 bird species.

DML split (Oh Song et al. 2016, the Reality Check, Proxy-Anchor, Roth et al.): classes 1-100
train (5,864 images), 101-200 test (5,924 images), by the class ids of ``classes.txt``; *not*
``train_test_split.txt``, which is an image-level classification split with shared classes.
Some images are grayscale (prepare converts them to RGB).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd

from dmlbench.data.archives import ArchiveSource, ArchiveSourceParams, archive_fetcher
from dmlbench.data.base import Archive, DatasetParams, DatasetSpec

ROOT = "CUB_200_2011"
TRAIN_CLASSES = 100  # class ids 1..100 train, 101..200 test

# URL: the CaltechDATA record that replaced the dead vision.caltech.edu link (pytorch-metric-learning
# src/pytorch_metric_learning/datasets/cub.py; lenscloth/RKD issue #24); md5: powerful-benchmarker
# (branch metric-learning) src/powerful_benchmarker/datasets/cub200.py; size: TensorFlow Datasets
# url_checksums/caltech_birds2011.txt.
ARCHIVE = Archive(
    key="archive",
    filename="CUB_200_2011.tgz",
    url="https://data.caltech.edu/records/65de6-vp158/files/CUB_200_2011.tgz",
    md5="97eceeb196236b17998738112f37df78",
    size=1_150_585_339,
    how_to_get="https://www.vision.caltech.edu/datasets/cub_200_2011/",
)


class Cub200Source(ArchiveSourceParams):
    archive: ArchiveSource = ArchiveSource()


class Cub200Params(DatasetParams):
    source: Cub200Source = Cub200Source()


def _table(path: Path, columns: list[str]) -> pd.DataFrame:
    return pd.read_csv(path, sep=r"\s+", header=None, names=columns, dtype=str, keep_default_na=False)


def read_annotations(params: Cub200Params, raw_dir: Path) -> pd.DataFrame:
    """``images.txt`` + ``image_class_labels.txt`` + ``classes.txt``; split by class id."""
    root = Path(raw_dir) / ROOT
    images = _table(root / "images.txt", ["image_id", "path"])
    labels = _table(root / "image_class_labels.txt", ["image_id", "label"])
    classes = _table(root / "classes.txt", ["label", "class_name"])
    frame = images.merge(labels, on="image_id", validate="one_to_one").merge(
        classes, on="label", validate="many_to_one"
    )
    frame["label"] = frame["label"].astype(int)
    frame["path"] = f"{ROOT}/images/" + frame["path"]
    frame["split"] = np.where(frame["label"] <= TRAIN_CLASSES, "train", "test")
    return frame.sort_values(["label", "path"], kind="stable")


SPEC = DatasetSpec(
    name="cub200",
    params=Cub200Params,
    fetch=archive_fetcher("cub200", (ARCHIVE,)),
    read_annotations=read_annotations,
    description="CUB-200-2011 birds: 200 species, 11,788 images (classes 1-100 train, 101-200 test)",
    archives=(ARCHIVE,),
    homepage="https://www.vision.caltech.edu/datasets/cub_200_2011/",
)
