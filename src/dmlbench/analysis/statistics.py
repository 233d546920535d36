"""Statistics beyond the thesis: are the losses' differences real?

* Independent blocks. Demšar (2006, JMLR 7) compares classifiers over *data sets*: independent
  samples of the problem. Here the experiments of one dataset (its backbones x embedding sizes)
  share its training and test images, so they are repeated measures of one block, not separate
  blocks. :func:`dataset_blocks` therefore aggregates them: within each experiment the losses are
  ranked by their seed-mean score (1 = best, ties averaged), and a dataset's block holds each
  loss's mean rank over that dataset's experiments. Every test below runs over these dataset
  blocks; the per-experiment tournament stays a description.
* Friedman test (scipy) over the dataset blocks (rows = datasets, columns = losses); H0: every
  loss has the same expected rank. Not run below :data:`MIN_BLOCKS` blocks (:func:`friedman_shortfall`).
* Nemenyi post-hoc test (scikit-posthocs ``posthoc_nemenyi_friedman``) and Demšar's (2006)
  critical difference CD = q_alpha * sqrt(k (k + 1) / (6 N)), q_alpha = studentized range
  quantile / sqrt(2): two losses whose mean ranks differ by more than CD differ at level alpha.
  Read only after a significant Friedman test (Demšar 2006, Sec. 3.2.2).
* Win rates: how often loss A beats loss B over the dataset blocks, with a Wilson interval and a
  two-sided sign test (scipy ``binomtest``); ties are counted but left out of the rate. The
  sign tests of all unordered pairs form one family, adjusted by Holm's (1979) step-down method.
* Relative improvement of one loss over another with a delta-method t-interval.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from itertools import combinations

import numpy as np
import pandas as pd

CELL = ["dataset", "backbone", "dim"]

MIN_BLOCKS = 5
"""Fewest independent blocks (datasets) on which the Friedman, Nemenyi and sign tests are run.

Demšar (2006, JMLR 7, Sec. 3.2.2) trusts the Friedman chi2 approximation for N > 10 blocks and
k > 5 losses and points to exact tables below. With N blocks even a perfect ordering gives only
chi2 = N (k - 1): for k = 4 losses, N = 2 gives p = 0.11 (nothing can be significant), N = 5
gives p = 0.002. A two-sided sign test over N blocks cannot go below p = 2 / 2^N: 0.0625 at N = 5.
Below 5 the tests are not run; from 5 to 10 the report warns that only large differences can
reach significance.
"""


def _complete_cells(runs: pd.DataFrame, metric: str, keys: list[str]) -> pd.DataFrame:
    """Mean ``metric`` per ``keys`` x loss, keeping the rows where every loss has a score."""
    selected = runs[runs["metric"] == metric]
    if selected.empty:
        raise ValueError(f"no scores for metric {metric!r}")
    matrix = selected.pivot_table(index=keys, columns="loss", values="value", aggfunc="mean")
    return matrix.dropna(axis=0, how="any")


def experiment_scores(runs: pd.DataFrame, metric: str) -> pd.DataFrame:
    """Seed-mean scores of ``metric`` as experiments x losses: one row per complete
    (dataset, backbone, dim), indexed ``dataset/backbone/dim``; (1/S) sum_s score_s.

    ``runs``: long table with dataset, backbone, loss, dim, seed, metric, value.
    """
    matrix = _complete_cells(runs, metric, CELL)
    matrix.index = ["/".join(map(str, idx)) for idx in matrix.index]
    matrix.columns.name = None
    return matrix


@dataclass(frozen=True)
class DatasetBlocks:
    """The independent blocks of the tests: one per dataset.

    ``ranks``: datasets x losses, each loss's mean rank over the dataset's complete experiments
    (rank 1 = best within an experiment; ties averaged); ``experiments``: how many experiments
    each dataset's row averages.
    """

    ranks: pd.DataFrame
    experiments: pd.Series

    @property
    def scores(self) -> pd.DataFrame:
        """The blocks as scores (higher = better) for the rank-based tests: minus the mean rank."""
        return -self.ranks

    def __len__(self) -> int:
        return len(self.ranks)


def dataset_blocks(runs: pd.DataFrame, metric: str) -> DatasetBlocks:
    """Aggregate the experiments of each dataset into one block (the module docstring says why).

    R_{d,l} = (1/|E_d|) sum_{e in E_d} rank_e(l), rank_e = rank of the seed-mean ``metric`` of
    loss l among the losses of experiment e (1 = best, ties averaged); E_d = the complete
    experiments (every loss scored) of dataset d.
    """
    matrix = _complete_cells(runs, metric, CELL)
    ranks = matrix.rank(axis=1, ascending=False, method="average")
    per_dataset = ranks.groupby(level="dataset", sort=True)
    blocks = per_dataset.mean()
    blocks.index.name, blocks.columns.name = None, None
    return DatasetBlocks(blocks, per_dataset.size())


def dataset_means(runs: pd.DataFrame, metric: str) -> pd.DataFrame:
    """datasets x losses: the mean over each dataset's complete experiments of their seed-mean
    ``metric`` (the unit of the Bayesian signed-rank test across datasets)."""
    matrix = _complete_cells(runs, metric, CELL).groupby(level="dataset", sort=True).mean()
    matrix.index.name, matrix.columns.name = None, None
    return matrix


def seed_scores(runs: pd.DataFrame, metric: str) -> dict[str, pd.DataFrame]:
    """Per experiment (``dataset/backbone/dim``): its seeds x losses scores of ``metric``.

    Seed k gives every loss the same initial weights and batches, so the rows are matched
    pairs; seeds where some loss has no score are dropped.
    """
    matrix = _complete_cells(runs, metric, CELL + ["seed"])
    experiments: dict[str, pd.DataFrame] = {}
    for cell, block in matrix.groupby(level=CELL, sort=True):
        frame = block.droplevel(CELL)
        frame.index = [f"seed{seed}" for seed in frame.index]
        frame.columns.name = None
        experiments["/".join(map(str, cell))] = frame
    return experiments


def grid_text(runs: pd.DataFrame, metric: str) -> str:
    """``1 dataset (2 experiments: 1 backbone x 2 embedding sizes)``: the independent blocks and the
    complete experiments of ``metric`` they hold."""
    cells = _complete_cells(runs, metric, CELL).index
    counts = [cells.get_level_values(key).nunique() for key in CELL]
    words = [("dataset", "datasets"), ("backbone", "backbones"), ("embedding size", "embedding sizes")]
    text = [f"{c} {one if c == 1 else many}" for c, (one, many) in zip(counts, words, strict=True)]
    return f"{text[0]} ({len(cells)} experiment{'' if len(cells) == 1 else 's'}: {text[1]} x {text[2]})"


def friedman_shortfall(blocks: pd.DataFrame, grid: str = "") -> str | None:
    """Why the Friedman/Nemenyi and sign tests are not run on ``blocks`` (datasets x losses), or None.

    They need >= 3 losses (Friedman) and >= :data:`MIN_BLOCKS` independent blocks; ``grid``
    (:func:`grid_text`) names what the grid has.
    """
    n, k = blocks.shape
    if k < 3:
        return f"the Friedman test compares at least 3 losses; the grid has {k}"
    if n >= MIN_BLOCKS:
        return None
    return (
        f"they need at least {MIN_BLOCKS} independent blocks, and the independent unit is the dataset "
        "(Demšar 2006): backbones and embedding sizes on one dataset share its training and test images, so "
        f"they are repeated measures of one block; this grid has {grid or f'{n} datasets'}; add datasets"
    )


def mean_ranks(scores: pd.DataFrame) -> pd.Series:
    """Mean rank of each loss over the blocks (1 = best score in a block, ties averaged), best first."""
    return scores.rank(axis=1, ascending=False, method="average").mean().sort_values()


@dataclass(frozen=True)
class FriedmanResult:
    statistic: float  # chi-square with k - 1 degrees of freedom (tie-corrected)
    pvalue: float
    n_blocks: int
    n_losses: int
    mean_ranks: pd.Series


def friedman(scores: pd.DataFrame) -> FriedmanResult:
    """Friedman test over the blocks of ``scores`` (needs >= 3 losses and >= 2 blocks)."""
    from scipy import stats

    n, k = scores.shape
    if k < 3 or n < 2:
        raise ValueError(f"the Friedman test needs >= 3 losses and >= 2 blocks; got {k} losses, {n} blocks")
    result = stats.friedmanchisquare(*(scores[column].to_numpy() for column in scores.columns))
    statistic, pvalue = float(result.statistic), float(result.pvalue)
    if not math.isfinite(statistic):  # every block ranks every loss the same way (no within-block variance)
        statistic, pvalue = math.inf, 0.0
    return FriedmanResult(statistic, pvalue, n, k, mean_ranks(scores))


def nemenyi(scores: pd.DataFrame) -> pd.DataFrame:
    """Nemenyi post-hoc p-values (losses x losses) for the blocks of ``scores``."""
    import scikit_posthocs as sp

    pvalues = sp.posthoc_nemenyi_friedman(scores.to_numpy())
    pvalues.index = pvalues.columns = list(scores.columns)
    return pvalues


def critical_difference(k: int, n: int, alpha: float = 0.05) -> float:
    """Demšar's Nemenyi critical difference of mean ranks for ``k`` losses over ``n`` blocks."""
    from scipy.stats import studentized_range

    q_alpha = studentized_range.ppf(1 - alpha, k, np.inf) / math.sqrt(2)
    return float(q_alpha * math.sqrt(k * (k + 1) / (6 * n)))


def holm(pvalues: np.ndarray) -> np.ndarray:
    """Holm's (1979) step-down adjusted p-values of one family of m tests.

    With p_(1) <= ... <= p_(m): p~_(i) = min(1, max_{j <= i} (m - j + 1) p_(j)); rejecting
    p~ < alpha controls the family-wise error rate at alpha. NaN entries (no test) are left
    out of the family and stay NaN.
    """
    pvalues = np.asarray(pvalues, dtype=float)
    adjusted = np.full(pvalues.shape, math.nan)
    tested = np.flatnonzero(~np.isnan(pvalues))
    m = tested.size
    order = tested[np.argsort(pvalues[tested], kind="stable")]
    steps = (m - np.arange(m)) * pvalues[order]
    adjusted[order] = np.minimum(1.0, np.maximum.accumulate(steps))
    return adjusted


def win_rates(scores: pd.DataFrame, confidence: float = 0.95) -> pd.DataFrame:
    """Every ordered pair (loss, opponent): wins, defeats, ties over the blocks of ``scores``.

    rate = wins / (wins + defeats); [low, high] = Wilson interval; p_value = two-sided sign
    test of rate = 1/2; p_holm = Holm-adjusted over the family of the m unordered pairs with a
    decided block (each pair tested once; (A, B) and (B, A) share it), m in column ``m``. With
    no decided block the rate, interval and p-values are NaN.
    """
    from scipy.stats import binomtest

    rows = []
    for loss, opponent in combinations(scores.columns, 2):
        diff = scores[loss].to_numpy() - scores[opponent].to_numpy()
        wins, defeats = int((diff > 0).sum()), int((diff < 0).sum())
        ties = int(len(diff) - wins - defeats)
        decided = wins + defeats
        if decided:
            test = binomtest(wins, decided, 0.5)
            interval = test.proportion_ci(confidence_level=confidence, method="wilson")
            rate, low, high, pvalue = wins / decided, interval.low, interval.high, test.pvalue
        else:
            rate = low = high = pvalue = math.nan
        row = {"wins": wins, "defeats": defeats, "ties": ties, "n": decided, "p_value": pvalue}
        rows.append({"loss": loss, "opponent": opponent, **row, "rate": rate, "low": low, "high": high})
        mirror = {"wins": defeats, "defeats": wins, "rate": 1 - rate, "low": 1 - high, "high": 1 - low}
        rows.append({"loss": opponent, "opponent": loss, **row, **mirror})
    columns = ["loss", "opponent", "wins", "defeats", "ties", "n", "rate", "low", "high", "p_value"]
    table = pd.DataFrame(rows, columns=columns)
    pair_p = table["p_value"].to_numpy()[::2]  # one entry per unordered pair
    table["p_holm"] = np.repeat(holm(pair_p), 2)
    table["m"] = int(np.count_nonzero(~np.isnan(pair_p)))
    return table


@dataclass(frozen=True)
class RatioInterval:
    estimate: float  # mean(a) / mean(b) - 1
    low: float
    high: float
    n_a: int
    n_b: int

    def bounds_or_estimate(self) -> tuple[float, float]:
        """``(low, high)``, or the estimate twice where there is no interval (a sample of one)."""
        return (self.estimate, self.estimate) if math.isnan(self.low) else (self.low, self.high)


def relative_improvement(a: np.ndarray, b: np.ndarray, confidence: float = 0.95) -> RatioInterval:
    """Relative improvement mean(a)/mean(b) - 1 of independent samples, with a t-interval.

    Delta method on log(mean a / mean b): se^2 = s_a^2 / (n_a mean_a^2) + s_b^2 / (n_b mean_b^2),
    Welch-Satterthwaite degrees of freedom; the interval is exp(log ratio +/- t se) - 1.
    NaN bounds when either sample has one value.
    """
    from scipy import stats

    a, b = np.asarray(a, dtype=float), np.asarray(b, dtype=float)
    if a.size == 0 or b.size == 0:
        raise ValueError("relative_improvement needs at least one value in each sample")
    mean_a, mean_b = a.mean(), b.mean()
    if mean_a <= 0 or mean_b <= 0:
        raise ValueError("relative_improvement needs positive means")
    estimate = mean_a / mean_b - 1
    if a.size < 2 or b.size < 2:
        return RatioInterval(float(estimate), math.nan, math.nan, a.size, b.size)
    parts = np.array([a.var(ddof=1) / (a.size * mean_a**2), b.var(ddof=1) / (b.size * mean_b**2)])
    se = math.sqrt(parts.sum())
    if se == 0:
        return RatioInterval(float(estimate), float(estimate), float(estimate), a.size, b.size)
    df = parts.sum() ** 2 / (parts[0] ** 2 / (a.size - 1) + parts[1] ** 2 / (b.size - 1))
    half = stats.t.ppf((1 + confidence) / 2, df) * se
    log_ratio = math.log(mean_a / mean_b)
    return RatioInterval(
        float(estimate), math.exp(log_ratio - half) - 1, math.exp(log_ratio + half) - 1, a.size, b.size
    )
