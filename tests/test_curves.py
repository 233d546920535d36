"""The per-epoch curves behind `dvc plots show`: seed means per loss and epoch, one file per experiment."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from dmlbench.analysis.curves import curve_tables, write_curves


def _history() -> pd.DataFrame:
    rows = []
    for dim in (32, 64):
        for loss, base in (("contrastive", 0.2), ("triplet", 0.1)):
            for seed in (0, 1):
                for epoch in (1, 2):
                    rows.append(
                        {"dataset": "glyphs", "backbone": "tiny_cnn", "loss": loss, "dim": dim, "seed": seed,
                         "fold": np.nan, "epoch": epoch, "train/loss": 1.0 / epoch + seed,
                         "val/map_at_r": base + 0.1 * epoch + 0.02 * seed + dim / 1000}
                    )  # fmt: skip
    return pd.DataFrame(rows)


def test_curves_are_seed_means_per_loss_and_epoch_in_percent():
    tables = curve_tables(_history(), "map_at_r", {"contrastive": "Contrastive", "triplet": "Triplet"})
    assert list(tables) == ["glyphs-tiny_cnn-32", "glyphs-tiny_cnn-64"]
    table = tables["glyphs-tiny_cnn-32"]
    assert list(table.columns) == ["epoch", "loss", "validation", "train_loss"]
    assert table[["epoch", "loss"]].values.tolist() == [
        [1, "Contrastive"],
        [2, "Contrastive"],
        [1, "Triplet"],
        [2, "Triplet"],
    ]
    # contrastive, epoch 2: mean over seeds of 0.2 + 0.2 + {0, 0.02} + 0.032 = 0.442 -> 44.2 %
    assert table["validation"].tolist() == pytest.approx([34.2, 44.2, 24.2, 34.2])
    assert table["train_loss"].tolist() == pytest.approx([1.5, 1.0, 1.5, 1.0])


def test_curves_without_validation_keep_the_training_loss(tmp_path):
    history = _history().drop(columns="val/map_at_r")
    written = write_curves(history, "map_at_r", {"contrastive": "C", "triplet": "T"}, tmp_path)
    assert [p.name for p in written] == ["glyphs-tiny_cnn-32.csv", "glyphs-tiny_cnn-64.csv"]
    lines = written[0].read_text().splitlines()
    assert lines[:2] == ["epoch,loss,validation,train_loss", "1,C,,1.5000"]
