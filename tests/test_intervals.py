"""Confidence intervals: t over repeated runs clipped to the range, the class-cluster bootstrap for one run."""

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


def test_bounded_interval_is_the_t_interval_clipped_to_the_range():
    """Proxy-Anchor's P@1 over 3 seeds in an early demo run: the t-interval went below 0; clipped at 0."""
    seeds = [0.148, 0.113, 0.309]
    plain = t_interval(seeds)
    assert plain.low < 0
    bounded = bounded_t_interval(seeds, 0.95, 0.0, 1.0)
    mean, sem, t = np.mean(seeds), stats.sem(seeds), stats.t.ppf(0.975, 2)
    assert (bounded.mean, bounded.low, bounded.high) == pytest.approx((mean, 0.0, mean + t * sem))
    assert bounded.n == 3 and interval_method(seeds, 0.0, 1.0) == "t-clipped"
    inside = bounded_t_interval([0.60, 0.62, 0.64], 0.95, 0.0, 1.0)  # far from the bounds: the t-interval itself
    assert inside == t_interval([0.60, 0.62, 0.64])
    assert interval_method([0.60, 0.62, 0.64], 0.0, 1.0) == "t"


def test_a_value_moving_onto_a_bound_moves_the_interval_by_as_little():
    """(0, 0.004, 0.008) and (0.0001, 0.004, 0.008) of [0, 1]: one method, so close bounds (the logit
    delta method gave 1.39 points for the first, through the truncated fallback, and 4.45 for the second)."""
    on_bound = bounded_t_interval([0.0, 0.004, 0.008], 0.95, 0.0, 1.0)
    inside = bounded_t_interval([0.0001, 0.004, 0.008], 0.95, 0.0, 1.0)
    t = stats.t.ppf(0.975, 2)
    assert on_bound.high == pytest.approx(0.004 + t * 0.004 / np.sqrt(3))  # 0.01394: 1.39 points
    assert inside.high == pytest.approx(np.mean([0.0001, 0.004, 0.008]) + t * stats.sem([0.0001, 0.004, 0.008]))
    assert abs(inside.high - on_bound.high) < 2e-4 and on_bound.low == inside.low == 0.0


def test_bounded_interval_handles_degenerate_samples_and_one_sided_ranges():
    gains = [0.005, 0.01, 0.02, 0.001]  # a non-negative gain: cut at 0 only
    bounded = bounded_t_interval(gains, 0.95, 0.0)
    mean, sem, t = np.mean(gains), stats.sem(gains), stats.t.ppf(0.975, 3)
    assert (bounded.low, bounded.high) == pytest.approx((max(0.0, mean - t * sem), mean + t * sem))
    same = bounded_t_interval([0.0, 0.0, 0.0], 0.95, 0.0, 1.0)
    assert (same.low, same.high) == (0.0, 0.0)  # every value on the bound: zero width, no division by 0
    assert np.isnan(bounded_t_interval([0.3], 0.95, 0.0, 1.0).low) and interval_method([0.3]) == "none"
    assert bounded_t_interval([-1.0, 2.0, 0.5], 0.95, -np.inf) == t_interval([-1.0, 2.0, 0.5])  # no bound
    assert interval_method([-1.0, 2.0], -np.inf) == "t"
    with pytest.raises(ValueError, match=r"values outside \[0, 1\]: -0.1 to 0.5"):
        bounded_t_interval([-0.1, 0.5], 0.95, 0.0, 1.0)
    gains = [0.0, 0.0, 4.0]  # test-set feedback gains in points of [0, 100]: [0, mean + t sem] = [0, 7.07]
    feedback = bounded_t_interval(gains, 0.95, 0.0, 100.0)
    assert (feedback.low, feedback.high) == pytest.approx((0.0, 4 / 3 + stats.t.ppf(0.975, 2) * stats.sem(gains)))
    ranks = bounded_t_interval([1, 1, 2, 1], 0.95, 1, 4)  # a rank among 4 losses, three of them on the bound
    assert ranks.low == 1 and ranks.high == pytest.approx(1.25 + stats.t.ppf(0.975, 3) * 0.25)
    top = bounded_t_interval([1.0, 0.9, 0.95], 0.95, 0.0, 1.0)  # a score at its upper bound
    assert top.high == 1.0 and top.low == pytest.approx(0.95 - stats.t.ppf(0.975, 2) * stats.sem([1.0, 0.9, 0.95]))


def test_bounded_interval_covers_a_skewed_proportion_like_the_t_interval_and_stays_in_range():
    """Monte Carlo: Beta(1, 12) scores (mean 1/13, skewed towards 0), 5 seeds, 4,000 draws: clipping keeps
    the t-interval's coverage (a little under 95% for so skewed a quantity and so few runs) and [0, 1]."""
    rng = np.random.default_rng(7)
    draws = rng.beta(1, 12, size=(4000, 5))
    intervals = [bounded_t_interval(d, 0.95, 0.0, 1.0) for d in draws]
    covered = np.mean([i.low <= 1 / 13 <= i.high for i in intervals])
    plain = [t_interval(d) for d in draws]
    assert covered == np.mean([i.low <= 1 / 13 <= i.high for i in plain])  # the same coverage (0.89 here)
    assert 0.86 <= covered <= 0.95
    assert all(0 <= i.low <= i.high <= 1 for i in intervals)
    assert np.mean([i.low < 0 for i in plain]) > 0.3  # the plain t-interval leaves the range (51% here)


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


def test_class_bootstrap_with_equal_classes_is_scipys_bootstrap_of_the_class_means():
    """Equal class sizes: the mean of the queries of the drawn classes is the mean of their class means,
    so resampling classes equals scipy's bootstrap of the class means on the same seed; n = classes."""
    rng = np.random.default_rng(5)
    classes = np.repeat(np.arange(25), 8)
    values = (rng.random(200) < np.repeat(rng.random(25), 8)).astype(float)  # a difficulty per class
    ours = bootstrap_interval(values, 0.95, n_resamples=600, seed=9, clusters=classes)
    class_means = values.reshape(25, 8).mean(axis=1)
    expected = stats.bootstrap(
        (class_means,), np.mean, n_resamples=600, method="percentile", rng=np.random.default_rng(9)
    ).confidence_interval
    assert (ours.low, ours.high) == pytest.approx((expected.low, expected.high), abs=1e-12)
    assert ours.n == 25 and ours.mean == pytest.approx(values.mean())
    queries = bootstrap_interval(values, 0.95, n_resamples=600, seed=9)  # as if the 200 queries were independent
    assert queries.n == 200 and queries.high - queries.low < ours.high - ours.low


def test_class_bootstrap_weighs_unequal_classes_by_their_queries():
    """Two classes of 1 and 3 queries (values 0 and 1): resamples {0,0}, {0,1}, {1,0}, {1,1} give
    0, 3/4, 3/4, 1; with 4,000 resamples the 2.5% quantile is 0 and the 97.5% is 1; the mean is 3/4."""
    interval = bootstrap_interval([0.0, 1.0, 1.0, 1.0], 0.95, n_resamples=4000, seed=1, clusters=[7, 3, 3, 3])
    assert (interval.mean, interval.low, interval.high, interval.n) == (0.75, 0.0, 1.0, 2)
    joint = bootstrap_intervals({"a": [0.0, 1.0, 1.0, 1.0], "b": [1.0, 1.0, 1.0, 1.0]}, clusters=[7, 3, 3, 3])
    assert (joint["b"].low, joint["b"].high, joint["b"].n) == (1.0, 1.0, 2)  # constant: zero width
    one = bootstrap_interval([0.0, 1.0], clusters=[4, 4])  # one class: nothing to resample
    assert np.isnan(one.low) and one.n == 1
    with pytest.raises(ValueError, match="3 labels for 2 queries"):
        bootstrap_interval([0.0, 1.0], clusters=[1, 2, 3])
