"""Confidence intervals: mean +/- t-interval over repeated runs (Reality Check protocol).

interval = mean -/+ t_{(1+c)/2, n-1} * s / sqrt(n), s = sample standard deviation; this is
``scipy.stats.t.interval(c, n - 1, loc=mean, scale=sem)``. With n = 1 there is no interval
(bounds are NaN) and reports say so.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass

import numpy as np


@dataclass(frozen=True)
class Interval:
    mean: float
    low: float
    high: float
    n: int
    confidence: float

    def bounds_or_mean(self) -> tuple[float, float]:
        """``(low, high)``, or ``(mean, mean)`` where there is no interval (n = 1): what a figure draws."""
        return (self.mean, self.mean) if math.isnan(self.low) else (self.low, self.high)

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


def bounded_t_interval(
    values: Sequence[float], confidence: float = 0.95, lower: float = 0.0, upper: float = math.inf
) -> Interval:
    """Mean and a t-interval that stays inside the quantity's range ``[lower, upper]``.

    The t-interval is built on a transformed scale and mapped back (delta method): for a quantity
    bounded on both sides (a proportion, a rank) on the logit of p = (mean - lower) / (upper - lower),
    se = sem / ((upper - lower) p (1 - p)); for one bounded below only (a non-negative gain, seconds)
    on log(mean - lower), se = sem / (mean - lower); then bound = inverse(centre -/+ t_{(1+c)/2, n-1} se).
    The interval is asymmetric near a bound and never crosses it. The transform needs every value
    strictly inside the range: when a value sits on a bound (a gain of exactly 0, a rank of exactly
    1), the delta method degenerates (a mean of (0, 0, 4) would reach 50 points on the logit of
    [0, 100]), so the plain t-interval truncated to ``[lower, upper]`` is used instead (its coverage
    is the plain interval's, since the mean lies in the range). Every value equal: the zero-width
    interval; n = 1: no interval (NaN bounds); ``lower = -inf``: the plain t-interval.
    :func:`interval_method` names the method used.
    """
    from scipy import stats
    from scipy.special import expit, logit

    data = np.asarray(values, dtype=np.float64)
    if data.size and (data.min() < lower or data.max() > upper):
        raise ValueError(f"values outside [{lower:g}, {upper:g}]: {data.min():g} to {data.max():g}")
    plain = t_interval(data, confidence)
    if plain.n < 2 or plain.low == plain.high or math.isinf(lower):  # no bound below: the plain interval
        return plain
    if data.min() == lower or data.max() == upper:  # a value on a bound: truncate the plain interval
        return Interval(plain.mean, max(lower, plain.low), min(upper, plain.high), plain.n, confidence)
    sem, mean = float(stats.sem(data)), plain.mean
    quantile = float(stats.t.ppf((1 + confidence) / 2, data.size - 1))
    if math.isinf(upper):
        shift = mean - lower  # > 0: the values vary and none is below ``lower``
        half = quantile * sem / shift
        return Interval(mean, lower + shift * math.exp(-half), lower + shift * math.exp(half), plain.n, confidence)
    width = upper - lower
    share = (mean - lower) / width  # strictly inside (0, 1): the values vary inside the range
    half = quantile * sem / (width * share * (1 - share))
    centre = float(logit(share))
    low, high = float(expit(centre - half)), float(expit(centre + half))
    return Interval(mean, lower + width * low, lower + width * high, plain.n, confidence)


def interval_method(values: Sequence[float], lower: float = 0.0, upper: float = math.inf) -> str:
    """The method :func:`bounded_t_interval` uses for ``values``: ``none`` (n < 2), ``t`` (no lower bound,
    or every value equal), ``t-truncated`` (a value on a bound), ``t-log`` (bounded below only) or
    ``t-logit`` (bounded on both sides)."""
    data = np.asarray(values, dtype=np.float64)
    if data.size < 2:
        return "none"
    if math.isinf(lower) or data.min() == data.max():
        return "t"
    if data.min() == lower or data.max() == upper:
        return "t-truncated"
    return "t-log" if math.isinf(upper) else "t-logit"


BOOTSTRAP_METHODS = ("percentile", "basic", "BCa")


def bootstrap_intervals(
    values: Mapping[str, Sequence[float]],
    confidence: float = 0.95,
    n_resamples: int = 1000,
    method: str = "percentile",
    seed: int = 0,
    max_batch_elements: int = 1 << 24,
) -> dict[str, Interval]:
    """Mean of each per-query metric of one run and its bootstrap interval over the queries.

    ``scipy.stats.bootstrap`` resamples the queries with replacement (``n_resamples`` times,
    ``numpy.random.default_rng(seed)``: reproducible) and recomputes every metric's mean on the
    same resample (a paired bootstrap: the intervals of all metrics come from one set of
    resamples). The statistic turns a resample of query indices into counts per query
    (``bincount``) and means into one matrix product, so the cost is O(resamples x queries)
    for all metrics together, in batches of at most ``max_batch_elements`` indices.
    ``n`` = number of queries. BCa's jackknife costs O(queries^2): use it for small query sets.
    A metric that is constant over the queries gets a zero-width interval.
    """
    from scipy import stats

    if method not in BOOTSTRAP_METHODS:
        raise ValueError(f"bootstrap method must be one of {', '.join(BOOTSTRAP_METHODS)}; got {method!r}")
    names = list(values)
    matrix = np.stack([np.asarray(values[name], dtype=np.float64).reshape(-1) for name in names])
    n = matrix.shape[1]
    if n == 0:
        raise ValueError("bootstrap intervals need at least one query")
    mean = matrix.mean(axis=1)
    constant = np.all(matrix == matrix[:, :1], axis=1)
    result = {
        name: Interval(float(mean[i]), float(mean[i]), float(mean[i]), n, confidence) for i, name in enumerate(names)
    }
    varying = np.flatnonzero(~constant)
    if n == 1 or len(varying) == 0:
        return result
    data_t = np.ascontiguousarray(matrix[varying].T)

    def resampled_means(indices: np.ndarray, axis: int = -1) -> np.ndarray:
        indices = np.asarray(indices)
        flat = indices.reshape(-1, indices.shape[-1])
        size = flat.shape[1]
        offsets = (np.arange(len(flat)) * n)[:, None]
        counts = np.bincount((flat + offsets).ravel(), minlength=len(flat) * n).reshape(len(flat), n)
        out = (counts.astype(np.float64) @ data_t).T / size  # metrics x resamples
        return out.reshape(data_t.shape[1], *indices.shape[:-1])

    boot = stats.bootstrap(
        (np.arange(n),),
        resampled_means,
        confidence_level=confidence,
        n_resamples=n_resamples,
        method=method,
        vectorized=True,
        batch=max(1, max_batch_elements // n),
        rng=np.random.default_rng(seed),
    )
    lows, highs = np.atleast_1d(boot.confidence_interval.low), np.atleast_1d(boot.confidence_interval.high)
    for j, i in enumerate(varying):
        result[names[i]] = Interval(float(mean[i]), float(lows[j]), float(highs[j]), n, confidence)
    return result


def bootstrap_interval(
    values: Sequence[float],
    confidence: float = 0.95,
    n_resamples: int = 1000,
    method: str = "percentile",
    seed: int = 0,
) -> Interval:
    """:func:`bootstrap_intervals` of a single per-query metric."""
    return bootstrap_intervals({"metric": values}, confidence, n_resamples, method, seed)["metric"]
