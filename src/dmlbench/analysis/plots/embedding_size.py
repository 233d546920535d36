"""Figures of the "Embedding size and backbone" section."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import pandas as pd
import seaborn as sns

from dmlbench.analysis.labels import metric_label
from dmlbench.analysis.plots.style import (
    fit_x_labels,
    loss_palette,
    metric_panels,
    panel_titles,
    save_figure,
    t_errorbar,
    theme,
)


def embedding_size(
    runs: pd.DataFrame, metrics: list[str], path: Path, order: Sequence[str], confidence: float = 0.95
) -> Path:
    """Test score against embedding size (log2 axis), one line per loss."""
    theme()
    data = metric_panels(runs, metrics)
    losses = [o for o in order if o in set(data["loss"])]
    grid = sns.relplot(
        data=data,
        x="dim",
        y="value",
        hue="loss",
        hue_order=losses,
        palette=loss_palette(losses),
        col="metric",
        col_order=[metric_label(m) for m in metrics],
        row="panel" if data["panel"].nunique() > 1 else None,
        kind="line",
        marker="o",
        errorbar=t_errorbar(confidence),
        err_style="bars",
        err_kws={"capsize": 3},
        facet_kws={"sharey": False},
        height=3.4,
        aspect=1.2,
    )
    dims = sorted(data["dim"].unique())
    for ax in grid.axes.flat:
        ax.set_xscale("log", base=2)
        ax.set_xticks(dims, [str(d) for d in dims])
        ax.minorticks_off()
    grid.set_axis_labels("embedding size", "test score (%)")
    panel_titles(grid, data)
    grid.figure.suptitle("Effect of the embedding size", y=1.03)
    return save_figure(grid.figure, path)


def backbones(
    runs: pd.DataFrame, metric: str, dim: int, path: Path, order: Sequence[str], confidence: float = 0.95
) -> Path:
    """One metric per loss with one bar per backbone, at one embedding size (thesis Fig. 31)."""
    theme()
    data = runs[(runs["metric"] == metric) & (runs["dim"] == dim)].assign(value=lambda d: 100 * d["value"])
    grid = sns.catplot(
        data=data,
        x="loss",
        y="value",
        hue="backbone",
        col="dataset" if data["dataset"].nunique() > 1 else None,
        order=[o for o in order if o in set(data["loss"])],
        kind="bar",
        errorbar=t_errorbar(confidence),
        capsize=0.1,
        err_kws={"linewidth": 1.0},
        height=3.6,
        aspect=1.6,
        palette="Set2",
    )
    grid.set_axis_labels("", f"test {metric_label(metric)} (%)")
    fit_x_labels(grid.figure, grid.axes.flat)
    grid.tight_layout()
    single = data["backbone"].nunique() == 1
    grid.figure.suptitle(
        f"Backbones compared at embedding size {dim}" + (" (this grid has only one backbone)" if single else ""), y=1.03
    )
    return save_figure(grid.figure, path)
