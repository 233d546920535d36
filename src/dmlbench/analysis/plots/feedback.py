"""Figure of the "Test-set feedback" section: the gain of picking the epoch on the test set."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import matplotlib.pyplot as plt
import pandas as pd
import seaborn as sns

from dmlbench.analysis.labels import metric_label
from dmlbench.analysis.plots.style import fit_x_labels, save_figure, seeded_jitter, t_errorbar, theme


def test_feedback(bias: pd.DataFrame, path: Path, order: Sequence[str], confidence: float = 0.95) -> Path:
    """Best-on-test minus selected-on-validation score per run (percentage points), by loss and dim."""
    theme()
    data = bias.assign(gain=100 * bias["bias"])
    losses = [o for o in order if o in set(data["loss"])]
    fig, ax = plt.subplots(figsize=(max(6.0, 1.3 * len(losses) + 2), 3.8))
    layers = {"data": data, "x": "loss", "y": "gain", "hue": "dim", "order": losses, "palette": "crest", "ax": ax}
    with seeded_jitter():
        sns.stripplot(**layers, dodge=True, alpha=0.45, legend=False, size=4)
    sns.pointplot(
        **layers,
        dodge=0.4 if data["dim"].nunique() > 1 else False,
        errorbar=t_errorbar(confidence, 0.0, 100.0),  # a gain >= 0 (percentage points)
        capsize=0.12,
        linestyle="none",
        markers="D",
    )
    ax.axhline(0, color="black", linewidth=0.8)
    metric = metric_label(str(data["metric"].iloc[0]))
    ax.set_ylabel(f"test {metric}: best epoch - selected epoch (pp)")
    ax.set_xlabel("")
    ax.set_title("What picking the epoch on the test set would have added (test-set feedback)")
    ax.legend(title="dim", loc="center left", bbox_to_anchor=(1.0, 0.5), frameon=False)
    fit_x_labels(fig, [ax])
    fig.tight_layout()
    return save_figure(fig, path)
