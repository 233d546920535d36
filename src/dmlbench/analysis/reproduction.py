"""Published numbers reproduced? For a grid that follows a published setup
(:data:`~dmlbench.analysis.literature.PROTOCOL_SOURCES`), each cell's published number against our
seed mean, interval against interval, in points of the metric.

*Ours*: mean m_o of n_o seeds (a cross-validation seed is one run, its fold models concatenated),
se_o = s/sqrt(n_o). *Published*: m_p ± h over n_p runs, read as a 95% t-interval (as
powerful-benchmarker, which produced the Reality Check's, computes it): se_p = h / t_{0.975, n_p - 1}.
A number without an interval is one training run: judged by the prediction interval of a single run
(Hahn & Meeker 1991), se = s sqrt(1/n_o + 1) with n_o - 1 df.

Welch (1947): d = m_o - m_p, se = sqrt(se_o^2 + se_p^2), nu = se^4 / (se_o^4 / (n_o - 1) + se_p^4 /
(n_p - 1)). TOST (Schuirmann 1987; Lakens 2017) with margin M (``report.rope``), alpha = 1 - confidence:
p_eq = max(P(T_nu > (d + M)/se), P(T_nu < (d - M)/se)). Verdict: p_eq < alpha -> ``reproduced
(equivalent within ± M)``; else d ± t_{1-alpha/2, nu} se below / above 0 -> ``ours lower`` / ``ours
higher``; else ``inconclusive``. One seed: no test.

Like with like: setups that keep the epoch with the best *test* score (:data:`TEST_SELECTED`) are also
compared with our best-test-epoch score, and that verdict is the like-with-like one. Where a summary
lacks the sd, se_o comes from the uncut side of our clipped t-interval (:func:`standard_error`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import pandas as pd

from dmlbench.analysis import literature as lit
from dmlbench.analysis.text import points
from dmlbench.evaluate.intervals import bounded_t_interval

KEYS = ["dataset", "backbone", "loss", "dim", "metric"]
PUBLISHED_CONFIDENCE = 0.95  # published intervals are 95% (Reality Check Tables 4-6)
REPRODUCED, LOWER, HIGHER, INCONCLUSIVE = "reproduced", "ours lower", "ours higher", "inconclusive"
NO_TEST = "no test"
ONE_PUBLISHED_RUN = "published value without interval: one run, prediction interval"
_PROXY_ANCHOR_TRAIN = (
    "the official train.py scores the test classes after every epoch and keeps the best R@1 "
    "(github.com/tjddus9597/Proxy-Anchor-CVPR2020)"
)
# (paper, setting) of literature.csv whose numbers kept the epoch of best test score, and where that is read
TEST_SELECTED = {
    (lit.THESIS, "test_selection"): "the thesis's default setup keeps the model with the best test accuracy "
    "(Psomas 2020, Sec. 3.5.2)",
    (lit.PROXY_ANCHOR, "as_published"): _PROXY_ANCHOR_TRAIN,
    (lit.PROXY_ANCHOR, "official_readme"): _PROXY_ANCHOR_TRAIN,
}


@dataclass(frozen=True)
class Comparison:
    """``difference`` = ours - published and its (confidence) interval ``low``/``high`` (metric
    units; Welch, or the single-run prediction interval); ``df``; ``p_equivalent`` (TOST);
    ``outcome`` (one of REPRODUCED, LOWER, HIGHER, INCONCLUSIVE, NO_TEST) and ``verdict`` (its wording)."""

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
    """s/sqrt(n) behind our interval (:func:`~dmlbench.evaluate.intervals.bounded_t_interval`: the
    t-interval clipped to [0, 1]): its uncut side / t_{(1+c)/2, n-1}; 0 for a zero-width interval;
    NaN for n < 2 or an interval cut on both sides."""
    from scipy import stats

    if n < 2 or math.isnan(low) or math.isnan(high):
        return math.nan
    if low == high:
        return 0.0
    quantile = float(stats.t.ppf((1 + confidence) / 2, n - 1))
    sides = [side for side, cut in ((high - mean, high >= 1), (mean - low, low <= 0)) if not cut]
    return max(sides) / quantile if sides else math.nan


def _se(mean: float, low: float, high: float, n: int, sd: float, confidence: float) -> float:
    """s/sqrt(n) from the sample sd where the summary carries it, else from the interval."""
    if n >= 2 and not math.isnan(sd):
        return sd / math.sqrt(n)
    return standard_error(mean, low, high, n, confidence)


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
    ``se_published`` over ``n_published`` runs when it has an interval; else one run, judged by
    the prediction interval se sqrt(1 + n)); all in metric units."""
    from scipy import stats

    single = math.isnan(se_published) or not n_published
    difference = mean - published
    if n < 2 or math.isnan(se):
        reason = "no test (one seed)" if n < 2 else "no test (our interval is cut at 0 and at 1)"
        return Comparison(difference, math.nan, math.nan, math.nan, math.nan, NO_TEST, _wording(reason, margin, single))
    if single:  # a single published run: se^2 = s^2/n + s^2
        total, df = se * math.sqrt(1 + n), float(n - 1)
    else:
        total = math.hypot(se, se_published)
        terms = se**4 / (n - 1) + se_published**4 / (int(n_published) - 1)  # type: ignore[arg-type]
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
    return Comparison(difference, low, high, df, p_equivalent, outcome, _wording(outcome, margin, single))


def _wording(outcome: str, margin: float, single: bool) -> str:
    text = f"{REPRODUCED} (equivalent within ± {points(margin)})" if outcome == REPRODUCED else outcome
    return f"{text} ({ONE_PUBLISHED_RUN})" if single else text


def best_epoch_summary(best: pd.DataFrame, confidence: float) -> pd.DataFrame:
    """Per cell and metric: our best-test-epoch score over seeds (mean, the clipped t-interval, n).
    ``best``: one row per run (or fold model: a seed's fold models are averaged first) with the
    KEYS, ``seed`` and ``best_value`` (the test-set feedback record)."""
    columns = [*KEYS, "best_mean", "best_low", "best_high", "best_n", "best_sd"]
    if best.empty:
        return pd.DataFrame(columns=columns)
    per_seed = best.groupby([*KEYS, "seed"], as_index=False)["best_value"].mean()
    rows = []
    for key, group in per_seed.groupby(KEYS, sort=False):
        values = group["best_value"].to_numpy()
        interval = bounded_t_interval(values, confidence, 0.0, 1.0)
        sd = float(values.std(ddof=1)) if len(values) > 1 else math.nan
        rows.append([*key, interval.mean, interval.low, interval.high, interval.n, sd])
    return pd.DataFrame(rows, columns=columns)


def reproduction_table(
    summary: pd.DataFrame,
    published: pd.DataFrame,
    margin: float = 0.01,
    confidence: float = 0.95,
    best: pd.DataFrame | None = None,
) -> pd.DataFrame:
    """One row per grid cell, metric and published number: ours (mean, low, high as fractions, n
    seeds), ``published`` (percent), ``half_width`` (points, NaN without one), ``n_published``,
    ``source``, ``uncertain``, ``test_selected`` (the published number kept its best test epoch:
    :data:`TEST_SELECTED`), our best-test-epoch score ``best_mean``/``best_low``/``best_high``/
    ``best_n`` where ``best`` (:func:`best_epoch_summary`'s input) records it, then :func:`judge`'s
    columns. Empty when nothing matches."""
    columns = [*KEYS, "mean", "low", "high", "n", "published", "half_width", "n_published", "source", "uncertain"]
    extra = ["test_selected", "best_mean", "best_low", "best_high", "best_n", "best_sd"]
    if summary.empty or published.empty:
        return pd.DataFrame(columns=[*columns, *extra, *JUDGED])
    published = published.rename(columns={"value": "published"})
    for column in ("half_width", "n_published"):  # a published frame from before the interval columns
        if column not in published.columns:
            published[column] = math.nan
    if "sd" in summary.columns:
        columns.append("sd")
    merged = summary.merge(published, on=KEYS, how="inner")[columns].reset_index(drop=True)
    selected = {setup.label for setup in _setups() if (setup.paper, setup.setting) in TEST_SELECTED}
    merged["test_selected"] = merged["source"].isin(selected)
    merged = merged.merge(
        best_epoch_summary(best if best is not None else pd.DataFrame(), confidence), on=KEYS, how="left"
    )
    return judge(merged, margin, confidence)


def _setups() -> list[lit.PublishedSetup]:
    return [setup for setups in lit.PROTOCOL_SOURCES.values() for setup in setups]


def selection_evidence(source: str) -> str | None:
    """Where it is read that the published numbers of ``source`` (a setup's label) kept the best test epoch."""
    for setup in _setups():
        if setup.label == source:
            return TEST_SELECTED.get((setup.paper, setup.setting))
    return None


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
    "best_difference",
    "best_difference_low",
    "best_difference_high",
    "best_p_equivalent",
    "best_outcome",
    "best_verdict",
]


def judge(table: pd.DataFrame, margin: float, confidence: float) -> pd.DataFrame:
    """:func:`compare` for every row of a :func:`reproduction_table`: ``se``/``se_published``
    (fractions), ``difference``/``difference_low``/``difference_high`` (ours - published and its
    interval, points), ``df``, ``p_equivalent``, ``margin``, ``confidence``, ``outcome`` and
    ``verdict``; for a test-selected published number with our best-test-epoch score, the same
    comparison of that score (``best_*``; NaN and empty elsewhere). Recomputed only where ``margin``
    or ``confidence`` differ from the table's."""
    if {"margin", "confidence"} <= set(table.columns) and len(table):
        if (table["margin"] == margin).all() and (table["confidence"] == confidence).all():
            return table
    table = table.drop(columns=[c for c in JUDGED if c in table.columns])
    rows = []
    for r in table.itertuples(index=False):
        n_published = None if pd.isna(r.n_published) else int(r.n_published)
        se_p = published_se(r.half_width / 100, n_published) if n_published else math.nan
        se = _se(r.mean, r.low, r.high, int(r.n), getattr(r, "sd", math.nan), confidence)
        result = compare(r.mean, se, int(r.n), r.published / 100, se_p, n_published, margin, confidence)
        row = {
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
        best = dict.fromkeys(JUDGED[-6:], math.nan) | {"best_outcome": "", "best_verdict": ""}
        if bool(getattr(r, "test_selected", False)) and not pd.isna(getattr(r, "best_mean", math.nan)):
            best_se = _se(r.best_mean, r.best_low, r.best_high, int(r.best_n), r.best_sd, confidence)
            on_test = compare(
                r.best_mean, best_se, int(r.best_n), r.published / 100, se_p, n_published, margin, confidence
            )
            best = {
                "best_difference": 100 * on_test.difference,
                "best_difference_low": 100 * on_test.low,
                "best_difference_high": 100 * on_test.high,
                "best_p_equivalent": on_test.p_equivalent,
                "best_outcome": on_test.outcome,
                "best_verdict": on_test.verdict,
            }
        rows.append(row | best)
    return pd.concat([table.reset_index(drop=True), pd.DataFrame(rows, columns=JUDGED)], axis=1)
