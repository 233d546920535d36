"""Friedman, Nemenyi, critical difference, Holm-adjusted win rates, relative improvements and the Bayesian
comparison on inputs with known outcomes."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest

from dmlbench.analysis import bayesian as bz
from dmlbench.analysis.friedman import MIN_FRIEDMAN_BLOCKS, friedman, mean_ranks
from dmlbench.analysis.statistics import (
    MIN_BLOCKS,
    critical_difference,
    dataset_blocks,
    dataset_means,
    experiment_scores,
    friedman_shortfall,
    grid_text,
    holm,
    nemenyi,
    relative_improvement,
    seed_scores,
    win_rates,
)


def _blocks(values: np.ndarray, losses: list[str]) -> pd.DataFrame:
    return pd.DataFrame(values, columns=losses, index=[f"b{i}" for i in range(len(values))])


def test_friedman_on_a_perfect_ordering_matches_the_closed_form():
    # 10 blocks, a > b > c in every block: mean ranks 1, 2, 3 and
    # chi2 = 12 N / (k (k + 1)) * sum R_j^2 - 3 N (k + 1) = 10 * 14 - 120 = 20 (scipy's statistic). Exact p:
    # only the 6 arrangements with one order in every block reach it, 6 of 6^10: p = 6^-9 (chi2(2): exp(-10)).
    rng = np.random.default_rng(0)
    base = rng.uniform(0.2, 0.6, size=(10, 1))
    scores = _blocks(base + np.array([0.3, 0.2, 0.1]), ["a", "b", "c"])
    result = friedman(scores)
    from scipy.stats import friedmanchisquare

    assert result.statistic == pytest.approx(20.0) == friedmanchisquare(*scores.to_numpy().T).statistic
    assert result.method == "exact" and result.pvalue == pytest.approx(6.0**-9) == result.min_pvalue
    assert list(result.mean_ranks.index) == ["a", "b", "c"]
    assert list(result.mean_ranks) == [1.0, 2.0, 3.0]
    assert (result.n_blocks, result.n_losses) == (10, 3)


def test_friedman_keeps_its_level_when_losses_do_not_differ():
    rng = np.random.default_rng(1)
    pvalues = [friedman(_blocks(rng.normal(size=(4, 4)), list("abcd"))).pvalue for _ in range(400)]
    false_positives = np.mean(np.array(pvalues) < 0.05)
    assert 0.01 <= false_positives <= 0.06  # exact: at most 0.05 (a discrete test stays below its level)
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
    assert (row["p_holm"], row["m"]) == (pytest.approx(0.109375), 1)  # one pair: nothing to adjust
    tied = win_rates(_blocks(np.ones((3, 2)), ["a", "b"]))
    assert tied["n"].eq(0).all() and tied["rate"].isna().all() and tied["p_holm"].isna().all()
    assert tied["m"].eq(0).all()


def test_holm_matches_hand_computed_values_and_statsmodels():
    # sorted: 0.005, 0.01, 0.03, 0.04, 0.04, 0.2 (m = 6) -> x 6, 5, 4, 3, 2, 1 = 0.03, 0.05, 0.12, 0.12, 0.08, 0.2;
    # running maximum: 0.03, 0.05, 0.12, 0.12, 0.12, 0.2
    p = np.array([0.01, 0.04, 0.03, 0.005, 0.2, 0.04])
    expected = [0.05, 0.12, 0.12, 0.03, 0.2, 0.12]
    assert holm(p) == pytest.approx(expected)
    assert holm(np.array([0.5, 0.6])) == pytest.approx([1.0, 1.0])  # capped at 1
    with_nan = holm(np.array([0.01, np.nan, 0.04]))  # NaN = no test: left out of the family (m = 2)
    assert with_nan[0] == pytest.approx(0.02) and math.isnan(with_nan[1]) and with_nan[2] == pytest.approx(0.04)
    multitest = pytest.importorskip("statsmodels.stats.multitest")
    rng = np.random.default_rng(4)
    for _ in range(20):
        p = rng.uniform(0, 0.2, size=10)
        assert holm(p) == pytest.approx(multitest.multipletests(p, method="holm")[1])


def test_win_rates_adjust_each_unordered_pair_once():
    # a > b > c in all 6 blocks: every pair 6/0, sign test p = 2 / 2^6 = 0.03125 each; Holm over m = 3 pairs:
    # 3p, max(3p, 2p), max(3p, 2p, p) = 0.09375 for all
    scores = _blocks(np.tile([0.9, 0.8, 0.7], (6, 1)), ["a", "b", "c"])
    table = win_rates(scores).set_index(["loss", "opponent"])
    assert len(table) == 6 and table["m"].eq(3).all()
    assert table["p_value"].to_numpy() == pytest.approx(np.full(6, 0.03125))
    assert table["p_holm"].to_numpy() == pytest.approx(np.full(6, 0.09375))
    assert table.loc[("c", "a"), "rate"] == 0 and table.loc[("a", "c"), "rate"] == 1
    assert (table.loc[("c", "a"), "low"], table.loc[("c", "a"), "high"]) == pytest.approx(
        (1 - table.loc[("a", "c"), "high"], 1 - table.loc[("a", "c"), "low"])
    )


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


def _runs(dims=(32, 64), seeds=(0, 1), datasets=("glyphs",)) -> pd.DataFrame:
    rows = []
    for dataset in datasets:
        for dim in dims:
            for seed in seeds:
                for loss, score in (("a", 0.5), ("b", 0.4)):
                    rows.append((dataset, "tiny", loss, dim, seed, "map_at_r", score + 0.01 * seed + 0.001 * dim))
    return pd.DataFrame(rows, columns=["dataset", "backbone", "loss", "dim", "seed", "metric", "value"])


def test_experiment_scores_are_seed_means_of_complete_experiments():
    runs = _runs()
    per_experiment = experiment_scores(runs, "map_at_r")
    assert per_experiment.shape == (2, 2)
    assert per_experiment.loc["glyphs/tiny/64", "a"] == pytest.approx(0.5 + 0.005 + 0.064)  # (0.564 + 0.574) / 2
    incomplete = runs.drop(index=runs.index[(runs["loss"] == "b") & (runs["dim"] == 64)])
    assert experiment_scores(incomplete, "map_at_r").index.tolist() == ["glyphs/tiny/32"]


def test_dataset_blocks_average_the_ranks_of_a_datasets_experiments():
    """Dims and backbones of one dataset are repeated measures: one block per dataset, holding each
    loss's mean rank over the dataset's experiments."""
    rows = []
    # cub200: a first at dim 32 and 64, b first at dim 128 -> a: (1 + 1 + 2) / 3, b: (2 + 2 + 1) / 3, c: 3
    for dim, order in ((32, "abc"), (64, "abc"), (128, "bac")):
        for seed in (0, 1):
            for rank, loss in enumerate(order):
                rows.append(("cub200", "tiny", loss, dim, seed, "map_at_r", 0.9 - 0.1 * rank + 0.001 * seed))
    # sop: c > b > a on one backbone, a tie b = c on another -> b: (2 + 1.5) / 2, c: (1 + 1.5) / 2
    for backbone, scores in (("tiny", {"a": 0.1, "b": 0.2, "c": 0.3}), ("big", {"a": 0.1, "b": 0.5, "c": 0.5})):
        for seed in (0, 1):
            for loss, score in scores.items():
                rows.append(("sop", backbone, loss, 64, seed, "map_at_r", score))
    runs = pd.DataFrame(rows, columns=["dataset", "backbone", "loss", "dim", "seed", "metric", "value"])
    blocks = dataset_blocks(runs, "map_at_r")
    assert list(blocks.ranks.index) == ["cub200", "sop"] and len(blocks) == 2
    assert blocks.ranks.loc["cub200"].to_dict() == pytest.approx({"a": 4 / 3, "b": 5 / 3, "c": 3.0})
    assert blocks.ranks.loc["sop"].to_dict() == pytest.approx({"a": 3.0, "b": (2 + 1.5) / 2, "c": (1 + 1.5) / 2})
    assert blocks.experiments.to_dict() == {"cub200": 3, "sop": 2}
    assert (blocks.scores == -blocks.ranks).all().all()  # the tests read higher = better
    means = dataset_means(runs, "map_at_r")
    assert means.loc["sop", "b"] == pytest.approx((0.2 + 0.5) / 2)
    assert means.loc["cub200", "a"] == pytest.approx((0.9 + 0.9 + 0.8) / 3 + 0.0005)  # seed mean of 0.x, 0.x + 0.001


def test_seed_scores_and_grid_text():
    runs = _runs(dims=(32, 64, 128), seeds=(0, 1, 2), datasets=("glyphs", "cub200"))
    seeds = seed_scores(runs, "map_at_r")
    assert sorted(seeds) == sorted(f"{d}/tiny/{dim}" for d in ("glyphs", "cub200") for dim in (32, 64, 128))
    block = seeds["glyphs/tiny/64"]
    assert list(block.index) == ["seed0", "seed1", "seed2"] and list(block.columns) == ["a", "b"]
    assert block.loc["seed2", "b"] == pytest.approx(0.4 + 0.02 + 0.064)
    assert grid_text(runs, "map_at_r") == "2 datasets (6 experiments: 1 backbone x 3 embedding sizes)"
    assert grid_text(_runs(dims=(32,), seeds=(0,)), "map_at_r") == (
        "1 dataset (1 experiment: 1 backbone x 1 embedding size)"
    )


def test_friedman_needs_two_independent_blocks_and_three_losses():
    assert MIN_FRIEDMAN_BLOCKS == 2 and MIN_BLOCKS == 5  # MIN_BLOCKS: the sign tests and the Bayesian test
    one = _blocks(np.ones((1, 3)), ["a", "b", "c"])
    why = friedman_shortfall(one, "1 dataset (2 experiments: 1 backbone x 2 embedding sizes)")
    assert why == (
        "they need at least 2 independent blocks, and the independent unit is the dataset (Demšar 2006): "
        "backbones and embedding sizes on one dataset share its training and test images, so they are repeated "
        "measures of one block; this grid has 1 dataset (2 experiments: 1 backbone x 2 embedding sizes), so only "
        "the per-experiment tests over seeds apply; add datasets"
    )
    assert friedman_shortfall(_blocks(np.ones((2, 3)), ["a", "b", "c"])) is None
    assert "at least 3 losses; the grid has 2" in friedman_shortfall(_blocks(np.ones((9, 2)), ["a", "b"]))


def _grid(datasets: int, dims: tuple[int, ...], quality: dict[str, float], noise: float, seed: int = 0) -> pd.DataFrame:
    rng = np.random.default_rng(seed)
    rows = []
    for d in range(datasets):
        for dim in dims:
            for s in range(3):
                for loss, q in quality.items():
                    rows.append((f"data{d}", "tiny", loss, dim, s, "map_at_r", q + rng.normal(0, noise)))
    return pd.DataFrame(rows, columns=["dataset", "backbone", "loss", "dim", "seed", "metric", "value"])


def test_one_dataset_with_three_dims_refuses_the_tests_and_says_why():
    from dmlbench.analysis.numbers import rank_intervals, significance_tests

    runs = _grid(1, (32, 64, 128), {"a": 0.7, "b": 0.5, "c": 0.3, "d": 0.1}, 0.001)
    tests = significance_tests(runs, "map_at_r", ["a", "b", "c", "d"], 0.95, 0.05, 0.01)
    assert tests.friedman is None and tests.nemenyi is None and tests.cd is None and tests.wins is None
    assert (tests.datasets, tests.experiments) == (1, 3)
    assert tests.skipped.endswith(
        "this grid has 1 dataset (3 experiments: 1 backbone x 3 embedding sizes), so only the per-experiment "
        "tests over seeds apply; add datasets"
    )
    assert bz.ACROSS not in set(tests.bayes["experiment"])  # 3 experiments of one dataset are not pooled
    intervals = rank_intervals(tests.blocks, 0.95)
    assert intervals["a"].n == 1 and math.isnan(intervals["a"].low)  # one dataset: no interval over datasets


def test_five_datasets_run_friedman_and_nemenyi_follows_only_a_significant_one():
    from dmlbench.analysis.numbers import rank_intervals, significance_tests

    # a > b > c > d on every one of 5 datasets (2 dims each): chi2 = N (k - 1) = 15, p = 0.0018
    runs = _grid(5, (32, 64), {"a": 0.7, "b": 0.5, "c": 0.3, "d": 0.1}, 0.001)
    tests = significance_tests(runs, "map_at_r", ["a", "b", "c", "d"], 0.95, 0.05, 0.01)
    assert tests.skipped is None and tests.friedman.n_blocks == 5 and tests.experiments == 10
    assert tests.friedman.statistic == pytest.approx(15.0)
    assert tests.nemenyi is not None and tests.cd == pytest.approx(critical_difference(4, 5))
    assert tests.nemenyi.loc["a", "d"] < 0.05
    wins = tests.wins.set_index(["loss", "opponent"])
    assert (wins.loc[("a", "b"), "wins"], wins.loc[("a", "b"), "n"]) == (5, 5)  # counted over datasets, not dims
    across = tests.bayes[tests.bayes["experiment"] == bz.ACROSS]
    assert across["n"].eq(5).all() and len(across) == 3
    intervals = rank_intervals(tests.blocks, 0.95)
    assert intervals["a"].n == 5 and intervals["a"].mean == 1.0
    # the same losses indistinguishable: Friedman runs but finds nothing, and no Nemenyi pair is shown
    flat = _grid(6, (32,), {"a": 0.5, "b": 0.5, "c": 0.5, "d": 0.5}, 0.05, seed=3)
    tests = significance_tests(flat, "map_at_r", ["a", "b", "c", "d"], 0.95, 0.05, 0.01)
    assert tests.friedman is not None and tests.friedman.pvalue >= 0.05
    assert tests.nemenyi is None and tests.cd is None


def test_seed_comparison_matches_the_student_posterior_in_closed_form():
    # differences 0.03, 0.05, 0.04: mean 0.04, s = 0.01, posterior t_2(0.04, 0.01 / sqrt 3);
    # t_2 cdf: F(t) = 1/2 + t / (2 sqrt(2 + t^2)); P(d > 0.01) = F(3 sqrt 3), P(d < -0.01) = F(-5 sqrt 3)
    a, b = np.array([0.53, 0.55, 0.54]), np.full(3, 0.5)
    result = bz.seed_comparison(a, b, rope=0.01)

    def cdf(t):
        return 0.5 + t / (2 * math.sqrt(2 + t * t))

    assert result.better == pytest.approx(cdf(3 * math.sqrt(3)))  # 0.9824
    assert result.worse == pytest.approx(cdf(-5 * math.sqrt(3)))  # 0.0065
    assert result.better + result.equivalent + result.worse == pytest.approx(1)
    assert (result.n, result.difference) == (3, pytest.approx(0.04))
    half = 4.302653 * 0.01 / math.sqrt(3)  # t_{2, 0.975} s / sqrt(n): the 95% t-interval
    assert (result.low, result.high) == pytest.approx((0.04 - half, 0.04 + half), abs=1e-6)
    assert result.verdict == "better"
    mirror = bz.seed_comparison(b, a, rope=0.01)  # swapping the losses swaps better and worse
    assert (mirror.better, mirror.worse) == pytest.approx((result.worse, result.better))


def test_seed_comparison_without_rope_is_the_one_sided_t_test():
    # flat prior, rho = 0: P(d > 0 | data) = 1 - (one-sided paired t-test p)
    from scipy import stats

    rng = np.random.default_rng(5)
    for _ in range(10):
        a, b = rng.normal(0.5, 0.02, size=4), rng.normal(0.49, 0.02, size=4)
        result = bz.seed_comparison(a, b, rope=0)
        p = stats.ttest_rel(a, b, alternative="greater").pvalue
        assert result.better == pytest.approx(1 - p) and result.equivalent == 0


def test_seed_comparison_known_outcomes():
    rng = np.random.default_rng(6)
    base = rng.normal(0.5, 0.02, size=3)
    clearly_better = bz.seed_comparison(base + 0.05 + rng.normal(0, 0.003, 3), base, rope=0.01)
    assert clearly_better.better > 0.95 and clearly_better.verdict == "better"
    same = bz.seed_comparison(base + rng.normal(0, 0.001, 10)[:3], base, rope=0.01)
    assert same.equivalent > 0.95 and same.verdict == "equivalent"
    noisy = bz.seed_comparison(base + 0.01 + np.array([0.03, -0.03, 0.0]), base, rope=0.01)
    assert noisy.verdict == "undecided"  # 3 seeds that disagree decide nothing
    identical = bz.seed_comparison(base, base, rope=0.01)
    assert (identical.better, identical.equivalent, identical.worse) == (0, 1, 0)
    with pytest.raises(ValueError, match="at least 2 matched seeds; got 1"):
        bz.seed_comparison(base[:1], base[:1], rope=0.01)


def test_dataset_comparison_signed_rank_known_outcomes_and_reproducible():
    rng = np.random.default_rng(7)
    b = rng.uniform(0.3, 0.7, size=8)
    better = bz.dataset_comparison(b + rng.uniform(0.03, 0.06, 8), b, rope=0.01, nsamples=5000)
    assert better.better > 0.95 and better.n == 8
    again = bz.dataset_comparison(b + rng.uniform(0.03, 0.06, 8), b, rope=0.01, nsamples=5000)
    assert again.better > 0.95
    equal = bz.dataset_comparison(b + rng.normal(0, 0.001, 8), b, rope=0.01, nsamples=5000)
    assert equal.equivalent > 0.95
    a = b + rng.normal(0.01, 0.03, 8)
    first = bz.dataset_comparison(a, b, rope=0.01, nsamples=5000)
    assert first == bz.dataset_comparison(a, b, rope=0.01, nsamples=5000)  # seeded Monte Carlo
    mirror = bz.dataset_comparison(b, a, rope=0.01, nsamples=5000)  # same draws: better and worse swap
    swapped = (mirror.better, mirror.equivalent, mirror.worse)
    assert swapped == pytest.approx((first.worse, first.equivalent, first.better))
    with pytest.raises(ValueError, match="at least 5 datasets; got 4"):
        bz.dataset_comparison(a[:4], b[:4], rope=0.01)


def test_compare_neighbours_per_experiment_and_across_datasets():
    rng = np.random.default_rng(8)
    quality = {"x": 0.6, "y": 0.5, "z": 0.497}
    rows = []
    for dataset in ("d0", "d1", "d2", "d3", "d4"):
        for dim in (16, 32):
            for seed in range(3):
                shared = rng.normal(0, 0.02)  # seed k shares initial weights and batches: matched runs
                for loss, q in quality.items():
                    rows.append((dataset, "tiny", loss, dim, seed, "map_at_r", q + shared + rng.normal(0, 0.001)))
    runs = pd.DataFrame(rows, columns=["dataset", "backbone", "loss", "dim", "seed", "metric", "value"])

    def compare(runs, ranked):
        return bz.compare_neighbours(seed_scores(runs, "map_at_r"), dataset_means(runs, "map_at_r"), ranked, 0.01)

    table = compare(runs, ["x", "y", "z"])
    assert len(table) == 2 * (10 + 1) and table["n"].tolist() == [3] * 10 + [5] + [3] * 10 + [5]
    xy, yz = table[table["a"] == "x"], table[table["a"] == "y"]
    assert (xy["better"] > 0.95).all()  # 10 points apart in every experiment and across datasets
    assert (yz["equivalent"] > 0.5).all() and (yz["better"] < 0.05).all()  # 0.3 points apart: within the ROPE
    across = xy[xy["experiment"] == bz.ACROSS].iloc[0]
    assert across["test"] == "signed-rank" and across["difference"] == pytest.approx(0.1, abs=0.005)
    four = compare(runs[runs["dataset"] != "d4"], ["x", "y"])
    assert bz.ACROSS not in set(four["experiment"]) and len(four) == 8  # 8 experiments of 4 datasets: not pooled
    one_seed = runs[runs["seed"] == 0]
    single = compare(one_seed, ["x", "y"])
    per_experiment = single[single["experiment"] != bz.ACROSS]  # 1 seed: no posterior; 5 dataset means: pooled
    assert per_experiment["better"].isna().all() and per_experiment["n"].eq(1).all() and len(single) == 10 + 1
