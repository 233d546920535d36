"""Figures of the report's "Results" section: test metrics and Recall@K per loss."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pandas as pd
import seaborn as sns

from dmlbench.analysis.labels import metric_label
from dmlbench.analysis.plots.style import fit_x_labels, metric_panels, panel_titles, save_figure, t_errorbar, theme


def metric_by_loss(
    runs: pd.DataFrame, metrics: list[str], path: Path, order: Sequence[str], confidence: float = 0.95
) -> Path:
    """Test metrics per loss (x, chronological) and embedding size (hue); panels: metric x dataset/backbone."""
    theme()
    data = metric_panels(runs, metrics)
    title = f"Test retrieval by loss (oldest left): seed mean and {int(confidence * 100)}% t-interval"
    style = {"kind": "point", "dodge": 0.35 if data["dim"].nunique() > 1 else False, "capsize": 0.15}
    style |= {"linestyle": "none", "height": 3.4, "aspect": 1.2}
    return _by_loss(data, metrics, path, order, confidence, "test score (%)", title, style)


def recall_by_loss(runs: pd.DataFrame, path: Path, order: Sequence[str], confidence: float = 0.95) -> Path:
    """Recall@K per loss (x) and embedding size (hue): the thesis's Fig. 27/28 for every dataset/backbone."""
    theme()
    recalls = sorted(
        {m for m in runs["metric"] if m.startswith("recall_at_")}, key=lambda m: int(m.removeprefix("recall_at_"))
    )
    title = "Recall@K by loss and embedding size (thesis Fig. 27/28 style)"
    style = {"kind": "bar", "capsize": 0.1, "err_kws": {"linewidth": 1.0}, "height": 3.2, "aspect": 1.05}
    return _by_loss(metric_panels(runs, recalls), recalls, path, order, confidence, "test Recall@K (%)", title, style)


def _by_loss(
    data: pd.DataFrame,
    metrics: list[str],
    path: Path,
    order: Sequence[str],
    confidence: float,
    ylabel: str,
    title: str,
    style: dict[str, Any],
) -> Path:
    """``data`` (:func:`metric_panels`) per loss and embedding size, one panel per metric x dataset/backbone;
    ``style``: the plot kind and its look."""
    grid = sns.catplot(
        data=data,
        x="loss",
        y="value",
        hue="dim",
        col="metric",
        col_order=[metric_label(m) for m in metrics],
        row="panel" if data["panel"].nunique() > 1 else None,
        order=[o for o in order if o in set(data["loss"])],
        errorbar=t_errorbar(confidence),
        sharey=False,
        palette="crest",
        **style,
    )
    grid.set_axis_labels("", ylabel)
    panel_titles(grid, data)
    fit_x_labels(grid.figure, grid.axes.flat)
    grid.tight_layout()
    grid.figure.suptitle(title, y=1.03)
    return save_figure(grid.figure, path)
