"""A study's figures for its MLflow run: the optimisation history and the parameter importances."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

import pandas as pd


def draw_history(table: pd.DataFrame, objective: str, path: Path) -> None:
    """Objective per trial (dots; pruned: crosses at their running mean) and the best so far (line)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    complete = table[table["state"] == "complete"]
    pruned = table[table["state"] == "pruned"]
    fig, ax = plt.subplots(figsize=(6, 3.5))
    ax.plot(complete["number"], complete["objective"], "o", label="complete")
    if len(pruned):
        ax.plot(pruned["number"], pruned["fold0"], "x", color="grey", label="pruned (fold 0)")
    ordered = complete.sort_values("number")
    ax.step(ordered["number"], ordered["objective"].cummax(), where="post", label="best so far")
    ax.set(xlabel="trial", ylabel=f"validation {objective} (mean over folds)")
    ax.legend(frameon=False, fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def draw_importances(importance: Mapping[str, float], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    keys = sorted(importance, key=importance.get)
    fig, ax = plt.subplots(figsize=(5, 0.5 + 0.4 * len(keys)))
    ax.barh(keys, [importance[k] for k in keys])
    ax.set(xlabel="fANOVA importance (share of the objective's variance)")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
