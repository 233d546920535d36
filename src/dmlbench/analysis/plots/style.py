"""What every report figure shares: the theme, one colour per loss, t-interval error bars
(``scipy.stats.t``; a cell with one run has no bar), the dataset/backbone panels and the atomic PNG write.

Scores are fractions in [0, 1], drawn in percent; losses arrive already renamed to display names.
"""

from __future__ import annotations

from contextlib import contextmanager
from pathlib import Path
from typing import Sequence

import matplotlib.pyplot as plt
import numpy as np
import pandas as pd
import seaborn as sns

from dmlbench.analysis.labels import metric_label
from dmlbench.evaluate.intervals import bounded_t_interval
from dmlbench.io import atomic_path


def loss_palette(order: Sequence[str]) -> dict[str, tuple]:
    """One colour per loss, the same in every figure."""
    colours = sns.color_palette("tab10" if len(order) <= 10 else "husl", len(order))
    return dict(zip(order, colours, strict=True))


def theme() -> None:
    sns.set_theme(style="whitegrid", context="notebook", font_scale=0.95)


def t_errorbar(confidence: float, lower: float = 0.0, upper: float = 100.0):
    """Seaborn ``errorbar``: the t-interval kept inside ``[lower, upper]`` (scores in percent by
    default; :func:`~dmlbench.evaluate.intervals.bounded_t_interval`)."""

    def interval(values: pd.Series) -> tuple[float, float]:
        return bounded_t_interval(values.to_numpy(), confidence, lower, upper).bounds_or_mean()

    return interval


def interval_frame(
    data: pd.DataFrame, keys: list[str], value: str, confidence: float, lower: float = 0.0, upper: float = 100.0
) -> pd.DataFrame:
    """mean, low, high, n of ``value`` per ``keys`` (t-interval kept inside ``[lower, upper]``;
    low = high = mean for n = 1)."""
    rows = []
    for key, group in data.groupby(keys, sort=False):
        interval = bounded_t_interval(group[value].dropna().to_numpy(), confidence, lower, upper)
        low, high = interval.bounds_or_mean()
        rows.append(
            {
                **dict(zip(keys, key if isinstance(key, tuple) else (key,), strict=True)),
                "mean": interval.mean,
                "low": low,
                "high": high,
                "n": interval.n,
            }
        )
    return pd.DataFrame(rows)


def save_figure(fig: plt.Figure, path: Path) -> Path:
    with atomic_path(path, suffix=".png") as tmp:
        fig.savefig(tmp, dpi=110, bbox_inches="tight", format="png", metadata={"Software": None})
    plt.close(fig)
    return path


def panel_label(frame: pd.DataFrame) -> pd.Series:
    """``dataset / backbone`` (the facet of most figures)."""
    return frame["dataset"].astype(str) + " / " + frame["backbone"].astype(str)


def metric_panels(runs: pd.DataFrame, metrics: Sequence[str]) -> pd.DataFrame:
    """Rows of ``metrics`` with display labels, values in percent and a dataset/backbone panel."""
    return runs[runs["metric"].isin(metrics)].assign(
        metric=lambda d: d["metric"].map(metric_label), value=lambda d: 100 * d["value"], panel=panel_label
    )


def panel_titles(grid: sns.FacetGrid, data: pd.DataFrame) -> None:
    grid.set_titles("{col_name}" if data["panel"].nunique() == 1 else "{row_name}: {col_name}")


@contextmanager
def seeded_jitter(seed: int = 0):
    """Seaborn's ``stripplot`` jitters with numpy's global RNG: seed it for one figure (the same
    figure whatever was drawn before) and put the caller's state back afterwards."""
    state = np.random.get_state()
    np.random.seed(seed)
    try:
        yield
    finally:
        np.random.set_state(state)
