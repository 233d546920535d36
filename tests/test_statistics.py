"""Friedman, Nemenyi, critical difference, win rates and relative improvements on inputs with known outcomes."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest

from dmlbench.analysis.statistics import (
    critical_difference,
    friedman,
    mean_ranks,
    nemenyi,
    relative_improvement,
    score_matrix,
    win_rates,
)


def _blocks(values: np.ndarray, losses: list[str]) -> pd.DataFrame:
    return pd.DataFrame(values, columns=losses, index=[f"b{i}" for i in range(len(values))])


def test_friedman_on_a_perfect_ordering_matches_the_closed_form():
    # 10 blocks, a > b > c in every block: mean ranks 1, 2, 3 and
    # chi2 = 12 N / (k (k + 1)) * sum R_j^2 - 3 N (k + 1) = 10 * 14 - 120 = 20, p = exp(-20 / 2) (2 df).
    rng = np.random.default_rng(0)
    base = rng.uniform(0.2, 0.6, size=(10, 1))
    scores = _blocks(base + np.array([0.3, 0.2, 0.1]), ["a", "b", "c"])
    result = friedman(scores)
    assert result.statistic == pytest.approx(20.0)
    assert result.pvalue == pytest.approx(math.exp(-10))
    assert list(result.mean_ranks.index) == ["a", "b", "c"]
    assert list(result.mean_ranks) == [1.0, 2.0, 3.0]
    assert (result.n_blocks, result.n_losses) == (10, 3)


def test_friedman_keeps_its_level_when_losses_do_not_differ():
    rng = np.random.default_rng(1)
    pvalues = [friedman(_blocks(rng.normal(size=(8, 4)), list("abcd"))).pvalue for _ in range(400)]
    false_positives = np.mean(np.array(pvalues) < 0.05)
    assert 0.01 <= false_positives <= 0.09
    # and it detects a real shift of one loss
    shifted = [
        friedman(_blocks(rng.normal(size=(8, 4)) + [2.5, 0, 0, 0], list("abcd"))).pvalue < 0.05 for _ in range(100)
    ]
    assert np.mean(shifted) > 0.8


def test_friedman_needs_three_losses_and_two_blocks():
    with pytest.raises(ValueError, match=">= 3 losses and >= 2 blocks; got 2 losses, 5 blocks"):
        friedman(_blocks(np.ones((5, 2)), ["a", "b"]))
    with pytest.raises(ValueError, match="got 3 losses, 1 blocks"):
        friedman(_blocks(np.ones((1, 3)), ["a", "b", "c"]))


def test_critical_difference_matches_demsar_table():
    # Demšar (2006) Table 5(a): q_0.05 = 2.343 (k=3), 2.569 (k=4), 3.164 (k=10); q_0.10 = 2.291 (k=4)
    for k, q in ((3, 2.343), (4, 2.569), (10, 3.164)):
        assert critical_difference(k, 14, 0.05) == pytest.approx(q * math.sqrt(k * (k + 1) / (6 * 14)), abs=2e-3)
    assert critical_difference(4, 30, 0.10) == pytest.approx(2.291 * math.sqrt(20 / 180), abs=2e-3)


def test_nemenyi_agrees_with_the_critical_difference():
    # perfect ordering a > b > c over 10 blocks: CD(k=3, N=10) = 1.048; a-c differ by 2 (significant),
    # neighbours by 1 (not significant)
    scores = _blocks(np.tile([0.9, 0.8, 0.7], (10, 1)) + np.arange(10)[:, None] * 0.001, ["a", "b", "c"])
    pvalues = nemenyi(scores)
    assert pvalues.loc["a", "c"] < 0.05 < pvalues.loc["a", "b"]
    assert pvalues.loc["b", "c"] > 0.05
    assert pvalues.loc["a", "c"] == pytest.approx(pvalues.loc["c", "a"])
    # on random data: |mean rank difference| > CD exactly when p < alpha
    rng = np.random.default_rng(2)
    for _ in range(20):
        scores = _blocks(rng.normal(size=(12, 5)) + np.linspace(1.5, 0, 5), list("abcde"))
        pvalues, ranks = nemenyi(scores), mean_ranks(scores)
        cd = critical_difference(5, 12, 0.05)
        for x in scores.columns:
            for y in scores.columns:
                if x < y and abs(abs(ranks[x] - ranks[y]) - cd) > 1e-6:
                    assert (abs(ranks[x] - ranks[y]) > cd) == (pvalues.loc[x, y] < 0.05)


def test_win_rates_wilson_interval_and_sign_test():
    # a beats b in 8 blocks, loses 2, ties 2
    a = np.array([1, 1, 1, 1, 1, 1, 1, 1, 0, 0, 0.5, 0.5])
    b = np.array([0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 0.5, 0.5])
    table = win_rates(_blocks(np.stack([a, b], axis=1), ["a", "b"])).set_index(["loss", "opponent"])
    row = table.loc[("a", "b")]
    assert (row["wins"], row["defeats"], row["ties"], row["n"]) == (8, 2, 2, 10)
    assert row["rate"] == pytest.approx(0.8)
    assert (row["low"], row["high"]) == pytest.approx((0.4902, 0.9433), abs=1e-4)  # Wilson 95%, 8/10
    assert row["p_value"] == pytest.approx(0.109375)  # 2 * P(X <= 2), X ~ Bin(10, 1/2)
    mirror = table.loc[("b", "a")]
    assert mirror["rate"] == pytest.approx(0.2) and mirror["p_value"] == pytest.approx(0.109375)
    tied = win_rates(_blocks(np.ones((3, 2)), ["a", "b"]))
    assert tied["n"].eq(0).all() and tied["rate"].isna().all()


def test_relative_improvement_interval_covers_the_truth():
    rng = np.random.default_rng(3)
    truth = 0.6 / 0.5 - 1
    hits, widths = 0, []
    for _ in range(2000):
        a, b = rng.normal(0.6, 0.03, size=5), rng.normal(0.5, 0.03, size=4)
        interval = relative_improvement(a, b, 0.95)
        hits += interval.low <= truth <= interval.high
        widths.append(interval.high - interval.low)
    assert 0.93 <= hits / 2000 <= 0.97
    exact = relative_improvement(np.array([0.6, 0.6]), np.array([0.5, 0.5]))
    assert (exact.estimate, exact.low, exact.high) == pytest.approx((0.2, 0.2, 0.2))
    single = relative_improvement(np.array([0.6]), np.array([0.5, 0.52]))
    assert single.estimate == pytest.approx(0.6 / 0.51 - 1) and math.isnan(single.low)


def test_score_matrix_blocks():
    rows = []
    for dim in (32, 64):
        for seed in (0, 1):
            for loss, score in (("a", 0.5), ("b", 0.4)):
                rows.append(("glyphs", "tiny", loss, dim, seed, "map_at_r", score + 0.01 * seed + 0.001 * dim))
    runs = pd.DataFrame(rows, columns=["dataset", "backbone", "loss", "dim", "seed", "metric", "value"])
    per_seed = score_matrix(runs, "map_at_r", "experiment_seed")
    assert per_seed.shape == (4, 2) and "glyphs/tiny/32/seed1" in per_seed.index
    per_experiment = score_matrix(runs, "map_at_r", "experiment")
    assert per_experiment.shape == (2, 2)
    assert per_experiment.loc["glyphs/tiny/64", "a"] == pytest.approx(0.5 + 0.005 + 0.064)
    incomplete = runs.drop(index=runs.index[(runs["loss"] == "b") & (runs["dim"] == 64)])
    assert score_matrix(incomplete, "map_at_r", "experiment").index.tolist() == ["glyphs/tiny/32"]
    with pytest.raises(ValueError, match="blocks must be one of"):
        score_matrix(runs, "map_at_r", "seed")
