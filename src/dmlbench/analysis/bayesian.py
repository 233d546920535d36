"""Bayesian comparison of two losses with baycomp (https://github.com/janezd/baycomp; Benavoli, Corani,
Demšar & Zaffalon, JMLR 18(77), 2017): posterior probabilities that loss A is practically better than
B (d = A - B > rope), practically equivalent (|d| <= rope, the ROPE) or worse (d < -rope).

* Per experiment, over its matched seeds (:func:`seed_comparison`): the correlated Bayesian t-test
  (Corani & Benavoli 2015) gives d the posterior t_{n-1}(mean d, (1/n + rho/(1 - rho)) s^2). Seeds
  share one training and test split, so given it their differences are independent draws of the
  training randomness: rho = 0 (baycomp's ``single.Posterior``), not baycomp's cross-validation
  rho = 1/folds. It speaks for that experiment's split only.
* Across datasets, over dataset means (:func:`dataset_comparison`): baycomp's Bayesian signed-rank
  test (Benavoli et al., ICML 2014) with its prior (a pseudo-observation d = 0 of weight 0.5), seeded
  (:data:`SEED`), from :data:`MIN_DATASETS` datasets: datasets are the independent units.
* The hierarchical test (Corani et al. 2017) is not run: :data:`HIERARCHICAL_NOTE`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import pandas as pd

from dmlbench.analysis.statistics import MIN_BLOCKS

SEED = 0  # random_state of the signed-rank test's Monte Carlo sample: the report is reproducible
NSAMPLES = 50_000  # posterior samples; Monte Carlo standard error of a probability <= 0.5 / sqrt(50000) = 0.002
MIN_SEEDS = 2  # s^2 needs two paired seeds
MIN_DATASETS = MIN_BLOCKS
"""Fewest datasets for the signed-rank test: the same independent blocks the Friedman test
needs. With n datasets the posterior is a Dirichlet(0.5, 1, ..., 1) over n + 1 points, so with
fewer than 5 the prior point weighs more than 10% and a few differences decide everything."""
DECISION = 0.95  # a probability >= 0.95 counts as a decision (the 95% threshold of Benavoli et al. 2017)
HIERARCHICAL_NOTE = (
    "The hierarchical model of seeds nested in experiments (baycomp's `HierarchicalTest`, Corani et al. 2017) "
    "is not run: it needs pystan (250 MB of httpstan; its Stan model compiled for about 4 minutes on two CPU "
    "cores, then sampled for about 30 s per pair), and baycomp fixes its correlation to that of "
    "cross-validation folds (rho = 1/folds), not of independent seeds."
)


@dataclass(frozen=True)
class Comparison:
    """P(A practically better), P(equivalent), P(A practically worse) and the mean difference A - B."""

    better: float
    equivalent: float
    worse: float
    n: int  # seeds (per experiment) or datasets (across)
    difference: float  # mean of A - B
    low: float  # 95% t-interval of the mean difference (per experiment = the Student posterior's credible interval)
    high: float

    @property
    def verdict(self) -> str:
        return verdict(self.better, self.equivalent, self.worse)


def verdict(better: float, equivalent: float, worse: float) -> str:
    """``better`` / ``equivalent`` / ``worse`` when its probability is >= :data:`DECISION`, else ``undecided``."""
    for name, p in (("better", better), ("equivalent", equivalent), ("worse", worse)):
        if p >= DECISION:
            return name
    return "undecided"


def _interval(diff: np.ndarray, scale: float, confidence: float = 0.95) -> tuple[float, float]:
    """Central interval of t_{n-1}(mean d, scale^2)."""
    from scipy import stats

    if scale == 0:
        return float(diff.mean()), float(diff.mean())
    half = stats.t.ppf((1 + confidence) / 2, diff.size - 1) * scale
    return float(diff.mean() - half), float(diff.mean() + half)


def _pairs(a: np.ndarray, b: np.ndarray, at_least: int, what: str) -> np.ndarray:
    a, b = np.asarray(a, dtype=float), np.asarray(b, dtype=float)
    if a.shape != b.shape or a.ndim != 1:
        raise ValueError(f"a and b must be 1-d and matched; got shapes {a.shape} and {b.shape}")
    if a.size < at_least:
        raise ValueError(f"needs at least {at_least} {what}; got {a.size}")
    return a - b


def seed_comparison(a: np.ndarray, b: np.ndarray, rope: float) -> Comparison:
    """Bayesian t-test of matched seeds (rho = 0): d ~ t_{n-1}(mean d, s^2 / n) a posteriori.

    ``a[k]``, ``b[k]``: the scores of the two losses with seed k. P(better) = P(d > rope),
    P(equivalent) = P(|d| <= rope), P(worse) = P(d < -rope); no sampling, no randomness.
    """
    from baycomp.single import Posterior

    diff = _pairs(a, b, MIN_SEEDS, "matched seeds")
    n = diff.size
    var = float(diff.var(ddof=1)) / n
    probs = Posterior(float(diff.mean()), var, n - 1, rope).probs()  # (worse, equivalent, better); no rope: 2
    worse, equivalent, better = probs if len(probs) == 3 else (probs[0], 0.0, probs[1])
    low, high = _interval(diff, math.sqrt(var))
    return Comparison(float(better), float(equivalent), float(worse), n, float(diff.mean()), low, high)


def dataset_comparison(
    a: np.ndarray, b: np.ndarray, rope: float, seed: int = SEED, nsamples: int = NSAMPLES
) -> Comparison:
    """Bayesian signed-rank test over datasets (``a[d]``, ``b[d]``: the scores of dataset d, the mean
    of its experiments' seed means).

    baycomp ``SignedRankTest`` with x = b, y = a (baycomp's difference is y - x = A - B), its
    default prior, ``nsamples`` Dirichlet draws from ``random_state=seed``.
    """
    from baycomp import SignedRankTest

    diff = _pairs(a, b, MIN_DATASETS, "datasets")
    a, b = np.asarray(a, dtype=float), np.asarray(b, dtype=float)
    posterior = SignedRankTest(b, a, rope, nsamples=nsamples, random_state=seed)
    worse, equivalent, better = posterior.probs(with_rope=True)
    low, high = _interval(diff, float(diff.std(ddof=1)) / math.sqrt(diff.size))
    return Comparison(float(better), float(equivalent), float(worse), diff.size, float(diff.mean()), low, high)


ACROSS = "across datasets"


def compare_neighbours(
    seeds: dict[str, pd.DataFrame], datasets: pd.DataFrame, ranked: list[str], rope: float
) -> pd.DataFrame:
    """Each pair of neighbours (A, B) in ``ranked`` (best first): per experiment and across datasets.

    ``seeds``: experiment -> seeds x losses (:func:`dmlbench.analysis.statistics.seed_scores`);
    ``datasets``: datasets x losses (:func:`dmlbench.analysis.statistics.dataset_means`).
    Rows: a, b, experiment (or :data:`ACROSS`), test, n, and the :class:`Comparison` fields (NaN
    probabilities below :data:`MIN_SEEDS` matched seeds; the across row from :data:`MIN_DATASETS`).
    The pairs are chosen from the same test scores; the report says so.
    """
    rows = []
    for a, b in zip(ranked, ranked[1:], strict=False):
        for name, scores in seeds.items():
            if len(scores) >= MIN_SEEDS:
                result = seed_comparison(scores[a].to_numpy(), scores[b].to_numpy(), rope)
                rows.append({"a": a, "b": b, "experiment": name, "test": "t", **vars(result)})
            else:
                rows.append({"a": a, "b": b, "experiment": name, "test": "t", "n": len(scores)})
        if len(datasets) >= MIN_DATASETS:
            result = dataset_comparison(datasets[a].to_numpy(), datasets[b].to_numpy(), rope)
            rows.append({"a": a, "b": b, "experiment": ACROSS, "test": "signed-rank", **vars(result)})
    columns = ["a", "b", "experiment", "test", "n", "better", "equivalent", "worse", "difference", "low", "high"]
    return pd.DataFrame(rows, columns=columns)
