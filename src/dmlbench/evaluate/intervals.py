"""Confidence intervals: mean +/- t-interval over repeated runs (Reality Check protocol).

interval = mean -/+ t_{(1+c)/2, n-1} * s / sqrt(n), s = sample standard deviation; this is
``scipy.stats.t.interval(c, n - 1, loc=mean, scale=sem)``. With n = 1 there is no interval
(bounds are NaN) and reports say so.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Sequence

import numpy as np


@dataclass(frozen=True)
class Interval:
    mean: float
    low: float
    high: float
    n: int
    confidence: float

    @property
    def half_width(self) -> float:
        return (self.high - self.low) / 2

    def as_dict(self) -> dict[str, float | int]:
        return asdict(self)


def t_interval(values: Sequence[float], confidence: float = 0.95) -> Interval:
    from scipy import stats

    data = np.asarray(values, dtype=np.float64)
    if data.size == 0:
        raise ValueError("t_interval needs at least one value")
    mean = float(data.mean())
    if data.size == 1:
        return Interval(mean, math.nan, math.nan, 1, confidence)
    sem = float(stats.sem(data))
    if sem == 0.0:
        return Interval(mean, mean, mean, int(data.size), confidence)
    low, high = stats.t.interval(confidence, data.size - 1, loc=mean, scale=sem)
    return Interval(mean, float(low), float(high), int(data.size), confidence)


BOOTSTRAP_METHODS = ("percentile", "basic", "BCa")


def bootstrap_interval(
    values: Sequence[float],
    confidence: float = 0.95,
    n_resamples: int = 1000,
    method: str = "percentile",
    seed: int = 0,
    max_batch_elements: int = 1 << 24,
) -> Interval:
    """Mean of per-query ``values`` and its bootstrap interval over queries (one run).

    ``scipy.stats.bootstrap`` with the mean as statistic, ``n_resamples`` resamples of the
    queries with replacement drawn from ``numpy.random.default_rng(seed)`` (reproducible),
    resampled in batches of at most ``max_batch_elements`` values (memory). ``n`` = number of
    queries. BCa's jackknife costs O(n^2): use it for small query sets only. Constant values
    give a zero-width interval.
    """
    from scipy import stats

    if method not in BOOTSTRAP_METHODS:
        raise ValueError(f"bootstrap method must be one of {', '.join(BOOTSTRAP_METHODS)}; got {method!r}")
    data = np.asarray(values, dtype=np.float64).reshape(-1)
    if data.size == 0:
        raise ValueError("bootstrap_interval needs at least one value")
    mean = float(data.mean())
    if data.size == 1 or np.all(data == data[0]):
        return Interval(mean, mean, mean, int(data.size), confidence)
    result = stats.bootstrap(
        (data,),
        np.mean,
        confidence_level=confidence,
        n_resamples=n_resamples,
        method=method,
        vectorized=True,
        batch=max(1, max_batch_elements // data.size),
        rng=np.random.default_rng(seed),
    )
    low, high = result.confidence_interval
    return Interval(mean, float(low), float(high), int(data.size), confidence)
