"""Figure of the "Tuning" section: each loss's validation objective against the trial number."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import matplotlib.pyplot as plt
import pandas as pd

from dmlbench.analysis.labels import metric_label
from dmlbench.analysis.plots.style import loss_palette, save_figure, theme


def objective_by_trial(trials: pd.DataFrame, path: Path, order: Sequence[str], objective: str) -> Path:
    """``trials``: loss, number, state, objective, fold0 (percent scale applied here). Complete
    trials as dots, pruned ones as crosses at their first fold's score, the best so far as a step."""
    theme()
    palette = loss_palette(order)
    fig, ax = plt.subplots(figsize=(7.0, 3.8))
    for loss in [o for o in order if o in set(trials["loss"])]:
        group = trials[trials["loss"] == loss].sort_values("number")
        complete = group[group["state"] == "complete"]
        pruned = group[group["state"] == "pruned"]
        color = palette[loss]
        ax.plot(complete["number"], 100 * complete["objective"], "o", color=color, alpha=0.7)
        if len(pruned):
            ax.plot(pruned["number"], 100 * pruned["fold0"], "x", color=color, alpha=0.7)
        ax.step(complete["number"], 100 * complete["objective"].cummax(), where="post", color=color, label=loss)
    ax.set(xlabel="trial (0 = the published values)", ylabel=f"validation {metric_label(objective)} (%)")
    ax.legend(frameon=False, fontsize=8, ncol=2)
    return save_figure(fig, path)
