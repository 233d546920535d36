"""Read a prepared dataset (see :mod:`dmlbench.data.prepare`) and slice it by split."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd

from dmlbench.data.prepare import IMAGES, INFO, MANIFEST
from dmlbench.errors import DataError
from dmlbench.io import read_json


@dataclass(frozen=True)
class SplitData:
    """Images (uint8 ``N x S x S x 3``) and integer class labels of one split."""

    name: str
    images: np.ndarray
    labels: np.ndarray

    def __len__(self) -> int:
        return len(self.labels)

    @property
    def num_classes(self) -> int:
        return int(len(np.unique(self.labels)))


@dataclass(frozen=True)
class PreparedDataset:
    name: str
    manifest: pd.DataFrame
    images: np.ndarray
    info: dict

    @classmethod
    def load(cls, directory: str | Path, in_memory: bool = True) -> "PreparedDataset":
        directory = Path(directory)
        if not (directory / MANIFEST).exists():
            raise DataError(f"{directory}: no prepared dataset here (run the prepare stage first)")
        manifest = pd.read_csv(directory / MANIFEST, keep_default_na=False)
        images = np.load(directory / IMAGES, mmap_mode=None if in_memory else "r")
        info = read_json(directory / INFO)
        if len(images) != len(manifest):
            raise DataError(f"{directory}: {len(images)} cached images but {len(manifest)} manifest rows")
        return cls(info["dataset"], manifest, images, info)

    def split(self, name: str) -> SplitData:
        """Rows whose ``split`` is ``name`` (empty if there are none)."""
        mask = (self.manifest["split"] == name).to_numpy()
        return SplitData(name, self.images[mask], self.manifest.loc[mask, "label"].to_numpy(np.int64))

    @property
    def image_size(self) -> int:
        return int(self.info["image_size"])
