"""What a dataset module declares: its parameters, how to fetch it, how to read its labels.

``fetch`` puts the dataset's files under ``raw_dir`` (downloading, extracting or generating);
``read_annotations`` lists every image as ``path,label,class_name,split`` with ``path``
relative to ``raw_dir`` and ``split`` the dataset's official class-disjoint split
(``train``/``test``, or ``train``/``query``/``gallery``). Validation classes are carved out
of ``train`` afterwards by :mod:`dmlbench.data.splits`, the same way for every dataset.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Literal

import pandas as pd
from pydantic import Field, NonNegativeInt, PositiveInt

from dmlbench.config import StrictModel

ANNOTATION_COLUMNS = ("path", "label", "class_name", "split")


class SplitConfig(StrictModel):
    """How validation classes are carved from the training classes (never from test classes).

    ``fixed_val``: a random ``val_fraction`` of the training classes, drawn with ``seed``
    (thesis §5: 90/10 was best). ``standard``: no validation split (what papers do; model
    selection then falls back to the last epoch, and the report says so).
    """

    scheme: Literal["fixed_val", "standard"] = "fixed_val"
    val_fraction: float = Field(0.1, gt=0, lt=1)
    seed: NonNegativeInt = 0


class SourceParams(StrictModel):
    """What the download stage depends on (URL, md5, generator settings); modules subclass it."""


class DatasetParams(StrictModel):
    """Parameters every dataset has.

    ``source``: what ``download`` depends on (so changing the split never re-downloads);
    ``image_size``: side of the prepared images in pixels; ``split``: validation carving.
    """

    source: SourceParams = SourceParams()
    image_size: PositiveInt = 256
    split: SplitConfig = SplitConfig()


@dataclass(frozen=True)
class DatasetSpec:
    """A registry entry. ``hflip_invariant``: may training flip images horizontally?"""

    name: str
    params: type[DatasetParams]
    fetch: Callable[[DatasetParams, Path, Path], None]
    read_annotations: Callable[[DatasetParams, Path], pd.DataFrame]
    description: str
    hflip_invariant: bool = True
    query_gallery: bool = False


def check_annotations(frame: pd.DataFrame, dataset: str) -> pd.DataFrame:
    """Assert the annotation table has the documented columns and sane values."""
    missing = [c for c in ANNOTATION_COLUMNS if c not in frame.columns]
    if missing:
        raise ValueError(f"{dataset}: annotations lack columns {missing}")
    bad = sorted(set(frame["split"]) - {"train", "test", "query", "gallery"})
    if bad:
        raise ValueError(f"{dataset}: unknown official split values {bad}")
    return frame.loc[:, list(ANNOTATION_COLUMNS)].reset_index(drop=True)
