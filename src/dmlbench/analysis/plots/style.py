"""What every report figure shares: the theme, one colour per loss, t-interval error bars
(``scipy.stats.t``; a cell with one run has no bar), the dataset/backbone panels and the atomic PNG write.

Scores are fractions in [0, 1], drawn in percent; losses arrive already renamed to display names.
"""

from __future__ import annotations

import textwrap
from collections.abc import Iterable, Sequence
from contextlib import contextmanager
from pathlib import Path

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


def wrap_label(text: str, width: int = 14) -> str:
    """A loss name broken at spaces into lines of at most ``width`` characters (a longer word stays whole)."""
    return textwrap.fill(text, width, break_long_words=False, break_on_hyphens=False)


def labels_overlap(labels: Sequence[plt.Text], renderer, pad: float = 2.0) -> bool:
    """Whether the window extents of any two visible, non-empty tick labels overlap (``pad`` pixels apart)."""
    boxes = [t.get_window_extent(renderer) for t in labels if t.get_visible() and t.get_text()]
    boxes = [b.padded(pad / 2) for b in boxes]
    return any(a.overlaps(b) for i, a in enumerate(boxes) for b in boxes[i + 1 :])


def fit_x_labels(fig: plt.Figure, axes: Iterable[plt.Axes], width: int = 14) -> None:
    """Loss names on a categorical x axis that never overlap, whatever their number and length:
    wrapped onto lines of ``width`` characters and set horizontally when they fit side by side at
    the figure's size, else turned vertical on fewer, longer lines (a vertical label is as wide as
    its lines are tall; the figure grows by the labels' height so a tight layout still fits them),
    and as a last resort the figure is widened. Call it before the final ``tight_layout``."""
    axes = list(axes)
    names = {ax: [t.get_text() for t in ax.get_xticklabels()] for ax in axes}
    renderer = fig.canvas.get_renderer()

    def overlapping() -> bool:
        return any(labels_overlap(ax.get_xticklabels(), renderer) for ax in axes)

    for rotation, wrap in ((0, width), (90, 2 * width), (90, 10**6)):
        for ax in axes:
            ax.set_xticks(ax.get_xticks(), [wrap_label(n, wrap) for n in names[ax]], rotation=rotation, ha="center")
        if not overlapping():
            break
    while overlapping() and fig.get_figwidth() < 60:
        fig.set_figwidth(fig.get_figwidth() * 1.25)
    if rotation:
        tallest = max(t.get_window_extent(renderer).height for ax in axes for t in ax.get_xticklabels())
        fig.set_figheight(fig.get_figheight() + tallest / fig.dpi)


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
