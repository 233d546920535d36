"""Published numbers reproduced? For a grid that follows a published setup (the Reality Check,
the thesis, Proxy-Anchor: :data:`~dmlbench.analysis.literature.PROTOCOL_SOURCES`), each cell's
published number is compared with our seed mean and its t-interval.

A published number is *reproduced* when it lies inside our 95% interval. The difference is our
mean minus the published number in points, with our interval shifted by the same amount (the
published number is taken as exact: most papers give none). One run has no interval, so no verdict.
"""

from __future__ import annotations

import math

import pandas as pd

KEYS = ["dataset", "backbone", "loss", "dim", "metric"]
REPRODUCED, LOWER, HIGHER, UNDECIDED = (
    "reproduced",
    "not reproduced: ours lower",
    "not reproduced: ours higher",
    "no interval",
)


def verdict(published: float, low: float, high: float) -> str:
    """Where a published number (a fraction) lies against our interval [low, high]."""
    if math.isnan(low) or math.isnan(high):
        return UNDECIDED
    if published < low:
        return HIGHER
    if published > high:
        return LOWER
    return REPRODUCED


def reproduction_table(summary: pd.DataFrame, published: pd.DataFrame) -> pd.DataFrame:
    """One row per grid cell, metric and published number: ours (mean, low, high as fractions, n),
    ``published`` (percent), ``source``, ``uncertain``, ``difference``/``difference_low``/
    ``difference_high`` (ours - published, points) and ``verdict``. Empty when nothing matches."""
    columns = [*KEYS, "mean", "low", "high", "n", "published", "source", "uncertain"]
    if summary.empty or published.empty:
        return pd.DataFrame(columns=[*columns, "difference", "difference_low", "difference_high", "verdict"])
    merged = summary.merge(published.rename(columns={"value": "published"}), on=KEYS, how="inner")[columns]
    fraction = merged["published"] / 100
    return merged.assign(
        difference=100 * merged["mean"] - merged["published"],
        difference_low=100 * merged["low"] - merged["published"],
        difference_high=100 * merged["high"] - merged["published"],
        verdict=[verdict(p, lo, hi) for p, lo, hi in zip(fraction, merged["low"], merged["high"], strict=True)],
    ).reset_index(drop=True)
