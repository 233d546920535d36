"""Confidence intervals: t over repeated runs, per-query bootstrap for one run."""

from __future__ import annotations

import numpy as np
import pytest
from scipy import stats

from dmlbench.evaluate.intervals import bootstrap_interval, bootstrap_intervals, t_interval


def test_t_interval_over_seeds():
    interval = t_interval([0.60, 0.62, 0.64], 0.95)
    # mean 0.62, sd 0.02, sem 0.02/sqrt(3), t_{0.975, 2} = 4.302653
    assert interval.mean == pytest.approx(0.62)
    assert interval.half_width == pytest.approx(4.302653 * 0.02 / np.sqrt(3), rel=1e-5)
    assert interval.n == 3
    single = t_interval([0.5])
    assert single.n == 1 and np.isnan(single.low)


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
