"""Confidence intervals: t over repeated runs, per-query bootstrap for one run."""

from __future__ import annotations

import numpy as np
import pytest
from scipy import stats

from dmlbench.evaluate.intervals import (
    bootstrap_interval,
    bootstrap_intervals,
    bounded_t_interval,
    interval_method,
    t_interval,
)


def test_t_interval_over_seeds():
    interval = t_interval([0.60, 0.62, 0.64], 0.95)
    # mean 0.62, sd 0.02, sem 0.02/sqrt(3), t_{0.975, 2} = 4.302653
    assert interval.mean == pytest.approx(0.62)
    assert interval.half_width == pytest.approx(4.302653 * 0.02 / np.sqrt(3), rel=1e-5)
    assert interval.n == 3
    single = t_interval([0.5])
    assert single.n == 1 and np.isnan(single.low)


def test_bounded_interval_stays_in_range_where_the_t_interval_leaves_it():
    """Proxy-Anchor's P@1 over 3 seeds in an early demo run: the t-interval went below 0."""
    seeds = [0.148, 0.113, 0.309]
    plain = t_interval(seeds)
    assert plain.low < 0
    bounded = bounded_t_interval(seeds, 0.95, 0.0, 1.0)
    mean, sem, t = np.mean(seeds), stats.sem(seeds), stats.t.ppf(0.975, 2)
    centre, half = np.log(mean / (1 - mean)), t * sem / (mean * (1 - mean))  # logit scale, delta method
    assert bounded.mean == pytest.approx(mean)
    assert (bounded.low, bounded.high) == pytest.approx(
        (1 / (1 + np.exp(-(centre - half))), 1 / (1 + np.exp(-(centre + half))))
    )
    assert 0 < bounded.low < mean < bounded.high < 1 and bounded.n == 3


def test_bounded_interval_below_only_uses_the_log_scale_and_handles_degenerate_samples():
    gains = [0.005, 0.01, 0.02, 0.001]  # a non-negative gain, every value above its bound
    bounded = bounded_t_interval(gains, 0.95, 0.0)
    mean, sem, t = np.mean(gains), stats.sem(gains), stats.t.ppf(0.975, 3)
    assert (bounded.low, bounded.high) == pytest.approx((mean * np.exp(-t * sem / mean), mean * np.exp(t * sem / mean)))
    assert t_interval(gains).low < 0 < bounded.low
    assert interval_method(gains, 0.0) == "t-log" and interval_method([0.2, 0.4], 0.0, 1.0) == "t-logit"
    same = bounded_t_interval([0.0, 0.0, 0.0], 0.95, 0.0, 1.0)
    assert (same.low, same.high) == (0.0, 0.0)  # every value on the bound: zero width, no division by 0
    assert np.isnan(bounded_t_interval([0.3], 0.95, 0.0, 1.0).low) and interval_method([0.3]) == "none"
    assert bounded_t_interval([-1.0, 2.0, 0.5], 0.95, -np.inf) == t_interval([-1.0, 2.0, 0.5])  # no bound
    assert interval_method([-1.0, 2.0], -np.inf) == "t"
    with pytest.raises(ValueError, match=r"values outside \[0, 1\]: -0.1 to 0.5"):
        bounded_t_interval([-0.1, 0.5], 0.95, 0.0, 1.0)


def test_values_on_a_bound_get_the_truncated_t_interval_not_an_exploding_transform():
    """Test-set feedback gains of (0, 0, 4) points: on the logit of [0, 100] the delta method reached
    ~50 points; the truncated t-interval is [0, mean + t sem]."""
    gains = [0.0, 0.0, 4.0]
    bounded = bounded_t_interval(gains, 0.95, 0.0, 100.0)
    mean, sem, t = np.mean(gains), stats.sem(gains), stats.t.ppf(0.975, 2)
    assert (bounded.low, bounded.high) == pytest.approx((0.0, mean + t * sem))  # 0 to 7.07
    assert bounded.high < 8 and interval_method(gains, 0.0, 100.0) == "t-truncated"
    ranks = bounded_t_interval([1, 1, 2, 1], 0.95, 1, 4)  # a rank among 4 losses, three of them on the bound
    assert ranks.low == 1 and ranks.high == pytest.approx(1.25 + stats.t.ppf(0.975, 3) * 0.25)
    top = bounded_t_interval([1.0, 0.9, 0.95], 0.95, 0.0, 1.0)  # a score at its upper bound
    assert top.high == 1.0 and top.low == pytest.approx(0.95 - stats.t.ppf(0.975, 2) * stats.sem([1.0, 0.9, 0.95]))


def test_bounded_interval_covers_a_skewed_proportion_about_as_often_as_it_says():
    """Monte Carlo: Beta(1, 12) scores (mean 1/13, skewed towards 0), 5 seeds, 4,000 draws: the
    bounded interval covers the true mean about 95% of the time and never leaves [0, 1]."""
    rng = np.random.default_rng(7)
    draws = rng.beta(1, 12, size=(4000, 5))
    intervals = [bounded_t_interval(d, 0.95, 0.0, 1.0) for d in draws]
    covered = np.mean([i.low <= 1 / 13 <= i.high for i in intervals])
    assert 0.90 <= covered <= 0.99
    assert all(0 <= i.low <= i.high <= 1 for i in intervals)
    plain = [t_interval(d) for d in draws]
    assert np.mean([i.low < 0 for i in plain]) > 0.3  # the plain t-interval leaves the range (51% here)
    assert covered > np.mean([i.low <= 1 / 13 <= i.high for i in plain])  # and covers less (0.89 vs 0.93 here)


@pytest.mark.parametrize("method", ["percentile", "basic", "BCa"])
def test_bootstrap_equals_scipy_on_the_same_seed(method):
    values = (np.random.default_rng(0).random(300) < 0.3).astype(float)
    ours = bootstrap_interval(values, 0.95, n_resamples=500, method=method, seed=7)
    expected = stats.bootstrap(
        (values,), np.mean, confidence_level=0.95, n_resamples=500, method=method, rng=np.random.default_rng(7)
    ).confidence_interval
    assert (ours.low, ours.high) == pytest.approx((expected.low, expected.high), abs=1e-12)
    assert ours.n == 300 and ours.mean == pytest.approx(values.mean())


def test_joint_bootstrap_is_paired_and_reproducible():
    rng = np.random.default_rng(1)
    values = {"a": rng.random(2000), "b": (rng.random(2000) < 0.3).astype(float), "constant": np.ones(2000)}
    joint = bootstrap_intervals(values, n_resamples=400, seed=3)
    assert joint == bootstrap_intervals(values, n_resamples=400, seed=3)
    assert joint != bootstrap_intervals(values, n_resamples=400, seed=4)
    # Each metric's interval is the one it gets alone (same resamples of the queries).
    for name in ("a", "b"):
        alone = bootstrap_interval(values[name], n_resamples=400, seed=3)
        assert (joint[name].low, joint[name].high) == pytest.approx((alone.low, alone.high), abs=1e-12)
    assert joint["constant"].low == joint["constant"].high == 1.0
    # Width of a proportion's 95% interval ~ 2 x 1.96 x sqrt(p (1 - p) / n).
    p = values["b"].mean()
    assert joint["b"].high - joint["b"].low == pytest.approx(2 * 1.96 * np.sqrt(p * (1 - p) / 2000), rel=0.15)
    assert joint["b"].low < p < joint["b"].high


def test_bootstrap_rejects_unknown_method():
    with pytest.raises(ValueError, match="percentile, basic, BCa"):
        bootstrap_interval([0.1, 0.2], method="bca")
