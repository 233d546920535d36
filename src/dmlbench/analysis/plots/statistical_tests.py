"""Figures of the "Statistical tests" section: critical-difference diagram, Bayesian comparison, win rates."""

from __future__ import annotations

import zlib
from collections.abc import Sequence
from pathlib import Path

import matplotlib.pyplot as plt
import numpy as np
import pandas as pd
import seaborn as sns

from dmlbench.analysis.plots.style import save_figure, theme


class _StableName(str):
    """A label whose hash does not depend on ``PYTHONHASHSEED``: scikit-posthocs draws the CD
    diagram's crossbars by iterating sets of the labels, so str's salted hash would change the
    figure's bytes from one process to the next."""

    def __hash__(self) -> int:
        return zlib.crc32(self.encode())


def _stable(labels: pd.Index) -> pd.Index:
    return pd.Index([_StableName(label) for label in labels], dtype=object)


def critical_difference_diagram(
    ranks: pd.Series, pvalues: pd.DataFrame, cd: float, path: Path, alpha: float, title: str
) -> Path:
    """Demšar CD diagram (scikit-posthocs): mean ranks; bars join losses Nemenyi cannot separate."""
    import scikit_posthocs as sp

    theme()
    sns.set_style("white")
    fig, ax = plt.subplots(figsize=(7.5, 1.2 + 0.32 * len(ranks)))
    ranks = ranks.set_axis(_stable(ranks.index))
    pvalues = pvalues.set_axis(_stable(pvalues.index), axis=0).set_axis(_stable(pvalues.columns), axis=1)
    sp.critical_difference_diagram(ranks, pvalues, alpha=alpha, ax=ax)  # CD value is in the title
    ax.set_title(title, fontsize=10, pad=28)
    return save_figure(fig, path)


BAYES_COLOURS = {"better": "#2471a3", "equivalent": "#bdc3c7", "worse": "#c0392b"}


def bayesian_comparison(table: pd.DataFrame, path: Path, rope: str) -> Path:
    """Stacked bars per (neighbour pair, experiment): P(A better) | P(equivalent) | P(B better).

    ``table``: the rows of :func:`dmlbench.analysis.bayesian.compare_neighbours` with a, b as
    display names; rows without a posterior are left out. ``rope``: its half-width, e.g. ``1 point``.
    Probabilities print as ``> 0.99`` rather than rounding to a certainty.
    """
    theme()
    rows = table.dropna(subset=["better"]).reset_index(drop=True)
    labels = [f"{r.a} vs {r.b}\n{r.experiment} (n={int(r.n)})" for r in rows.itertuples()]
    fig, ax = plt.subplots(figsize=(8, 0.9 + 0.55 * len(rows)))
    left = np.zeros(len(rows))
    names = {
        "better": "A practically better",
        "equivalent": f"equivalent (ROPE ± {rope})",
        "worse": "B practically better",
    }
    for part in ("better", "equivalent", "worse"):
        values = rows[part].to_numpy(dtype=float)
        ax.barh(labels, values, left=left, color=BAYES_COLOURS[part], label=names[part], edgecolor="white")
        for y, (x0, v) in enumerate(zip(left, values, strict=True)):
            if v >= 0.12:
                ax.text(x0 + v / 2, y, "> 0.99" if v >= 0.995 else f"{v:.2f}", ha="center", va="center", fontsize=8)
        left += values
    ax.axvline(0.95, color="#555555", linewidth=0.8, linestyle=":")
    ax.axvline(0.05, color="#555555", linewidth=0.8, linestyle=":")
    ax.set_xlim(0, 1)
    ax.invert_yaxis()
    ax.set_xlabel("posterior probability (A = better-ranked loss of the pair)")
    ax.legend(loc="lower center", bbox_to_anchor=(0.5, 1.0), ncol=3, fontsize=8, frameon=False)
    ax.grid(axis="y", visible=False)
    return save_figure(fig, path)


def win_rate_heatmap(rates: pd.DataFrame, order: Sequence[str], path: Path, confidence: float = 0.95) -> Path:
    """How often the row loss beats the column loss (a fraction in [0, 1], cells and colour bar
    alike), with the Wilson interval in each cell."""
    theme()
    losses = [o for o in order if o in set(rates["loss"])]
    matrix = rates.pivot(index="loss", columns="opponent", values="rate").reindex(index=losses, columns=losses)
    labels = matrix.copy().astype(object)
    for row in rates.itertuples():
        text = "n/a" if np.isnan(row.rate) else f"{row.rate:.2f}\n[{row.low:.2f}, {row.high:.2f}]\nn={row.n}"
        labels.loc[row.loss, row.opponent] = text
    for loss in losses:
        labels.loc[loss, loss] = ""
    size = 1.2 * len(losses) + 2
    sns.set_style("white")
    fig, ax = plt.subplots(figsize=(size + 1, size * 0.8))
    sns.heatmap(
        matrix.astype(float),  # fractions, as the cells and the win-rate table print them
        annot=labels.to_numpy(),
        fmt="",
        cmap="RdBu",
        center=0.5,
        vmin=0.0,
        vmax=1.0,
        cbar_kws={"label": "row beats column (fraction of blocks)"},
        annot_kws={"fontsize": 8},
        linewidths=0.5,
        ax=ax,
    )
    ax.set_xlabel("opponent")
    ax.set_ylabel("")
    ax.set_title(f"Win rates with {int(confidence * 100)}% Wilson intervals (ties left out)")
    return save_figure(fig, path)
