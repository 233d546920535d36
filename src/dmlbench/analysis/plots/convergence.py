"""Figure of the "Convergence" section: validation score per epoch and per training second."""

from __future__ import annotations

import math
from collections.abc import Sequence
from pathlib import Path

import matplotlib.pyplot as plt
import pandas as pd
from matplotlib.ticker import MaxNLocator

from dmlbench.analysis.labels import metric_label
from dmlbench.analysis.plots.style import interval_frame, loss_palette, panel_label, save_figure, theme


def convergence(
    history: pd.DataFrame, metric: str, dim: int, path: Path, order: Sequence[str], confidence: float = 0.95
) -> Path:
    """Validation ``metric`` against epoch and against cumulative training seconds (Proxy-Anchor Fig. 2).

    Lines are seed means, bands t-intervals; without a validation split the training loss is drawn.
    """
    theme()
    data = history[history["dim"] == dim].assign(panel=panel_label)
    column = f"val/{metric}"
    has_val = column in data.columns and data[column].notna().any()
    if has_val:
        data = data.dropna(subset=[column]).assign(value=lambda d: 100 * d[column])
        ylabel = f"validation {metric_label(metric)} (%)"
        bounds = (0.0, 100.0)
    else:
        data = data.assign(value=data["train/loss"])
        ylabel = "training loss (no validation split)"
        bounds = (-math.inf, math.inf)
    if "train/elapsed_seconds" in data.columns and data["train/elapsed_seconds"].notna().any():
        data = data.assign(seconds=data["train/elapsed_seconds"])
    elif "train/epoch_seconds" in data.columns:
        data = data.sort_values("epoch").assign(
            seconds=lambda d: d.groupby(["panel", "loss", "seed"])["train/epoch_seconds"].cumsum()
        )
    x_axes = [("epoch", "epoch")] + ([("seconds", "training time (s)")] if "seconds" in data.columns else [])
    panels = list(dict.fromkeys(data["panel"]))
    losses = [o for o in order if o in set(data["loss"])]
    palette = loss_palette(losses)
    fig, axes = plt.subplots(
        len(panels), len(x_axes), figsize=(5.2 * len(x_axes), 3.6 * len(panels)), squeeze=False, sharey="row"
    )
    for row, panel in enumerate(panels):
        block = data[data["panel"] == panel]
        stats = interval_frame(block, ["loss", "epoch"], "value", confidence, *bounds)
        if "seconds" in block.columns:
            seconds = block.groupby(["loss", "epoch"])["seconds"].mean().rename("seconds").reset_index()
            stats = stats.merge(seconds, on=["loss", "epoch"])
        for col, (x, xlabel) in enumerate(x_axes):
            ax = axes[row, col]
            for loss in losses:
                line = stats[stats["loss"] == loss].sort_values("epoch")
                ax.plot(line[x], line["mean"], marker="o", markersize=3, color=palette[loss], label=loss)
                ax.fill_between(line[x], line["low"], line["high"], color=palette[loss], alpha=0.18, linewidth=0)
            ax.set_xlabel(xlabel)
            if x == "epoch":
                ax.xaxis.set_major_locator(MaxNLocator(integer=True))
            ax.set_ylabel(ylabel if col == 0 else "")
            ax.set_title(f"{panel}, dim {dim}" + (" - against wall time" if x == "seconds" else ""))
    axes[0, -1].legend(loc="center left", bbox_to_anchor=(1.0, 0.5), frameon=False)
    fig.suptitle("Convergence on the validation classes (what model selection reads)", y=1.01)
    fig.tight_layout()
    return save_figure(fig, path)
