"""What a dataset module declares: its parameters, its archives, how to fetch it (into ``raw_dir``) and
how to read its labels (``path,label,class_name,split``, ``split`` the official class-disjoint halves).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import pandas as pd
from pydantic import Field, NonNegativeInt, PositiveInt, model_validator

from dmlbench.errors import DataError
from dmlbench.schema import StrictModel

ANNOTATION_COLUMNS = ("path", "label", "class_name", "split")
OFFICIAL_SPLITS = ("train", "test", "query", "gallery")
CROSS_VALIDATION_SCHEMES = ("rc_cv", "kfold")
DEFAULT_NUM_FOLDS = {"rc_cv": 4, "kfold": 10}

UrlCheck = Callable[[str], str | None]  # why a URL cannot be downloaded now, or None (the pre-flight's probe)


class SplitConfig(StrictModel):
    """How validation classes are carved from the training classes (never from test classes): none
    (``standard``), a random (``fixed_val``, thesis §5.2) or the last (``last_val``, Berton et al. 2025)
    ``val_fraction``, or ``num_folds`` folds (``rc_cv``: powerful-benchmarker's ``MLRCSplitManager``;
    ``kfold``: thesis §5.1). docs/datasets.md, "Splits"."""

    scheme: Literal["standard", "fixed_val", "last_val", "rc_cv", "kfold"] = "fixed_val"
    val_fraction: float = Field(0.1, gt=0, lt=1)
    num_folds: int | None = Field(None, ge=2)
    seed: NonNegativeInt = 0

    @model_validator(mode="after")
    def _check(self) -> SplitConfig:
        if self.num_folds is not None and self.scheme not in CROSS_VALIDATION_SCHEMES:
            raise ValueError(
                f"num_folds applies to the schemes {', '.join(CROSS_VALIDATION_SCHEMES)}, not {self.scheme!r}"
            )
        return self

    @property
    def cross_validation(self) -> bool:
        return self.scheme in CROSS_VALIDATION_SCHEMES

    @property
    def folds(self) -> int:
        """Number of folds: ``num_folds`` or the scheme's default (0 for non-CV schemes)."""
        if not self.cross_validation:
            return 0
        return self.num_folds or DEFAULT_NUM_FOLDS[self.scheme]


class SourceParams(StrictModel):
    """What the download stage depends on (URL, md5, generator settings); modules subclass it."""


class DatasetParams(StrictModel):
    """Parameters every dataset has: ``source`` (what ``download`` depends on, written in params.yaml),
    ``image_size`` (short side ``S``, px; the long side is cropped to ``L = ceil(S * max_aspect)``),
    ``skip_corrupt`` (leave out unreadable or missing images, counted, instead of failing), ``split``."""

    source: SourceParams = SourceParams()
    image_size: PositiveInt = 256
    max_aspect: float = Field(4 / 3, ge=1, le=4)
    skip_corrupt: bool = False
    split: SplitConfig = SplitConfig()

    @model_validator(mode="before")
    @classmethod
    def _source_is_written(cls, data: Any) -> Any:
        if isinstance(data, dict) and "source" not in data:
            raise ValueError("source: required key is missing (DVC tracks it; write `source: {}` for the defaults)")
        return data

    @property
    def canvas_size(self) -> int:
        """Side ``L`` of the square canvas each prepared image sits in (top-left)."""
        return math.ceil(self.image_size * self.max_aspect - 1e-9)


@dataclass(frozen=True)
class Archive:
    """One file a dataset needs: ``key`` under ``datasets.<name>.source`` (empty: none); ``url`` (None:
    placed in ``data/`` by hand), then ``mirrors``; ``md5`` (None: sha256 recorded on first use);
    ``size`` in bytes; ``extract``: unpack tar/zip; ``how_to_get`` and ``encrypted_hint``: for the user."""

    key: str
    filename: str
    url: str | None
    md5: str | None
    size: int | None = None
    extract: bool = True
    how_to_get: str = ""
    mirrors: tuple[str, ...] = ()
    encrypted_hint: str = ""


@dataclass(frozen=True)
class Counts:
    """Images and classes, in all and per official split ``(split, images, classes)``; ``source``: of published ones."""

    images: int
    classes: int
    splits: tuple[tuple[str, int, int], ...]
    source: str = ""

    @classmethod
    def of(cls, frame: pd.DataFrame) -> Counts:
        """The counts of an annotation table (``label`` and official ``split`` columns)."""
        splits = tuple(
            (split, int((frame["split"] == split).sum()), int(frame.loc[frame["split"] == split, "label"].nunique()))
            for split in OFFICIAL_SPLITS
            if (frame["split"] == split).any()
        )
        return cls(int(len(frame)), int(frame["label"].nunique()), splits)

    def figures(self) -> dict[str, int]:
        """Every figure by name: ``images``, ``classes``, ``<split> images``, ``<split> classes``."""
        out = {"images": self.images, "classes": self.classes}
        for split, images, classes in self.splits:
            out[f"{split} images"], out[f"{split} classes"] = images, classes
        return out

    def within(self, published: Counts) -> bool:
        """Every figure at most the published one, and no split the release does not have."""
        limit = published.figures()
        return all(key in limit and value <= limit[key] for key, value in self.figures().items())

    def describe(self) -> str:
        """``11,788 images of 200 classes (train 5,864 / 100, test 5,924 / 100)``."""
        parts = ", ".join(f"{split} {images:,} / {classes:,}" for split, images, classes in self.splits)
        return f"{self.images:,} images of {self.classes:,} classes ({parts})"

    def as_dict(self) -> dict:
        return {"images": self.images, "classes": self.classes, "splits": {s: [i, c] for s, i, c in self.splits}}


@dataclass(frozen=True)
class DatasetSpec:
    """A registry entry. ``hflip_invariant``: may training flip images? ``query_gallery``: the test half
    is query + gallery (In-Shop); ``preflight``: the dataset's own ``(params, dropbox, unreachable) ->
    lines`` check (else every archive in ``data/`` or downloadable); ``archives_for``: the archives a run
    needs (None: all); ``counts``: the published figures; ``synthetic``: never beside real datasets;
    ``redistributable``: ``make publish`` allowed (docs/datasets.md, "Terms of use").
    """

    name: str
    params: type[DatasetParams]
    fetch: Callable[[DatasetParams, Path, Path], None]
    read_annotations: Callable[[DatasetParams, Path], pd.DataFrame]
    description: str
    hflip_invariant: bool = True
    query_gallery: bool = False
    archives: tuple[Archive, ...] = ()
    homepage: str = ""
    preflight: Callable[[DatasetParams, Path, UrlCheck], list[str]] | None = None
    archives_for: Callable[[DatasetParams, Path], tuple[Archive, ...]] | None = None
    counts: Counts | None = None
    synthetic: bool = False
    redistributable: bool = False


def read_table(root: Path, rel: str, columns: list[str] | None, expected: str, **options: Any) -> pd.DataFrame:
    """The table ``root/rel`` as strings, or a :class:`DataError` naming ``rel`` and ``expected``.
    ``columns``: names of a headerless table; None: the header line names them."""
    path = Path(root) / rel
    if not path.is_file():
        raise DataError(f"no {rel}; expected {expected}")
    options.setdefault("sep", r"\s+")
    try:  # index_col=False: a line with more fields than the header is an error, not an index
        return pd.read_csv(
            path,
            header=None if columns else "infer",
            names=columns,
            dtype=str,
            keep_default_na=False,
            index_col=False,
            **options,
        )
    except (ValueError, pd.errors.ParserError, pd.errors.EmptyDataError, UnicodeDecodeError) as exc:
        detail = " ".join(str(exc).split())[:160]
        raise DataError(f"{rel} is not {expected} ({type(exc).__name__}: {detail})") from None


def integer_column(table: pd.DataFrame, column: str, rel: str) -> pd.Series:
    """``table[column]`` as int64, or a one-line :class:`DataError` naming the first value that is not one."""
    values = pd.to_numeric(table[column], errors="coerce")
    bad = values.isna()
    if bad.any():
        raise DataError(
            f"{rel}: {column} {table[column][bad].iloc[0]!r} (row {int(bad.idxmax()) + 1}) is not an integer"
        )
    return values.astype("int64")


def check_annotations(frame: pd.DataFrame, dataset: str) -> pd.DataFrame:
    """Assert the annotation table has the documented columns, sane values and class-disjoint halves."""
    missing = [c for c in ANNOTATION_COLUMNS if c not in frame.columns]
    if missing:
        raise DataError(f"{dataset}: annotations lack columns {missing}")
    if frame.empty:
        raise DataError(f"{dataset}: the annotations list no images")
    bad = sorted(set(frame["split"]) - set(OFFICIAL_SPLITS))
    if bad:
        raise DataError(f"{dataset}: unknown official split values {bad}; allowed: {', '.join(OFFICIAL_SPLITS)}")
    duplicated = frame["path"][frame["path"].duplicated()]
    if len(duplicated):
        raise DataError(f"{dataset}: image {duplicated.iloc[0]!r} is listed twice")
    train = set(frame.loc[frame["split"] == "train", "label"])
    held_out = set(frame.loc[frame["split"] != "train", "label"])
    shared = sorted(train & held_out)
    if shared:
        raise DataError(f"{dataset}: class {shared[0]} is in the training half and in the test half")
    frame = frame.loc[:, list(ANNOTATION_COLUMNS)].reset_index(drop=True)
    frame["label"] = frame["label"].astype("int64")
    frame["class_name"] = frame["class_name"].astype(str)
    return frame
