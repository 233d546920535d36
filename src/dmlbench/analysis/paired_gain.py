"""The gain of trained models over a frozen trunk on one test set, with an interval over both its
sources of chance: the training seed and the sample of test classes (Bouthillier et al., MLSys 2021).

``S`` seeds and the trunk answer the same ``Q`` queries of ``C`` test classes, per-query scores
``t[s, q]`` and ``f[q]`` in [0, 1]:

    g_s = 1/Q * sum_q (t[s, q] - f[q]),        G = 1/S * sum_s g_s  =  mean trained - frozen score.

* seeds (one shared test set, so no test-sampling noise in their spread):
  h_seed = t_{(1+c)/2, S-1} * s_g / sqrt(S), s_g the sample sd of the g_s;
* test classes: the class-cluster bootstrap (Field & Welsh 2007) of d[q] = 1/S sum_s t[s, q] - f[q],
  one draw of classes shared by the trunk and every seed, gives [G - h_low, G + h_high].

Combined as in Zou & Donner's MOVER (2008, Stat. Med. 27), clipped to [-1, 1]:

    low = G - sqrt(h_seed^2 + h_low^2),   high = G + sqrt(h_seed^2 + h_high^2).

Never narrower than either part; the seed x class interaction is in both, so it errs wide. With one
seed only the class part exists. The report reads the arrays from ``per_query.npz``
(:func:`~dmlbench.analysis.collect.per_query_scores`).

>>> t = np.array([[1.0, 0.0, 1.0, 1.0]])
>>> paired_gain(t, np.array([1.0, 0.0, 1.0, 1.0]), np.array([0, 0, 1, 1])).estimate
0.0
>>> g = paired_gain(t, np.array([0.0, 0.0, 1.0, 0.0]), np.array([0, 0, 1, 1]))
>>> g.estimate, g.queries, g.classes, g.seeds
(0.5, 4, 2, 1)
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from dmlbench.evaluate.intervals import bootstrap_interval

RESAMPLES = 2000


@dataclass(frozen=True)
class PairedGain:
    """Mean trained-minus-frozen score (a fraction in [-1, 1]) and its interval (module docstring);
    ``seed_half_width`` (h_seed, NaN for one seed) and the class bootstrap's ``class_low``/``class_high``
    are its two parts."""

    estimate: float
    low: float
    high: float
    queries: int  # Q: the shared query set
    classes: int  # C: the test classes the queries belong to (the bootstrap's unit)
    seeds: int  # S: trained runs
    resamples: int
    seed_half_width: float
    class_low: float
    class_high: float

    @property
    def label(self) -> str:
        """``n = 3 seeds; 1,600 queries in 100 classes``: what the interval's n counts."""
        seeds = f"{self.seeds} seed{'' if self.seeds == 1 else 's'}"
        return f"n = {seeds}; {self.queries:,} queries in {self.classes:,} classes"


def paired_gain(
    trained: np.ndarray,
    frozen: np.ndarray,
    classes: np.ndarray,
    confidence: float = 0.95,
    resamples: int = RESAMPLES,
    seed: int = 0,
) -> PairedGain:
    """Gain of ``trained`` (S x Q per-query scores, one row per seed) over ``frozen`` (Q scores of
    the same queries), ``classes`` the Q queries' class labels, with the interval of the module
    docstring (the class part from ``resamples`` bootstrap draws seeded with ``seed``)."""
    from scipy import stats

    trained = np.atleast_2d(np.asarray(trained, dtype=np.float64))
    frozen = np.asarray(frozen, dtype=np.float64)
    classes = np.asarray(classes).reshape(-1)
    if frozen.ndim != 1 or trained.shape[1] != frozen.shape[0] or frozen.size == 0:
        raise ValueError(
            f"need S x Q trained and Q frozen scores of the same queries; got {trained.shape} and {frozen.shape}"
        )
    if classes.size != frozen.size:
        raise ValueError(f"need one class label per query: {classes.size} labels for {frozen.size} queries")
    if not 0 < confidence < 1 or resamples < 1:
        raise ValueError(f"confidence must be in (0, 1) and resamples >= 1; got {confidence}, {resamples}")
    differences = trained - frozen[None, :]  # S x Q, each in [-1, 1] for scores in [0, 1]
    seeds, queries = differences.shape
    per_seed = differences.mean(axis=1)
    estimate = float(per_seed.mean())
    part = bootstrap_interval(differences.mean(axis=0), confidence, resamples, "percentile", seed, clusters=classes)
    class_low, class_high = part.bounds_or_mean()  # one class: no class part
    if seeds > 1:
        spread = float(per_seed.std(ddof=1)) / math.sqrt(seeds)
        seed_half = float(stats.t.ppf((1 + confidence) / 2, seeds - 1)) * spread
    else:
        seed_half = math.nan
    own = 0.0 if math.isnan(seed_half) else seed_half
    low = estimate - math.hypot(own, estimate - class_low)
    high = estimate + math.hypot(own, class_high - estimate)
    return PairedGain(
        estimate,
        max(-1.0, low),
        min(1.0, high),
        queries,
        part.n,
        seeds,
        resamples,
        seed_half,
        class_low,
        class_high,
    )
