"""Figure of the "Cost" section: training time and throughput."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import matplotlib.pyplot as plt
import pandas as pd
import seaborn as sns

from dmlbench.analysis.plots.style import fit_x_labels, save_figure, theme


def cost(costs: pd.DataFrame, path: Path, order: Sequence[str]) -> Path:
    """Training seconds per run and training throughput (images/s) per loss and embedding size."""
    theme()
    losses = [o for o in order if o in set(costs["loss"])]
    device = ", ".join(sorted(set(costs["device"].astype(str))))
    fig, axes = plt.subplots(1, 2, figsize=(max(9.0, 1.6 * len(losses) + 4), 3.8))
    for ax, column, label in (
        (axes[0], "train_seconds", f"training time per run (s, {device})"),
        (axes[1], "images_per_second", "training throughput (images/s)"),
    ):
        sns.barplot(
            data=costs,
            x="loss",
            y=column,
            hue="dim",
            order=losses,
            errorbar=("pi", 100),
            capsize=0.1,
            err_kws={"linewidth": 1.0},
            palette="crest",
            ax=ax,
        )
        ax.set_ylabel(label)
        ax.set_xlabel("")
    axes[0].get_legend().remove()
    sns.move_legend(axes[1], "center left", bbox_to_anchor=(1.0, 0.5), title="dim", frameon=False)
    fig.suptitle("Cost per run: bars = mean over runs, whiskers = min to max", y=1.02)
    fit_x_labels(fig, axes)
    fig.tight_layout()
    return save_figure(fig, path)
