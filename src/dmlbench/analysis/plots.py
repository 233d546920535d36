"""Seaborn figures for the report. Error bars are 95% t-intervals over seeds (not bootstrap)."""

from __future__ import annotations

from pathlib import Path

import matplotlib

matplotlib.use("Agg")

import matplotlib.pyplot as plt  # noqa: E402
import pandas as pd  # noqa: E402
import seaborn as sns  # noqa: E402

from dmlbench.evaluate.intervals import t_interval  # noqa: E402
from dmlbench.io import atomic_path  # noqa: E402

METRIC_LABELS = {
    "precision_at_1": "P@1 (= R@1)",
    "recall_at_1": "R@1",
    "r_precision": "R-Precision",
    "map_at_r": "MAP@R",
}


def _t_errorbar(confidence: float):
    def interval(values: pd.Series) -> tuple[float, float]:
        result = t_interval(values.to_numpy(), confidence)
        if result.n < 2:
            return result.mean, result.mean
        return result.low, result.high

    return interval


def _save(fig: plt.Figure, path: Path) -> Path:
    with atomic_path(path, suffix=".png") as tmp:
        fig.savefig(tmp, dpi=120, bbox_inches="tight", format="png")
    plt.close(fig)
    return path


def metric_by_loss(runs: pd.DataFrame, metrics: list[str], path: Path, confidence: float = 0.95) -> Path:
    """Test metrics per loss (x) and embedding size (hue), one panel per metric and backbone."""
    sns.set_theme(style="whitegrid", context="notebook")
    data = runs[runs["metric"].isin(metrics)].copy()
    data["metric"] = data["metric"].map(lambda m: METRIC_LABELS.get(m, m))
    data["value"] = 100 * data["value"]
    grid = sns.catplot(
        data=data,
        x="loss",
        y="value",
        hue="dim",
        col="metric",
        row="backbone" if data["backbone"].nunique() > 1 else None,
        kind="point",
        errorbar=_t_errorbar(confidence),
        dodge=0.35 if data["dim"].nunique() > 1 else False,
        capsize=0.15,
        linestyle="none",
        sharey=False,
        height=3.6,
        aspect=1.25,
        palette="deep",
    )
    grid.set_axis_labels("", "test score (%)")
    grid.set_titles("{col_name}" if data["backbone"].nunique() == 1 else "{row_name} - {col_name}")
    for ax in grid.axes.flat:
        ax.tick_params(axis="x", rotation=25)
    grid.figure.suptitle(f"Test retrieval by loss: mean and {int(confidence * 100)}% t-interval over seeds", y=1.03)
    return _save(grid.figure, path)


def validation_curves(history: pd.DataFrame, metric: str, path: Path, confidence: float = 0.95) -> Path:
    """Validation ``metric`` per epoch for each loss (hue) and embedding size (style).

    Without a validation split (``standard`` scheme) the training loss is drawn instead.
    """
    sns.set_theme(style="whitegrid", context="notebook")
    column = f"val/{metric}"
    has_val = column in history.columns and history[column].notna().any()
    if has_val:
        data = history.dropna(subset=[column]).assign(value=lambda d: 100 * d[column])
        ylabel, title = (
            f"validation {METRIC_LABELS.get(metric, metric)} (%)",
            "Convergence on the validation classes (selection split)",
        )
    else:
        data = history.assign(value=history["train/loss"])
        ylabel, title = "training loss", "Training loss (no validation split)"
    fig, ax = plt.subplots(figsize=(7, 4))
    sns.lineplot(
        data=data,
        x="epoch",
        y="value",
        hue="loss",
        style="dim",
        errorbar=_t_errorbar(confidence),
        marker="o",
        ax=ax,
        palette="deep",
    )
    ax.set_ylabel(ylabel)
    ax.set_title(title)
    ax.legend(loc="center left", bbox_to_anchor=(1.0, 0.5), frameon=False)
    return _save(fig, path)
