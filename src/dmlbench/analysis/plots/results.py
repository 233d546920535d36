"""Figures of the report's "Results" section: test metrics and Recall@K per loss."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

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
    grid = sns.catplot(
        data=data,
        x="loss",
        y="value",
        hue="dim",
        col="metric",
        col_order=[metric_label(m) for m in metrics],
        row="panel" if data["panel"].nunique() > 1 else None,
        order=[o for o in order if o in set(data["loss"])],
        kind="point",
        errorbar=t_errorbar(confidence),
        dodge=0.35 if data["dim"].nunique() > 1 else False,
        capsize=0.15,
        linestyle="none",
        sharey=False,
        height=3.4,
        aspect=1.2,
        palette="crest",
    )
    grid.set_axis_labels("", "test score (%)")
    panel_titles(grid, data)
    fit_x_labels(grid.figure, grid.axes.flat)
    grid.tight_layout()
    grid.figure.suptitle(
        f"Test retrieval by loss (oldest left): seed mean and {int(confidence * 100)}% t-interval", y=1.03
    )
    return save_figure(grid.figure, path)


def recall_by_loss(runs: pd.DataFrame, path: Path, order: Sequence[str], confidence: float = 0.95) -> Path:
    """Recall@K per loss (x) and embedding size (hue): the thesis's Fig. 27/28 for every dataset/backbone."""
    theme()
    recalls = sorted(
        {m for m in runs["metric"] if m.startswith("recall_at_")}, key=lambda m: int(m.removeprefix("recall_at_"))
    )
    data = metric_panels(runs, recalls)
    grid = sns.catplot(
        data=data,
        x="loss",
        y="value",
        hue="dim",
        col="metric",
        col_order=[metric_label(m) for m in recalls],
        row="panel" if data["panel"].nunique() > 1 else None,
        order=[o for o in order if o in set(data["loss"])],
        kind="bar",
        errorbar=t_errorbar(confidence),
        capsize=0.1,
        err_kws={"linewidth": 1.0},
        sharey=False,
        height=3.2,
        aspect=1.05,
        palette="crest",
    )
    grid.set_axis_labels("", "test Recall@K (%)")
    panel_titles(grid, data)
    fit_x_labels(grid.figure, grid.axes.flat)
    grid.tight_layout()
    grid.figure.suptitle("Recall@K by loss and embedding size (thesis Fig. 27/28 style)", y=1.03)
    return save_figure(grid.figure, path)
