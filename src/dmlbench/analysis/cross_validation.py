"""The report's cross-validation table: a cell trained with one model per fold, scored both ways the
two studies report it: the Reality Check's **concatenated** fold models (mean and t-interval over
seeds, the report's headline number), and the thesis's (Psomas 2020, Table 12) fold models scored
alone (mean +/- sample sd over folds x seeds), beside the thesis's ``cv10`` number where published.
"""

from __future__ import annotations

import math

import pandas as pd

from dmlbench.evaluate.combine import fold_spread
from dmlbench.evaluate.intervals import bounded_t_interval

METRIC = "precision_at_1"  # = R@1, what the thesis's Table 12 reports
CELL = ["dataset", "backbone", "loss", "dim"]


def fold_rows(runs_json: dict, cell: dict) -> list[dict]:
    """Long rows (cell, seed, fold, metric, value) of one ``runs.json`` (none for a cell without folds)."""
    rows = []
    for info in runs_json["runs"].values():
        for fold, metrics in (info.get("folds") or {}).items():
            for metric, value in metrics.items():
                rows.append({**cell, "seed": info["seed"], "fold": fold, "metric": metric, "value": value})
    return rows


def cross_validation_table(
    runs: pd.DataFrame, folds: pd.DataFrame, literature: pd.DataFrame, names: dict[str, str], confidence: float
) -> list[list[str]]:
    """One row per cross-validated cell: loss, dataset, dim, concatenated, fold models, thesis."""
    if folds.empty:
        return []
    published = literature[(literature["setting"] == "cv10") & (literature["metric"].isin(["recall_at_1", METRIC]))]
    rows = []
    for key, cell_folds in folds[folds["metric"] == METRIC].groupby(CELL, sort=False):
        cell = dict(zip(CELL, key, strict=True))
        seeds = runs[(runs[CELL] == pd.Series(cell)).all(axis=1) & (runs["metric"] == METRIC)]["value"]
        ensemble = bounded_t_interval(seeds.to_numpy(), confidence, 0.0, 1.0)
        spread = fold_spread([{METRIC: v} for v in cell_folds["value"]])[METRIC]
        thesis = published[
            (published["loss"] == cell["loss"])
            & (published["dataset"] == cell["dataset"])
            & (published["backbone"] == cell["backbone"])
            & (published["dim"] == cell["dim"])
        ]
        rows.append(
            [
                names.get(cell["loss"], cell["loss"]),
                f"`{cell['dataset']}` / `{cell['backbone']}`",
                str(cell["dim"]),
                _interval(ensemble.mean, ensemble.low, ensemble.high, ensemble.n),
                _spread(spread["mean"], spread["std"], spread["n"]),
                f"{thesis['value'].iloc[0]:.2f} (Table 12)" if len(thesis) else "-",
            ]
        )
    return rows


def _interval(mean: float, low: float, high: float, n: int) -> str:
    if n < 2 or math.isnan(low):
        return f"{100 * mean:.1f} (n={n} seed, no interval)"
    return f"{100 * mean:.1f} [{100 * low:.1f}, {100 * high:.1f}] (n={n} seeds)"


def _spread(mean: float, std: float, n: int) -> str:
    if math.isnan(std):
        return f"{100 * mean:.1f} (n={n} model)"
    return f"{100 * mean:.1f} ± {100 * std:.1f} sd (n={n} models)"
