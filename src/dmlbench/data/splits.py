"""Carve validation classes out of the training classes, deterministically from a seed.

Validation never contains test classes: only rows whose official split is ``train`` can
become ``val``, and a class is moved as a whole (class-disjoint).
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from dmlbench.data.base import SplitConfig


def assign_splits(frame: pd.DataFrame, config: SplitConfig) -> pd.Series:
    """Return the ``split`` column after applying ``config`` to the official split."""
    split = frame["split"].copy()
    if config.scheme == "standard":
        return split
    train_classes = np.sort(frame.loc[split == "train", "label"].unique())
    if len(train_classes) < 2:
        raise ValueError(f"need >= 2 training classes to carve a validation split, got {len(train_classes)}")
    n_val = min(max(1, int(round(config.val_fraction * len(train_classes)))), len(train_classes) - 1)
    rng = np.random.default_rng(config.seed)
    val_classes = rng.choice(train_classes, size=n_val, replace=False)
    split[(split == "train") & frame["label"].isin(val_classes)] = "val"
    return split


def split_summary(frame: pd.DataFrame) -> dict[str, dict[str, int]]:
    """``{split: {"images": n, "classes": c}}`` for the manifest's info file."""
    return {
        name: {"images": int(len(group)), "classes": int(group["label"].nunique())}
        for name, group in frame.groupby("split", sort=True)
    }
