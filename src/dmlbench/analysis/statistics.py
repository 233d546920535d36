"""Statistics beyond the thesis: are the losses' differences real? (docs/report.md, "Statistical tests")

Every test runs over the dataset blocks of :func:`dataset_blocks` (Demšar 2006, JMLR 7). After the
Friedman test (:mod:`dmlbench.analysis.friedman`) rejects: Nemenyi (scikit-posthocs) with Demšar's
critical difference CD = q_alpha * sqrt(k (k + 1) / (6 N)), q_alpha = studentized range quantile /
sqrt(2), and win rates with Wilson intervals and two-sided sign tests (scipy ``binomtest``), Holm
(1979)-adjusted over all pairs, from :data:`MIN_BLOCKS`. Relative improvements of one loss over
another carry a delta-method t-interval, paired over matched seeds, else Welch.
"""

from __future__ import annotations

import math
from collections.abc import Collection, Iterable
from dataclasses import dataclass
from itertools import combinations

import numpy as np
import pandas as pd

from dmlbench.analysis.friedman import MIN_FRIEDMAN_BLOCKS

CELL = ["dataset", "backbone", "dim"]

MIN_BLOCKS = 5
"""Fewest independent blocks (datasets) on which the sign tests (win rates) and the Bayesian test
across datasets are run: a two-sided sign test over N blocks cannot go below p = 2 / 2^N (0.0625 at
N = 5, 0.125 at N = 4). The Friedman test's exact p has no such floor worth a threshold: for k = 4
losses it reaches 1/24^(N-1) (0.042 at N = 2, 7.2e-5 at N = 4), so it runs from 2 datasets.
"""


def _complete_cells(runs: pd.DataFrame, metric: str, keys: list[str]) -> pd.DataFrame:
    """Mean ``metric`` per ``keys`` x loss, keeping the rows where every loss has a score."""
    selected = runs[runs["metric"] == metric]
    if selected.empty:
        raise ValueError(f"no scores for metric {metric!r}")
    matrix = selected.pivot_table(index=keys, columns="loss", values="value", aggfunc="mean")
    return matrix.dropna(axis=0, how="any")


def block_datasets(datasets: Iterable[str], synthetic: Collection[str] = ()) -> list[str]:
    """The datasets that are blocks of the tests across datasets: every dataset, except that a
    ``synthetic`` one (the offline demo's ``glyphs``) is left out as soon as a real dataset is there.
    A loss's rank on rendered characters is no evidence about its rank on photographs, and counting
    it would make a fifth block of four real datasets."""
    datasets = list(dict.fromkeys(datasets))
    real = [d for d in datasets if d not in synthetic]
    return real if real else datasets


def _block_cells(runs: pd.DataFrame, metric: str, synthetic: Collection[str]) -> pd.DataFrame:
    matrix = _complete_cells(runs, metric, CELL)
    kept = block_datasets(matrix.index.get_level_values("dataset"), synthetic)
    return matrix[matrix.index.get_level_values("dataset").isin(kept)]


def experiment_scores(runs: pd.DataFrame, metric: str) -> pd.DataFrame:
    """Seed-mean scores (1/S) sum_s score_s of ``metric`` in ``runs`` (the long table) as experiments x
    losses, one row per complete experiment, indexed ``dataset/backbone/dim``."""
    matrix = _complete_cells(runs, metric, CELL)
    matrix.index = ["/".join(map(str, idx)) for idx in matrix.index]
    matrix.columns.name = None
    return matrix


@dataclass(frozen=True)
class DatasetBlocks:
    """The independent blocks of the tests, one per dataset. ``ranks``: datasets x losses, each loss's
    mean rank over the dataset's complete experiments (1 = best, ties averaged); ``experiments``: how
    many experiments each row averages."""

    ranks: pd.DataFrame
    experiments: pd.Series

    @property
    def scores(self) -> pd.DataFrame:
        """The blocks as scores (higher = better) for the rank-based tests: minus the mean rank."""
        return -self.ranks

    def __len__(self) -> int:
        return len(self.ranks)


def dataset_blocks(runs: pd.DataFrame, metric: str, synthetic: Collection[str] = ()) -> DatasetBlocks:
    """One block per dataset: R_{d,l} = (1/|E_d|) sum_{e in E_d} rank_e(l), rank_e the rank of loss l's
    seed-mean ``metric`` in experiment e (1 = best, ties averaged), E_d the complete experiments of
    dataset d, d over :func:`block_datasets`."""
    matrix = _block_cells(runs, metric, synthetic)
    ranks = matrix.rank(axis=1, ascending=False, method="average")
    per_dataset = ranks.groupby(level="dataset", sort=True)
    blocks = per_dataset.mean()
    blocks.index.name, blocks.columns.name = None, None
    return DatasetBlocks(blocks, per_dataset.size())


def dataset_means(runs: pd.DataFrame, metric: str, synthetic: Collection[str] = ()) -> pd.DataFrame:
    """datasets x losses: the mean over each dataset's complete experiments of their seed-mean
    ``metric`` (the unit of the Bayesian signed-rank test across datasets; the datasets of
    :func:`block_datasets`)."""
    matrix = _block_cells(runs, metric, synthetic).groupby(level="dataset", sort=True).mean()
    matrix.index.name, matrix.columns.name = None, None
    return matrix


def seed_scores(runs: pd.DataFrame, metric: str) -> dict[str, pd.DataFrame]:
    """Per experiment (``dataset/backbone/dim``): its seeds x losses scores of ``metric``, matched rows
    (seed k gives every loss the same weights and batches); seeds missing a loss are dropped."""
    matrix = _complete_cells(runs, metric, CELL + ["seed"])
    experiments: dict[str, pd.DataFrame] = {}
    for cell, block in matrix.groupby(level=CELL, sort=True):
        frame = block.droplevel(CELL)
        frame.index = [f"seed{seed}" for seed in frame.index]
        frame.columns.name = None
        experiments["/".join(map(str, cell))] = frame
    return experiments


def grid_text(runs: pd.DataFrame, metric: str, synthetic: Collection[str] = ()) -> str:
    """``1 dataset (2 experiments: 1 backbone x 2 embedding sizes)``: the independent blocks and the
    complete experiments of ``metric`` they hold, and the synthetic datasets left out of them."""
    cells = _block_cells(runs, metric, synthetic).index
    counts = [cells.get_level_values(key).nunique() for key in CELL]
    words = [("dataset", "datasets"), ("backbone", "backbones"), ("embedding size", "embedding sizes")]
    text = [f"{c} {one if c == 1 else many}" for c, (one, many) in zip(counts, words, strict=True)]
    every = set(_complete_cells(runs, metric, CELL).index.get_level_values("dataset"))
    left_out = sorted(every - set(cells.get_level_values("dataset")))
    tail = (
        f"; {', '.join(f'`{d}`' for d in left_out)} left out: a synthetic dataset is never a block beside real ones"
        if left_out
        else ""
    )
    return f"{text[0]} ({len(cells)} experiment{'' if len(cells) == 1 else 's'}: {text[1]} x {text[2]}){tail}"


def friedman_shortfall(blocks: pd.DataFrame, grid: str = "") -> str | None:
    """Why the Friedman/Nemenyi tests are not run on ``blocks`` (datasets x losses; they need >= 3 losses
    and :data:`~dmlbench.analysis.friedman.MIN_FRIEDMAN_BLOCKS` blocks), or None; ``grid``: :func:`grid_text`."""
    n, k = blocks.shape
    if k < 3:
        return f"the Friedman test compares at least 3 losses; the grid has {k}"
    if n >= MIN_FRIEDMAN_BLOCKS:
        return None
    return (
        f"they need at least {MIN_FRIEDMAN_BLOCKS} independent blocks, and the independent unit is the dataset "
        "(Demšar 2006): backbones and embedding sizes on one dataset share its training and test images, so "
        f"they are repeated measures of one block; this grid has {grid or f'{n} datasets'}, so only the "
        "per-experiment tests over seeds apply; add datasets"
    )


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
    """Holm's (1979) step-down adjusted p-values of one family of m tests: with p_(1) <= ... <= p_(m),
    p~_(i) = min(1, max_{j <= i} (m - j + 1) p_(j)). NaN entries (no test) stay NaN, outside the family."""
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
    paired: bool = False  # a paired t-interval over matched seeds (else Welch)

    def bounds_or_estimate(self) -> tuple[float, float]:
        """``(low, high)``, or the estimate twice where there is no interval (a sample of one)."""
        return (self.estimate, self.estimate) if math.isnan(self.low) else (self.low, self.high)

    @property
    def method(self) -> str:
        return "paired t over matched seeds" if self.paired else "Welch"


def relative_improvement(a: np.ndarray, b: np.ndarray, confidence: float = 0.95, paired: bool = False) -> RatioInterval:
    """Relative improvement mean(a)/mean(b) - 1 with a delta-method t-interval on log(mean a / mean b);
    the interval is exp(log ratio +/- t se) - 1.

    Independent samples (Welch): se^2 = s_a^2 / (n_a mean_a^2) + s_b^2 / (n_b mean_b^2), Welch-
    Satterthwaite degrees of freedom. ``paired`` (a_i and b_i from the same seed, which gives both
    losses the same initial weights and batches): the delta method of the log ratio keeps the
    covariance, se^2 = var_i(a_i / mean_a - b_i / mean_b) / n, with n - 1 degrees of freedom: the
    seed's shared luck cancels. NaN bounds when a sample has one value.
    """
    from scipy import stats

    a, b = np.asarray(a, dtype=float), np.asarray(b, dtype=float)
    if a.size == 0 or b.size == 0:
        raise ValueError("relative_improvement needs at least one value in each sample")
    if paired and a.size != b.size:
        raise ValueError(f"a paired relative improvement needs one value of each per seed; got {a.size} and {b.size}")
    mean_a, mean_b = a.mean(), b.mean()
    if mean_a <= 0 or mean_b <= 0:
        raise ValueError("relative_improvement needs positive means")
    estimate = float(mean_a / mean_b - 1)
    if a.size < 2 or b.size < 2:
        return RatioInterval(estimate, math.nan, math.nan, a.size, b.size, paired)
    if paired:
        se = math.sqrt(float(np.var(a / mean_a - b / mean_b, ddof=1)) / a.size)
        df = float(a.size - 1)
    else:
        parts = np.array([a.var(ddof=1) / (a.size * mean_a**2), b.var(ddof=1) / (b.size * mean_b**2)])
        se = math.sqrt(parts.sum())
        df = parts.sum() ** 2 / (parts[0] ** 2 / (a.size - 1) + parts[1] ** 2 / (b.size - 1)) if se else 1.0
    if se == 0:
        return RatioInterval(estimate, estimate, estimate, a.size, b.size, paired)
    half = stats.t.ppf((1 + confidence) / 2, df) * se
    log_ratio = math.log(mean_a / mean_b)
    return RatioInterval(
        estimate, math.exp(log_ratio - half) - 1, math.exp(log_ratio + half) - 1, a.size, b.size, paired
    )
