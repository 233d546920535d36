"""Per-run records the report reads beside the test scores: how much picking the epoch on the test
set would have flattered each run (test-set feedback) and what each run cost to train."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd

from dmlbench.analysis.collect import Results


def feedback_bias(results: Results) -> pd.DataFrame:
    """Per run: test score of the best test epoch minus that of the epoch selected on validation.

    From ``run.json`` ``test_feedback`` when present, else from the ``test_feedback/<metric>``
    columns of ``history.json`` (the selection metric's). Empty when neither was recorded.
    """
    rows = []
    history = results.history
    for sel in results.selections.itertuples(index=False):
        cell = {"dataset": sel.dataset, "backbone": sel.backbone, "loss": sel.loss, "dim": sel.dim, "seed": sel.seed}
        if sel.tf_best_value is not None and not pd.isna(sel.tf_best_value):
            rows.append(
                {
                    **cell,
                    "metric": sel.tf_metric,
                    "best_epoch": sel.tf_best_epoch,
                    "best_value": sel.tf_best_value,
                    "selected_epoch": sel.selected_epoch,
                    "selected_value": sel.tf_selected_value,
                }
            )
            continue
        metric = sel.selection_metric or "map_at_r"
        column = f"test_feedback/{metric}"
        if column not in history.columns:
            continue
        mask: np.ndarray = np.ones(len(history), dtype=bool)
        for key, value in cell.items():
            mask &= (history[key] == value).to_numpy()
        if not pd.isna(sel.fold):  # one fold model of a cross-validation run
            mask &= (history["fold"] == sel.fold).to_numpy()
        curve = history.loc[mask, ["epoch", column]].dropna()
        if curve.empty:
            continue
        best = curve.loc[curve[column].idxmax()]
        at_selected = curve.loc[curve["epoch"] == sel.selected_epoch, column]
        if at_selected.empty:
            continue
        rows.append(
            {
                **cell,
                "metric": metric,
                "best_epoch": int(best["epoch"]),
                "best_value": float(best[column]),
                "selected_epoch": sel.selected_epoch,
                "selected_value": float(at_selected.iloc[0]),
            }
        )
    frame = pd.DataFrame(rows)
    if len(frame):
        frame["bias"] = frame["best_value"] - frame["selected_value"]
    return frame


def run_costs(results: Results) -> pd.DataFrame:
    """Per run: training seconds (sum over epochs), mean training images/s, epochs, device."""
    history = results.history
    keys = ["dataset", "backbone", "loss", "dim", "seed"]
    seconds_column = "train/epoch_seconds" if "train/epoch_seconds" in history.columns else None
    rows = []
    for key, group in history.groupby(keys, sort=False):
        rows.append(
            {
                **dict(zip(keys, key, strict=True)),
                "train_seconds": float(group[seconds_column].sum()) if seconds_column else math.nan,
                "images_per_second": float(group["train/images_per_second"].mean())
                if "train/images_per_second" in group.columns
                else math.nan,
                "epochs": int(group["epoch"].max()),
            }
        )
    costs = pd.DataFrame(rows)
    devices = results.selections[keys + ["device"]].drop_duplicates(subset=keys)  # folds share a device
    return costs.merge(devices, on=keys, how="left").fillna({"device": "unknown device"})
