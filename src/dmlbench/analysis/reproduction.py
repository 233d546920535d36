"""Published numbers reproduced? For a grid that follows a published setup (the Reality Check,
the thesis, Proxy-Anchor: :data:`~dmlbench.analysis.literature.PROTOCOL_SOURCES`), each cell's
published number is compared with our seed mean, interval against interval.

*Ours*: mean m_o of n_o seeds, each seed one independent training run (a cross-validation seed is
one run whose fold models are concatenated and scored once), standard error se_o = s/sqrt(n_o).
*Published*: value m_p ± half-width h over n_p runs (``literature.csv``; the Reality Check's
Tables 4-6 print mean ± 95% interval over 10 runs), read as a 95% t-interval (the t distribution is
what github.com/KevinMusgrave/powerful-benchmarker, which produced them, uses), so
se_p = h / t_{0.975, n_p - 1}. A published number without an interval is taken as exact: se_p = 0.

Welch (1947): d = m_o - m_p, se = sqrt(se_o^2 + se_p^2), Welch-Satterthwaite
nu = se^4 / (se_o^4 / (n_o - 1) + se_p^4 / (n_p - 1)) (= n_o - 1 when se_p = 0: the one-sample t).
Equivalence, TOST (Schuirmann 1987; Lakens 2017): with margin M (``report.rope``) and
alpha = 1 - confidence, p_eq = max(P(T_nu > (d + M)/se), P(T_nu < (d - M)/se)); equivalent when
p_eq < alpha, i.e. when the (1 - 2 alpha) interval d ± t_{1-alpha, nu} se lies inside (-M, M).

Verdict: equivalent -> ``reproduced (equivalent within ± M)``; else the (1 - alpha) Welch interval
d ± t_{1-alpha/2, nu} se below 0 -> ``ours lower``, above 0 -> ``ours higher``; else
``inconclusive``; without a published interval the verdict says so. One seed: no test.

Scale: the test runs on the metric's own scale (points), not on the logit scale of our displayed
interval, because (i) the published interval is symmetric there (value ± h), so se_p exists only on
that scale, (ii) the margin is in metric units, and (iii) our logit-t interval is the delta-method
image of the same s/sqrt(n) (:func:`~dmlbench.evaluate.intervals.bounded_t_interval`:
logit(m) ± t se_o / (m (1 - m))), so :func:`standard_error` recovers se_o from it exactly. Welch's t
needs each mean roughly normal over its runs; that holds while the run-to-run spread is small against
the distance to 0 and 1 (the published half-widths are 0.09-1.51 points at 16-86%); next to a bound the
raw-scale test is approximate, and the table still shows our bounded interval.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import pandas as pd

from dmlbench.analysis.text import points

KEYS = ["dataset", "backbone", "loss", "dim", "metric"]
PUBLISHED_CONFIDENCE = 0.95  # published intervals are 95% (Reality Check Tables 4-6)
REPRODUCED, LOWER, HIGHER, INCONCLUSIVE = "reproduced", "ours lower", "ours higher", "inconclusive"
NO_TEST = "no test"
NO_PUBLISHED_INTERVAL = "published value has no interval"


@dataclass(frozen=True)
class Comparison:
    """``difference`` = ours - published and its (confidence) Welch interval ``low``/``high``
    (metric units); ``df`` (Welch-Satterthwaite); ``p_equivalent`` (TOST); ``outcome`` (one of
    REPRODUCED, LOWER, HIGHER, INCONCLUSIVE, NO_TEST) and ``verdict`` (its wording)."""

    difference: float
    low: float
    high: float
    df: float
    p_equivalent: float
    outcome: str
    verdict: str


def published_se(half_width: float, n: int, confidence: float = PUBLISHED_CONFIDENCE) -> float:
    """se_p = h / t_{(1+c)/2, n-1}: the standard error behind a t-interval mean ± h over n runs."""
    from scipy import stats

    if math.isnan(half_width) or n < 2:
        return math.nan
    return half_width / float(stats.t.ppf((1 + confidence) / 2, n - 1))


def standard_error(mean: float, low: float, high: float, n: int, confidence: float) -> float:
    """s/sqrt(n) behind our interval of a metric in [0, 1] (``bounded_t_interval``'s inverse).

    t-logit interval: se = (logit(high) - logit(low)) / 2 * m (1 - m) / t_{(1+c)/2, n-1}; plain t
    (every value equal, or a value on a bound): its untruncated side / t. NaN for n < 2 or an
    interval truncated on both sides."""
    from scipy import stats
    from scipy.special import logit

    if n < 2 or math.isnan(low) or math.isnan(high):
        return math.nan
    if low == high:
        return 0.0
    quantile = float(stats.t.ppf((1 + confidence) / 2, n - 1))
    if 0 < low and high < 1 and 0 < mean < 1:
        centre, ends = float(logit(mean)), (float(logit(low)), float(logit(high)))
        if math.isclose(sum(ends) / 2, centre, rel_tol=1e-9, abs_tol=1e-9):
            return (ends[1] - ends[0]) / 2 * mean * (1 - mean) / quantile
    sides = [side for side, cut in ((high - mean, high >= 1), (mean - low, low <= 0)) if not cut]
    return max(sides) / quantile if sides else math.nan


def compare(
    mean: float,
    se: float,
    n: int,
    published: float,
    se_published: float = math.nan,
    n_published: int | None = None,
    margin: float = 0.01,
    confidence: float = 0.95,
) -> Comparison:
    """Ours (``mean``, ``se``, ``n`` seeds) against a published value (``published``, and its
    ``se_published`` over ``n_published`` runs when it has an interval); all in metric units."""
    from scipy import stats

    bare = math.isnan(se_published) or not n_published
    difference = mean - published
    if n < 2 or math.isnan(se):
        reason = "no test (one seed)" if n < 2 else "no test (our interval is cut at 0 and at 1)"
        return Comparison(difference, math.nan, math.nan, math.nan, math.nan, NO_TEST, _wording(reason, margin, bare))
    se_p = 0.0 if bare else se_published
    total = math.hypot(se, se_p)
    terms = se**4 / (n - 1) + (0.0 if bare else se_p**4 / (int(n_published) - 1))  # type: ignore[arg-type]
    df = float(n - 1) if terms == 0 else total**4 / terms
    alpha = 1 - confidence
    if total == 0:
        low = high = difference
        p_equivalent = 0.0 if abs(difference) < margin else 1.0
    else:
        half = float(stats.t.ppf(1 - alpha / 2, df)) * total
        low, high = difference - half, difference + half
        p_equivalent = max(
            float(stats.t.sf((difference + margin) / total, df)), float(stats.t.cdf((difference - margin) / total, df))
        )
    if p_equivalent < alpha:
        outcome = REPRODUCED
    elif high < 0:
        outcome = LOWER
    elif low > 0:
        outcome = HIGHER
    else:
        outcome = INCONCLUSIVE
    return Comparison(difference, low, high, df, p_equivalent, outcome, _wording(outcome, margin, bare))


def _wording(outcome: str, margin: float, bare: bool) -> str:
    text = f"{REPRODUCED} (equivalent within ± {points(margin)})" if outcome == REPRODUCED else outcome
    return f"{text} ({NO_PUBLISHED_INTERVAL})" if bare else text


def reproduction_table(
    summary: pd.DataFrame, published: pd.DataFrame, margin: float = 0.01, confidence: float = 0.95
) -> pd.DataFrame:
    """One row per grid cell, metric and published number: ours (mean, low, high as fractions, n
    seeds), ``published`` (percent), ``half_width`` (points, NaN without one), ``n_published``,
    ``source``, ``uncertain``, then :func:`judge`'s columns. Empty when nothing matches."""
    columns = [*KEYS, "mean", "low", "high", "n", "published", "half_width", "n_published", "source", "uncertain"]
    if summary.empty or published.empty:
        return pd.DataFrame(columns=[*columns, *JUDGED])
    published = published.rename(columns={"value": "published"})
    for column in ("half_width", "n_published"):  # a published frame from before the interval columns
        if column not in published.columns:
            published[column] = math.nan
    merged = summary.merge(published, on=KEYS, how="inner")[columns].reset_index(drop=True)
    return judge(merged, margin, confidence)


JUDGED = [
    "se",
    "se_published",
    "difference",
    "difference_low",
    "difference_high",
    "df",
    "p_equivalent",
    "margin",
    "confidence",
    "outcome",
    "verdict",
]


def judge(table: pd.DataFrame, margin: float, confidence: float) -> pd.DataFrame:
    """:func:`compare` for every row of a :func:`reproduction_table`: ``se``/``se_published``
    (fractions), ``difference``/``difference_low``/``difference_high`` (ours - published and its
    Welch interval, points), ``df``, ``p_equivalent``, ``margin``, ``confidence``, ``outcome`` and
    ``verdict``. Recomputed only where ``margin`` or ``confidence`` differ from the table's."""
    if {"margin", "confidence"} <= set(table.columns) and len(table):
        if (table["margin"] == margin).all() and (table["confidence"] == confidence).all():
            return table
    table = table.drop(columns=[c for c in JUDGED if c in table.columns])
    rows = []
    for r in table.itertuples(index=False):
        n_published = None if pd.isna(r.n_published) else int(r.n_published)
        se = standard_error(r.mean, r.low, r.high, int(r.n), confidence)
        se_p = published_se(r.half_width / 100, n_published) if n_published else math.nan
        result = compare(r.mean, se, int(r.n), r.published / 100, se_p, n_published, margin, confidence)
        rows.append(
            {
                "se": se,
                "se_published": se_p,
                "difference": 100 * result.difference,
                "difference_low": 100 * result.low,
                "difference_high": 100 * result.high,
                "df": result.df,
                "p_equivalent": result.p_equivalent,
                "margin": margin,
                "confidence": confidence,
                "outcome": result.outcome,
                "verdict": result.verdict,
            }
        )
    return pd.concat([table.reset_index(drop=True), pd.DataFrame(rows, columns=JUDGED)], axis=1)
