"""CARS196 / Stanford Cars (Krause et al., 3dRR 2013): 16,185 photos of 196 car models.

DML split: classes 1-98 train, 99-196 test, by the ``class`` field of ``cars_annos.mat``
(``annotations``: relative_im_path, bbox_x1..y2, class, test; ``class_names``), over all
images of ``car_ims.tgz``; the ``test`` flag (a classification split) is ignored.
No public download works: ``ai.stanford.edu/~jkrause`` and ``imagenet.stanford.edu`` have
returned 404 since 2023 (pytorch/vision#7545), so both files go into ``data/`` by hand.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd

from dmlbench.data.archives import ArchiveSource, ArchiveSourceParams, archive_fetcher
from dmlbench.data.base import Archive, DatasetParams, DatasetSpec

TRAIN_CLASSES = 98  # class ids 1..98 train, 99..196 test
ANNOTATIONS = "cars_annos.mat"

# md5s: powerful-benchmarker (branch metric-learning) src/powerful_benchmarker/datasets/cars196.py.
# Both URLs are dead (pytorch/vision issues #7545, #7681): url=None.
HOW_TO_GET = (
    "the original Stanford release (formerly ai.stanford.edu/~jkrause/car196/), e.g. from a colleague "
    "or a lab mirror; Kaggle re-uploads use other file layouts"
)
IMAGES = Archive(
    key="images", filename="car_ims.tgz", url=None, md5="d5c8f0aa497503f355e17dc7886c3f14", how_to_get=HOW_TO_GET
)
ANNOTATIONS_FILE = Archive(
    key="annotations",
    filename=ANNOTATIONS,
    url=None,
    md5="b407c6086d669747186bd1d764ff9dbc",
    extract=False,
    how_to_get=HOW_TO_GET,
)


class Cars196Source(ArchiveSourceParams):
    images: ArchiveSource = ArchiveSource()
    annotations: ArchiveSource = ArchiveSource()


class Cars196Params(DatasetParams):
    source: Cars196Source = Cars196Source()


def read_annotations(params: Cars196Params, raw_dir: Path) -> pd.DataFrame:
    """Every image of ``cars_annos.mat`` with its class; split by class id."""
    from scipy.io import loadmat

    mat = loadmat(Path(raw_dir) / ANNOTATIONS, squeeze_me=True)
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
    name="cars196",
    params=Cars196Params,
    fetch=archive_fetcher("cars196", (IMAGES, ANNOTATIONS_FILE)),
    read_annotations=read_annotations,
    description="CARS196 (Stanford Cars): 196 models, 16,185 images (classes 1-98 train, 99-196 test)",
    archives=(IMAGES, ANNOTATIONS_FILE),
    homepage="https://ai.stanford.edu/~jkrause/cars/car_dataset.html",
)
