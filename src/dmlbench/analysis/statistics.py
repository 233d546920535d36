"""Statistics beyond the thesis: are the losses' differences real?

* Friedman test (scipy) over blocks: rows = blocks (experiments, or experiment x seed),
  columns = losses; H0: every loss has the same expected rank. Blocks must be independent
  (Demšar 2006 uses data sets): an experiment (dataset x backbone x dim) scored by its seed mean
  is one block; the seeds of one experiment are not independent blocks. Not run below
  :data:`MIN_BLOCKS` blocks (:func:`friedman_shortfall`).
* Nemenyi post-hoc test (scikit-posthocs ``posthoc_nemenyi_friedman``) and Demšar's (2006)
  critical difference CD = q_alpha * sqrt(k (k + 1) / (6 N)), q_alpha = studentized range
  quantile / sqrt(2): two losses whose mean ranks differ by more than CD differ at level alpha.
* Win rates: how often loss A beats loss B over the blocks, with a Wilson interval and a
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

BLOCKS = ("experiment", "experiment_seed")
CELL = ["dataset", "backbone", "dim"]

MIN_BLOCKS = 5
"""Fewest blocks on which the Friedman and Nemenyi tests are run (the issue's floor).

Demšar (2006, JMLR 7, Sec. 3.2.2) trusts the Friedman chi2 approximation for N > 10 blocks and
k > 5 losses and points to exact tables below. With N blocks even a perfect ordering gives only
chi2 = N (k - 1): for k = 4 losses, N = 2 gives p = 0.11 (nothing can be significant), N = 5
gives p = 0.002. Below 5 the tests are not run; from 5 to 10 the report warns that only large
differences can reach significance.
"""


def _complete_cells(runs: pd.DataFrame, metric: str, keys: list[str]) -> pd.DataFrame:
    """Mean ``metric`` per ``keys`` x loss, keeping the rows where every loss has a score."""
    selected = runs[runs["metric"] == metric]
    if selected.empty:
        raise ValueError(f"no scores for metric {metric!r}")
    matrix = selected.pivot_table(index=keys, columns="loss", values="value", aggfunc="mean")
    return matrix.dropna(axis=0, how="any")


def score_matrix(runs: pd.DataFrame, metric: str, blocks: str = "experiment") -> pd.DataFrame:
    """Scores of ``metric`` as blocks x losses (a complete block design).

    ``runs``: long table with dataset, backbone, loss, dim, seed, metric, value.
    ``experiment``: one block per (dataset, backbone, dim), scored by the seed mean
    (1/S) sum_s score_s - the independent blocks of Demšar (2006);
    ``experiment_seed``: one block per (dataset, backbone, dim, seed) - seed k gives every loss
    the same initial weights and batches, so the runs of one seed are matched, but the seeds of
    one experiment share its data and are not independent blocks.
    Blocks where some loss has no score are dropped.
    """
    if blocks not in BLOCKS:
        raise ValueError(f"blocks must be one of {', '.join(BLOCKS)}; got {blocks!r}")
    keys = CELL + (["seed"] if blocks == "experiment_seed" else [])
    matrix = _complete_cells(runs, metric, keys)
    matrix.index = [
        "/".join(f"seed{v}" if k == "seed" else str(v) for k, v in zip(keys, idx, strict=True)) for idx in matrix.index
    ]
    matrix.columns.name = None
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
    """``2 experiments (1 dataset x 1 backbone x 2 embedding sizes)``: the complete experiments of ``metric``."""
    cells = _complete_cells(runs, metric, CELL).index
    counts = [cells.get_level_values(key).nunique() for key in CELL]
    words = [("dataset", "datasets"), ("backbone", "backbones"), ("embedding size", "embedding sizes")]
    parts = " x ".join(f"{c} {one if c == 1 else many}" for c, (one, many) in zip(counts, words, strict=True))
    return f"{len(cells)} experiment{'' if len(cells) == 1 else 's'} ({parts})"


def friedman_shortfall(scores: pd.DataFrame, blocks: str, grid: str = "") -> str | None:
    """Why the Friedman/Nemenyi tests are not run on ``scores`` (blocks x losses), or None.

    They need >= 3 losses and >= :data:`MIN_BLOCKS` blocks; ``grid`` (:func:`grid_text`) names
    what the grid has.
    """
    n, k = scores.shape
    if k < 3:
        return f"the Friedman test compares at least 3 losses; the grid has {k}"
    if n >= MIN_BLOCKS:
        return None
    if blocks == "experiment":
        return (
            f"they need at least {MIN_BLOCKS} independent blocks (Demšar 2006 uses data sets as blocks); "
            f"this grid has {grid or f'{n} experiments'}; add datasets, backbones or embedding sizes"
        )
    return f"they need at least {MIN_BLOCKS} blocks; this grid has {n} experiment x seed blocks"


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
