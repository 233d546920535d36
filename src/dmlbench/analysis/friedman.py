"""The Friedman test over dataset blocks, with its exact (or permutation) p-value.

Rows = blocks (datasets), columns = losses, ranked within each block (ties averaged). With r_ij the
rank of loss j in block i, R_j = sum_i r_ij and the tie correction
c = 1 - sum_i sum_t (t^3 - t) / (N k (k^2 - 1)) (t: sizes of tied groups),

    chi2 = (12 / (N k (k + 1)) sum_j R_j^2 - 3 N (k + 1)) / c,

as ``scipy.stats.friedmanchisquare``. Its p is the permutation p under H0 (every arrangement of a
block's ranks equally likely), not the chi2(k - 1) approximation, which Demšar (2006, JMLR 7, Sec.
3.2.2) trusts only from about N > 10 and k > 5: p = P(S* >= S) with S = sum_j R_j^2, over the
(k!)^N arrangements.

* ``exact``: the distribution of (R_1, ..., R_k) convolved block by block, equal vectors merged, the
  first block held fixed and each vector kept sorted (relabelling the losses leaves S unchanged);
  run while the work stays below :data:`EXACT_WORK` (4 x 4: p down to 1/13,824 = 7.2e-5).
* ``permutation``: otherwise ``scipy.stats.permutation_test`` within blocks, :data:`PERMUTATIONS`
  draws, p = (1 + #{S* >= S}) / (1 + PERMUTATIONS) (Phipson & Smyth 2010), seeded.

Handled where scipy falls short: ``friedmanchisquare`` returns NaN when every loss ties in every
block (here chi2 = 0, p = 1: ``all tied``), and ``permutation_test`` enumerates all (k!)^N
arrangements when it goes exact (331,776 for 4 x 4).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import pandas as pd

MIN_FRIEDMAN_BLOCKS = 2  # fewest independent blocks (datasets) the Friedman test is run on
EXACT_WORK = 500_000  # rank-sum vectors x arrangements per step of the exact distribution
PERMUTATIONS = 20_000  # random arrangements of the permutation p where the exact one is too costly
METHODS = {
    "exact": "exact p over every arrangement of the ranks within the blocks",
    "permutation": f"permutation p from {PERMUTATIONS:,} random arrangements of the ranks within the blocks",
    "all tied": "every loss ties in every block: chi2 = 0, p = 1",
}


@dataclass(frozen=True)
class FriedmanResult:
    statistic: float  # chi-square (tie-corrected), k - 1 degrees of freedom
    pvalue: float
    n_blocks: int
    n_losses: int
    mean_ranks: pd.Series
    method: str = "exact"  # a key of METHODS
    min_pvalue: float = math.nan  # the smallest p any data could reach (exact method only)

    @property
    def method_text(self) -> str:
        return METHODS.get(self.method, self.method)


def mean_ranks(scores: pd.DataFrame) -> pd.Series:
    """Mean rank of each loss over the blocks (1 = best score in a block, ties averaged), best first."""
    return scores.rank(axis=1, ascending=False, method="average").mean().sort_values()


def friedman(scores: pd.DataFrame, seed: int = 0) -> FriedmanResult:
    """Friedman test over the blocks of ``scores`` (rows = blocks, higher = better; needs >= 3 losses
    and >= 2 blocks) with its exact or permutation p-value (module docstring)."""
    from scipy import stats

    n, k = scores.shape
    if k < 3 or n < MIN_FRIEDMAN_BLOCKS:
        raise ValueError(f"the Friedman test needs >= 3 losses and >= 2 blocks; got {k} losses, {n} blocks")
    values = scores.to_numpy(dtype=float)
    ranks = stats.rankdata(values, axis=1)  # within each block, ties averaged
    tied = sum(t**3 - t for row in ranks for t in np.unique(row, return_counts=True)[1])
    correction = 1 - tied / (n * k * (k * k - 1))
    order = mean_ranks(scores)
    if correction <= 0:  # every loss ties in every block: nothing to rank
        return FriedmanResult(0.0, 1.0, n, k, order, "all tied")
    observed = float(np.sum(ranks.sum(axis=0) ** 2))
    statistic = (12 / (n * k * (k + 1)) * observed - 3 * n * (k + 1)) / correction
    statistic = max(0.0, float(statistic))  # rounding below 0 when the rank sums are all equal
    exact = _exact_tail(ranks, observed)
    if exact is not None:
        return FriedmanResult(statistic, exact[0], n, k, order, "exact", exact[1])
    result = stats.permutation_test(
        list(values.T),  # k samples of N paired values: permuted within each block
        _rank_sum_squares,
        permutation_type="samples",
        vectorized=True,
        n_resamples=PERMUTATIONS,
        alternative="greater",
        rng=np.random.default_rng(seed),
    )
    return FriedmanResult(statistic, float(result.pvalue), n, k, order, "permutation")


def _rank_sum_squares(*samples: np.ndarray, axis: int = -1) -> np.ndarray:
    """S = sum_j R_j^2 of k samples paired along ``axis`` (the blocks), for ``permutation_test``."""
    from scipy import stats

    data = np.moveaxis(np.stack(samples, axis=0), axis if axis < 0 else axis + 1, -1)  # k x ... x N
    ranks = stats.rankdata(data, axis=0)  # within each block
    return np.sum(ranks.sum(axis=-1) ** 2, axis=0)


def _exact_tail(ranks: np.ndarray, observed: float) -> tuple[float, float] | None:
    """(P(S >= observed), P(S = max S)) under H0 by convolving the blocks' arrangements, or None when
    the work would pass :data:`EXACT_WORK`. Ranks are doubled to integers (ties give halves)."""
    from itertools import permutations

    doubled = np.rint(2 * ranks).astype(np.int64)
    states, counts = np.sort(doubled[:1], axis=1), np.ones(1)  # the first block held fixed (relabelling symmetry)
    for row in doubled[1:]:
        ties = np.unique(row, return_counts=True)[1]
        distinct = math.factorial(row.size) // math.prod(math.factorial(int(t)) for t in ties)
        if len(states) * distinct > EXACT_WORK:
            return None
        arrangements = np.array(sorted(set(permutations(row.tolist()))), dtype=np.int64)
        weights = math.factorial(row.size) / distinct  # arrangements of tied ranks coincide
        summed = np.sort((states[:, None, :] + arrangements[None, :, :]).reshape(-1, row.size), axis=1)
        states, inverse = np.unique(summed, axis=0, return_inverse=True)
        counts = np.bincount(inverse.reshape(-1), weights=np.repeat(counts, len(arrangements)) * weights)
    squares = np.sum(states.astype(float) ** 2, axis=1) / 4  # S of each rank-sum vector
    total = counts.sum()
    tail = counts[squares >= observed - 1e-9].sum() / total
    return float(tail), float(counts[squares >= squares.max() - 1e-9].sum() / total)
