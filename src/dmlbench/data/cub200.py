"""CUB-200-2011 (Wah et al., Caltech 2011): 11,788 photos of 200 bird species.

DML split (Oh Song et al. 2016 and every DML paper since): classes 1-100 train, 101-200 test, not
``train_test_split.txt`` (an image-level classification split with shared classes).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd

from dmlbench.data.archives import ArchiveSource, ArchiveSourceParams, archive_fetcher
from dmlbench.data.base import Archive, Counts, DatasetParams, DatasetSpec, integer_column, read_table
from dmlbench.errors import DataError

ROOT = "CUB_200_2011"
TRAIN_CLASSES = 100  # class ids 1..100 train, 101..200 test
LAYOUT = f"the CUB_200_2011.tgz layout: {ROOT}/images.txt, image_class_labels.txt, classes.txt and images/"
# 11,788 images of 200 classes: the dataset's README and tech report (Wah et al. 2011, CNS-TR-2011-001);
# the DML halves, 5,864 / 5,924 images: Oh Song et al., CVPR 2016, section 6 ("Experiments").
COUNTS = Counts(
    11_788, 200, (("train", 5_864, 100), ("test", 5_924, 100)), source="Wah et al. 2011; Oh Song et al. 2016"
)

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


def _table(raw_dir: Path, name: str, columns: list[str]) -> pd.DataFrame:
    rel = f"{ROOT}/{name}"
    table = read_table(raw_dir, rel, columns, f"{LAYOUT} ({name}: {' '.join(f'<{c}>' for c in columns)})")
    if (table == "").any().any():  # a short line (read_table refuses a long one)
        raise DataError(f"{rel}: expected {len(columns)} columns ({' '.join(columns)}) on every line")
    return table


def read_annotations(params: Cub200Params, raw_dir: Path) -> pd.DataFrame:
    """``images.txt`` + ``image_class_labels.txt`` + ``classes.txt``; split by class id."""
    images = _table(raw_dir, "images.txt", ["image_id", "path"])
    labels = _table(raw_dir, "image_class_labels.txt", ["image_id", "label"])
    classes = _table(raw_dir, "classes.txt", ["label", "class_name"])
    for table, name, key in ((images, "images.txt", "image_id"), (labels, "image_class_labels.txt", "image_id")):
        if table[key].duplicated().any():
            raise DataError(f"{ROOT}/{name}: image id {table[key][table[key].duplicated()].iloc[0]} is listed twice")
    if classes["label"].duplicated().any():
        raise DataError(f"{ROOT}/classes.txt: class id {classes['label'][classes['label'].duplicated()].iloc[0]} twice")
    frame = images.merge(labels, on="image_id", how="left").merge(classes, on="label", how="left")
    unlabelled = frame["label"].isna() | frame["class_name"].isna()
    if unlabelled.any():
        row = frame[unlabelled].iloc[0]
        raise DataError(
            f"{ROOT}/images.txt: image {row['image_id']} has no class in image_class_labels.txt + classes.txt "
            f"({int(unlabelled.sum()):,} such images)"
        )
    frame["label"] = integer_column(frame, "label", f"{ROOT}/image_class_labels.txt")
    frame["path"] = f"{ROOT}/images/" + frame["path"]
    frame["split"] = np.where(frame["label"] <= TRAIN_CLASSES, "train", "test")
    return frame.sort_values(["label", "path"], kind="stable")


SPEC = DatasetSpec(
    name="cub200",
    params=Cub200Params,
    fetch=archive_fetcher("cub200", (ARCHIVE,), read_annotations, COUNTS),
    read_annotations=read_annotations,
    description="CUB-200-2011 birds: 200 species, 11,788 images (classes 1-100 train, 101-200 test)",
    archives=(ARCHIVE,),
    homepage="https://www.vision.caltech.edu/datasets/cub_200_2011/",
    counts=COUNTS,
)
