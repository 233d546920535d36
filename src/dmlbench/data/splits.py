"""Carve validation classes (or folds) out of the training classes, deterministically, whole classes
(schemes: :class:`dmlbench.data.base.SplitConfig`, docs/datasets.md "Splits"). ``last_val``: Berton,
Musgrave & Masone 2025, gmberton/image-retrieval ``split_dataset_by_classes``. CV rows stay ``train``;
``fold`` lists (``;``) the folds in which the row's class validates.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import pandas as pd

from dmlbench.data.base import SplitConfig
from dmlbench.errors import DataError

FOLD_SEPARATOR = ";"


def fixed_val_classes(train_classes: np.ndarray, config: SplitConfig) -> list[np.ndarray]:
    count = len(train_classes)
    if count < 2:
        raise DataError(f"fixed_val needs >= 2 training classes, got {count}")
    n_val = min(max(1, int(round(config.val_fraction * count))), count - 1)
    rng = np.random.default_rng(config.seed)
    return [np.sort(rng.choice(train_classes, size=n_val, replace=False))]


def last_val_classes(train_classes: np.ndarray, config: SplitConfig) -> list[np.ndarray]:
    count = len(train_classes)
    if count < 2:
        raise DataError(f"last_val needs >= 2 training classes, got {count}")
    cut = min(max(1, int(count * (1 - config.val_fraction))), count - 1)
    return [train_classes[cut:]]


def rc_cv_classes(train_classes: np.ndarray, config: SplitConfig) -> list[np.ndarray]:
    """powerful-benchmarker's ``MLRCSplitManager`` (branch metric-learning) on ``N = 2T`` classes:
    ``val = int(N * (1/k) * 0.5)``; partition ``p`` starts at ``int(p/k * T)``, ``T - val`` train then
    ``val`` validation classes, wrapping. Cars (T=98): classes 24 and 73 never validate."""
    folds, count = config.folds, len(train_classes)
    if count < folds:
        raise DataError(f"rc_cv with {folds} folds needs >= {folds} training classes, got {count}")
    val_length = int(2 * count * ((1.0 / folds) * (1 - 0.5)))
    train_length = count - val_length
    blocks = []
    for partition in range(folds):
        start = int((float(partition) / folds) * count)
        blocks.append(train_classes[(start + train_length + np.arange(val_length)) % count])
    return blocks


def kfold_classes(train_classes: np.ndarray, config: SplitConfig) -> list[np.ndarray]:
    folds, count = config.folds, len(train_classes)
    if count < folds:
        raise DataError(f"kfold with {folds} folds needs >= {folds} training classes, got {count}")
    order = np.random.default_rng(config.seed).permutation(count)
    return [np.sort(train_classes[part]) for part in np.array_split(order, folds)]


SCHEMES: dict[str, Callable[[np.ndarray, SplitConfig], list[np.ndarray]]] = {
    "standard": lambda train_classes, config: [],
    "fixed_val": fixed_val_classes,
    "last_val": last_val_classes,
    "rc_cv": rc_cv_classes,
    "kfold": kfold_classes,
}


def assign_splits(frame: pd.DataFrame, config: SplitConfig) -> pd.DataFrame:
    """Columns ``split`` and ``fold`` after applying ``config`` to the official ``split`` of ``frame``."""
    split = frame["split"].astype(str).copy()
    fold = pd.Series("", index=frame.index, dtype=object)
    is_train = split == "train"
    train_classes = np.sort(frame.loc[is_train, "label"].unique())
    val_sets = SCHEMES[config.scheme](train_classes, config)
    if config.cross_validation:
        memberships: dict[int, list[str]] = {}
        for index, classes in enumerate(val_sets):
            for label in classes.tolist():
                memberships.setdefault(label, []).append(str(index))
        names = {label: FOLD_SEPARATOR.join(folds) for label, folds in memberships.items()}
        fold[is_train] = frame.loc[is_train, "label"].map(names).fillna("")
    elif val_sets:
        split[is_train & frame["label"].isin(val_sets[0])] = "val"
    leaked = set(frame.loc[~is_train, "label"]) & {c for classes in val_sets for c in classes.tolist()}
    if leaked:  # impossible by construction; checked because results would silently be invalid
        raise DataError(f"split {config.scheme}: validation classes {sorted(leaked)[:5]} are test classes")
    return pd.DataFrame({"split": split, "fold": fold}, index=frame.index)


def parse_folds(column: pd.Series) -> list[set[int]]:
    """The ``fold`` column as sets of fold indices ('' -> empty set)."""
    return [{int(x) for x in value.split(FOLD_SEPARATOR)} if value else set() for value in column.astype(str)]


def split_summary(frame: pd.DataFrame) -> dict[str, dict[str, int]]:
    """``{split: {"images": n, "classes": c}}`` for the manifest's info file."""
    return {
        name: {"images": int(len(group)), "classes": int(group["label"].nunique())}
        for name, group in frame.groupby("split", sort=True)
    }


def fold_summary(frame: pd.DataFrame, num_folds: int) -> list[dict[str, dict[str, int]]]:
    """Per fold: images and classes of its training and validation sets."""
    train = frame[frame["split"] == "train"]
    folds = parse_folds(train["fold"])
    summary = []
    for index in range(num_folds):
        is_val = np.array([index in f for f in folds], dtype=bool)
        parts = {"train": train[~is_val], "val": train[is_val]}
        summary.append(
            {name: {"images": int(len(p)), "classes": int(p["label"].nunique())} for name, p in parts.items()}
        )
    return summary
