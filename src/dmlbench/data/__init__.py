"""Datasets: a registry of dataset modules, splits, downloads, the prepared image cache and transforms.

Adding a dataset = one module with a :class:`~dmlbench.data.base.DatasetSpec` ``SPEC``, plus one entry below.
"""

from dmlbench.data import cars196, cub200, glyphs, inshop, sop
from dmlbench.data.base import DatasetParams, DatasetSpec, SourceParams, SplitConfig

DATASETS: dict[str, DatasetSpec] = {
    spec.name: spec for spec in (glyphs.SPEC, cub200.SPEC, cars196.SPEC, sop.SPEC, inshop.SPEC)
}

__all__ = ["DATASETS", "DatasetParams", "DatasetSpec", "SourceParams", "SplitConfig"]
