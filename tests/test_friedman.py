"""The Friedman test with its exact p over four datasets (the real benchmark's count): against a brute-force
enumeration of every arrangement and against scipy's permutation test; Nemenyi after it rejects; all ties;
the synthetic dataset never a block beside real ones."""

from __future__ import annotations

from itertools import permutations

import numpy as np
import pandas as pd
import pytest
from scipy import stats

from dmlbench.analysis.friedman import PERMUTATIONS, _rank_sum_squares, friedman
from dmlbench.analysis.statistics import block_datasets, grid_text


def _brute_force_p(values: np.ndarray) -> float:
    """P(S* >= S) over all (k!)^N arrangements of each block's ranks, every one enumerated (no symmetry)."""
    ranks = stats.rankdata(values, axis=1)
    observed = np.sum(ranks.sum(axis=0) ** 2)
    n, k = ranks.shape
    total = np.zeros([1] * n + [k])
    for i, row in enumerate(ranks):  # k! arrangements of block i (tied ranks repeat), on axis i
        arrangements = np.array(list(permutations(row)))
        total = total + arrangements.reshape([1] * i + [len(arrangements)] + [1] * (n - i - 1) + [k])
    squares = np.sum(total.reshape(-1, k) ** 2, axis=1)  # (k!)^N values of S
    assert squares.size == 24**n
    return float(np.mean(squares >= observed - 1e-9))


def test_exact_p_of_four_datasets_equals_brute_force_enumeration_and_scipy():
    # 4 datasets x 4 losses, a near-consistent order with one swap and a tie: 24^4 = 331,776 arrangements
    values = np.array([[4, 3, 2, 1], [4, 3, 1, 2], [4, 2, 3, 1], [3, 3, 2, 1]], dtype=float)
    scores = pd.DataFrame(values, columns=list("abcd"))
    result = friedman(scores)
    assert result.method == "exact"
    assert result.pvalue == pytest.approx(_brute_force_p(values), abs=1e-12)
    three = values[:3]  # scipy's exact test enumerates all (k!)^N arrangements: 13,824 here
    exact = stats.permutation_test(
        list(three.T), _rank_sum_squares, permutation_type="samples", vectorized=True, n_resamples=np.inf,
        alternative="greater",
    )  # fmt: skip
    assert friedman(scores.iloc[:3]).pvalue == pytest.approx(exact.pvalue, abs=1e-12)
    assert result.statistic == pytest.approx(stats.friedmanchisquare(*values.T).statistic)
    assert result.pvalue != pytest.approx(stats.friedmanchisquare(*values.T).pvalue, rel=0.05)  # not chi2's p


def test_one_order_on_every_dataset_reaches_one_in_24_cubed():
    """The smallest p of 4 losses over 4 datasets: the 24 arrangements sharing one order, of 24^4."""
    perfect = pd.DataFrame([[4.0, 3.0, 2.0, 1.0]] * 4, columns=list("abcd"))
    result = friedman(perfect)
    assert result.pvalue == pytest.approx(1 / 24**3) == result.min_pvalue  # 7.2e-5
    assert result.statistic == pytest.approx(12.0)  # N (k - 1)
    two = friedman(perfect.iloc[:2])
    assert two.pvalue == pytest.approx(1 / 24)  # 2 datasets can already reject at 0.05


def test_all_ties_give_p_one_where_scipy_gives_nan():
    tied = pd.DataFrame(np.full((4, 4), 0.5), columns=list("abcd"))
    assert np.isnan(stats.friedmanchisquare(*tied.to_numpy().T).pvalue)  # what is handled
    result = friedman(tied)
    assert (result.statistic, result.pvalue, result.method) == (0.0, 1.0, "all tied")


def test_too_many_arrangements_fall_back_to_a_seeded_permutation_p():
    """7 losses x 4 datasets: 5040^3 arrangements; a shared order is beaten by none of the random ones."""
    ordered = pd.DataFrame([list(range(7, 0, -1))] * 4, columns=list("abcdefg"), dtype=float)
    result = friedman(ordered)
    assert result.method == "permutation" and result.pvalue == pytest.approx(1 / (PERMUTATIONS + 1))
    rng = np.random.default_rng(5)
    noise = pd.DataFrame(rng.random((4, 7)), columns=list("abcdefg"))
    p = friedman(noise).pvalue
    assert p == friedman(noise).pvalue  # seeded
    chi2 = stats.friedmanchisquare(*noise.to_numpy().T).pvalue
    assert abs(p - chi2) < 0.1  # close to the approximation where k is large enough for it


def test_four_synthetic_datasets_reject_and_nemenyi_runs():
    from dmlbench.analysis.numbers import significance_tests

    rng = np.random.default_rng(0)
    rows = []
    for d in range(4):
        for dim in (32, 64):
            for seed in range(3):
                for loss, quality in {"a": 0.7, "b": 0.5, "c": 0.3, "d": 0.1}.items():
                    rows.append((f"data{d}", "tiny", loss, dim, seed, "map_at_r", quality + rng.normal(0, 0.001)))
    runs = pd.DataFrame(rows, columns=["dataset", "backbone", "loss", "dim", "seed", "metric", "value"])
    tests = significance_tests(runs, "map_at_r", list("abcd"), 0.95, 0.05, 0.01)
    assert tests.skipped is None and tests.friedman.method == "exact"
    assert tests.friedman.pvalue == pytest.approx(1 / 24**3)
    assert tests.nemenyi is not None and tests.nemenyi.loc["a", "d"] < 0.05  # mean ranks 1 vs 4, CD = 2.35
    assert tests.wins is None  # sign tests over 4 datasets cannot reach 0.05 (2 / 2^4): not run
    # the same with the offline demo's glyphs beside them: still 4 blocks, glyphs left out
    glyphs = runs[runs["dataset"] == "data0"].assign(dataset="glyphs", value=lambda f: 1 - f["value"])
    mixed = pd.concat([runs, glyphs], ignore_index=True)
    tests = significance_tests(mixed, "map_at_r", list("abcd"), 0.95, 0.05, 0.01, synthetic=["glyphs"])
    assert list(tests.blocks.ranks.index) == ["data0", "data1", "data2", "data3"]
    assert tests.friedman.pvalue == pytest.approx(1 / 24**3)
    assert tests.grid.endswith("`glyphs` left out: a synthetic dataset is never a block beside real ones")
    assert grid_text(glyphs, "map_at_r", ["glyphs"]).startswith("1 dataset (2 experiments")  # alone it is one


def test_block_datasets_drop_synthetic_ones_only_beside_real_ones():
    assert block_datasets(["glyphs", "cub200", "sop"], ["glyphs"]) == ["cub200", "sop"]
    assert block_datasets(["glyphs"], ["glyphs"]) == ["glyphs"]
    assert block_datasets(["cub200", "cub200", "sop"]) == ["cub200", "sop"]
