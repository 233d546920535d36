"""Read a prepared dataset (:mod:`dmlbench.data.prepare`), memory-mapped, and slice it by split and fold
(``split("val", fold=f)``: the rows whose class validates in fold ``f``); a contiguous split is a
slice, any other a :class:`RowView` that gathers rows when a batch asks."""

from __future__ import annotations

import functools
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd

from dmlbench.data.prepare import IMAGES, INFO, MANIFEST, SIZES
from dmlbench.data.splits import parse_folds
from dmlbench.errors import DataError
from dmlbench.io import read_json


@dataclass(frozen=True)
class SplitData:
    """Images (uint8 ``N x L x L x 3`` canvases), integer class labels, and the valid
    ``(height, width)`` of each image in its canvas (``sizes``, int ``N x 2``; ``None`` = whole canvas)."""

    name: str
    images: np.ndarray | RowView
    labels: np.ndarray
    sizes: np.ndarray | None = None

    def __len__(self) -> int:
        return len(self.labels)

    @property
    def num_classes(self) -> int:
        return int(len(np.unique(self.labels)))


class RowView:
    """Rows ``rows`` (ascending) of ``base`` without copying: indexing gathers only the rows asked
    for; ``len``, ``shape``, ``dtype``, ``nbytes``, ``ndim`` as an array; ``np.asarray`` copies whole."""

    def __init__(self, base: np.ndarray | RowView, rows: np.ndarray):
        if isinstance(base, RowView):  # a view of a view indexes the base directly
            base, rows = base.base, base.rows[rows]
        self.base, self.rows = base, np.asarray(rows, dtype=np.int64)

    def __len__(self) -> int:
        return len(self.rows)

    @property
    def shape(self) -> tuple[int, ...]:
        return (len(self.rows), *self.base.shape[1:])

    @property
    def dtype(self) -> np.dtype:
        return self.base.dtype

    @property
    def ndim(self) -> int:
        return self.base.ndim

    @property
    def nbytes(self) -> int:
        return int(len(self.rows) * self.base[:1].nbytes) if len(self.base) else 0

    def __getitem__(self, key: int | slice | np.ndarray | list[int]) -> np.ndarray:
        return self.base[self.rows[key]]

    def __array__(self, dtype: np.dtype | None = None, copy: bool | None = None) -> np.ndarray:
        rows = self.base[self.rows]
        return rows if dtype is None else rows.astype(dtype)


def _contiguous(rows: np.ndarray) -> bool:
    """Whether ascending ``rows`` are one contiguous range (then a slice, a view, selects them)."""
    return bool(len(rows)) and rows[-1] - rows[0] + 1 == len(rows)


def _rows(array: np.ndarray, rows: np.ndarray) -> np.ndarray:
    """``array[rows]``: a view when they are contiguous, else a copy (for the small per-image tables)."""
    return array[rows[0] : rows[-1] + 1] if _contiguous(rows) else array[rows]


def _take(array: np.ndarray | RowView, rows: np.ndarray) -> np.ndarray | RowView:
    """``array``'s ``rows``: a view when contiguous, else a :class:`RowView`; never a copy."""
    if _contiguous(rows) and not isinstance(array, RowView):
        return array[rows[0] : rows[-1] + 1]
    return RowView(array, rows)


@dataclass(frozen=True)
class PreparedDataset:
    name: str
    manifest: pd.DataFrame
    images: np.ndarray | RowView
    info: dict
    sizes: np.ndarray | None = None

    @classmethod
    def load(cls, directory: str | Path, in_memory: bool = False) -> PreparedDataset:
        """The prepared dataset in ``directory``, memory-mapped (``in_memory``: read into memory)."""
        directory = Path(directory)
        if not (directory / MANIFEST).exists():
            raise DataError(f"{directory}: no prepared dataset here (run the prepare stage first)")
        manifest = pd.read_csv(directory / MANIFEST, keep_default_na=False, dtype={"fold": str, "class_name": str})
        images = np.load(directory / IMAGES, mmap_mode=None if in_memory else "r")
        sizes = np.load(directory / SIZES) if (directory / SIZES).exists() else None
        if sizes is not None and len(sizes) and (sizes == images.shape[1:3]).all():
            sizes = None  # every image fills its canvas: the same as no sizes (square fast path)
        info = read_json(directory / INFO)
        if len(images) != len(manifest) or (sizes is not None and len(sizes) != len(manifest)):
            raise DataError(f"{directory}: {len(images)} cached images but {len(manifest)} manifest rows")
        return cls(info["dataset"], manifest, images, info, sizes)

    @property
    def num_folds(self) -> int:
        """Cross-validation folds of the split scheme (0 for ``standard`` / ``fixed_val``)."""
        return int(self.info.get("num_folds", 0))

    @functools.cached_property
    def _fold_membership(self) -> np.ndarray:
        """Boolean ``rows x folds``: does the row's class validate in that fold?"""
        member = np.zeros((len(self.manifest), self.num_folds), dtype=bool)
        if self.num_folds and "fold" in self.manifest:
            for row, folds in enumerate(parse_folds(self.manifest["fold"])):
                member[row, list(folds)] = True
        return member

    def split(self, name: str, fold: int | None = None) -> SplitData:
        """Rows of split ``name`` (empty if none), restricted by ``fold`` on CV datasets (see module doc)."""
        is_split = (self.manifest["split"] == name).to_numpy()
        if fold is not None:
            if not self.num_folds:
                raise ValueError(f"{self.name}: fold={fold} given, but the split scheme has no folds")
            if not 0 <= fold < self.num_folds:
                raise ValueError(f"{self.name}: fold must be in 0..{self.num_folds - 1}, got {fold}")
            is_train = (self.manifest["split"] == "train").to_numpy()
            validates = self._fold_membership[:, fold]
            if name == "train":
                is_split = is_train & ~validates
            elif name == "val":
                is_split = is_train & validates
        rows = np.flatnonzero(is_split)
        labels = self.manifest["label"].to_numpy(np.int64)[rows]
        sizes = None if self.sizes is None else _rows(self.sizes, rows)
        return SplitData(name, _take(self.images, rows), labels, sizes)

    def training_half(self) -> PreparedDataset:
        """The rows of the training classes only (``train`` and ``val``): what tuning may read; no
        test-class image is in the result."""
        keep = self.manifest["split"].isin(["train", "val"]).to_numpy()
        rows = np.flatnonzero(keep)
        manifest = self.manifest.iloc[rows].reset_index(drop=True)
        sizes = None if self.sizes is None else self.sizes[rows]
        return PreparedDataset(self.name, manifest, RowView(self.images, rows), self.info, sizes)

    @property
    def image_size(self) -> int:
        """Short side ``S`` of the prepared images (px)."""
        return int(self.info["image_size"])

    @property
    def canvas_size(self) -> int:
        """Side ``L`` of the square canvases (px)."""
        return int(self.info.get("canvas_size", self.images.shape[1]))
