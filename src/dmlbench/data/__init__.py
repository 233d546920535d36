"""Datasets: a registry of dataset modules, splits, the prepared image cache and transforms.

Adding a dataset = one module declaring a :class:`~dmlbench.data.base.DatasetSpec` named
``SPEC`` plus one entry below.
"""

from dmlbench.data import glyphs
from dmlbench.data.base import DatasetParams, DatasetSpec, SourceParams, SplitConfig

DATASETS: dict[str, DatasetSpec] = {spec.name: spec for spec in (glyphs.SPEC,)}

__all__ = ["DATASETS", "DatasetParams", "DatasetSpec", "SourceParams", "SplitConfig"]
