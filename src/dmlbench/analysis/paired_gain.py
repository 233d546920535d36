"""The gain of trained models over a frozen trunk on one query set: a paired two-level bootstrap.

Pure maths (numpy only): the per-query scores come in as arrays, the report's section reads them
from the evaluate stages' ``per_query.npz`` (:func:`~dmlbench.analysis.collect.per_query_scores`).

For ``S`` trained runs (seeds) and one frozen trunk, all evaluated on the same ``Q`` queries
(same order), with per-query scores ``t[s, q]`` and ``f[q]`` in [0, 1] (P@1 is 0 or 1, MAP@R a
fraction), the gain is

    gain = 1/S * sum_s 1/Q * sum_q (t[s, q] - f[q])  =  mean trained score - frozen score.

Its interval is a percentile bootstrap over both sources of chance in it: each of ``resamples``
replicates draws Q queries with replacement - one draw shared by every seed, since the seeds and
the trunk answer the same queries, so a hard query counts against all of them (the pairing) -
and S seeds with replacement, and takes the mean over the drawn seeds of the mean difference over
the drawn queries. Every replicate is a mean of differences in [-1, 1], so the interval never
leaves [-1, 1]; when the trained and frozen scores are equal query by query every replicate is 0
and so is the interval. With one seed only the queries are resampled: the interval then says
nothing about another training run. Resampling seeds is the ordinary (Efron) bootstrap over the
runs; with few seeds it is too narrow, as any bootstrap over n < 10 draws is.

>>> t = np.array([[1.0, 0.0, 1.0, 1.0]])
>>> paired_gain(t, np.array([1.0, 0.0, 1.0, 1.0])).estimate
0.0
>>> g = paired_gain(t, np.array([0.0, 0.0, 1.0, 0.0]))
>>> g.estimate, g.queries, g.seeds
(0.5, 4, 1)
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

RESAMPLES = 2000
CELLS_PER_BLOCK = 4_000_000  # resamples x queries drawn at once (bounds the memory of a block)


@dataclass(frozen=True)
class PairedGain:
    """Mean trained-minus-frozen score (a fraction in [-1, 1]) and its bootstrap interval."""

    estimate: float
    low: float
    high: float
    queries: int  # Q: the shared query set
    seeds: int  # S: trained runs
    resamples: int


def paired_gain(
    trained: np.ndarray,
    frozen: np.ndarray,
    confidence: float = 0.95,
    resamples: int = RESAMPLES,
    seed: int = 0,
) -> PairedGain:
    """Gain of ``trained`` (S x Q per-query scores, one row per seed) over ``frozen`` (Q scores of
    the same queries) with its two-level percentile bootstrap interval (module docstring)."""
    trained = np.atleast_2d(np.asarray(trained, dtype=np.float64))
    frozen = np.asarray(frozen, dtype=np.float64)
    if frozen.ndim != 1 or trained.shape[1] != frozen.shape[0] or frozen.size == 0:
        raise ValueError(
            f"need S x Q trained and Q frozen scores of the same queries; got {trained.shape} and {frozen.shape}"
        )
    if not 0 < confidence < 1 or resamples < 1:
        raise ValueError(f"confidence must be in (0, 1) and resamples >= 1; got {confidence}, {resamples}")
    differences = trained - frozen[None, :]  # S x Q, each in [-1, 1] for scores in [0, 1]
    seeds, queries = differences.shape
    rng = np.random.default_rng(seed)
    block = max(1, CELLS_PER_BLOCK // queries)
    replicates = np.empty(resamples)
    for start in range(0, resamples, block):
        size = min(block, resamples - start)
        query_counts = rng.multinomial(queries, np.full(queries, 1 / queries), size=size)  # size x Q
        seed_counts = rng.multinomial(seeds, np.full(seeds, 1 / seeds), size=size)  # size x S
        per_seed = differences @ query_counts.T / queries  # S x size: each seed's mean over the drawn queries
        replicates[start : start + size] = np.einsum("bs,sb->b", seed_counts, per_seed) / seeds
    tail = (1 - confidence) / 2
    bounds: np.ndarray = np.quantile(replicates, [tail, 1 - tail])
    estimate = float(differences.mean())
    return PairedGain(estimate, float(bounds[0]), float(bounds[1]), queries, seeds, resamples)
