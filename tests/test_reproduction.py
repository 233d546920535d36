"""Published numbers reproduced? Interval against interval: Welch's t with the paper's n and an
equivalence test (TOST) with ``report.rope`` as the margin, on constructed cases."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest
from scipy import stats

from dmlbench.analysis import reproduction as rp
from dmlbench.evaluate.intervals import bounded_t_interval

CELL = {"dataset": "cub200", "backbone": "bn_inception", "loss": "contrastive", "dim": 128, "metric": "map_at_r"}


def _summary(values, **cell) -> pd.DataFrame:
    """Our summary row as ``numbers.summarize`` builds it: mean, clipped t-interval and sd over seeds."""
    interval = bounded_t_interval(values, 0.95, 0.0, 1.0)
    sd = float(np.std(values, ddof=1)) if len(values) > 1 else math.nan
    row = {"mean": interval.mean, "low": interval.low, "high": interval.high, "n": interval.n, "sd": sd}
    return pd.DataFrame([{**CELL, **cell, **row}])


def _published(value: float, half_width: float = math.nan, n: int | None = None, **cell) -> pd.DataFrame:
    return pd.DataFrame(
        [
            {
                **CELL,
                **cell,
                "value": value,
                "half_width": half_width,
                "n_published": pd.NA if n is None else n,
                "source": "paper",
                "uncertain": False,
            }
        ]
    ).astype({"n_published": "Int64"})


def _seeds(mean: float, sd: float, n: int = 10) -> np.ndarray:
    """n values with exactly this mean and sample standard deviation."""
    z = np.random.default_rng(0).standard_normal(n)
    z = (z - z.mean()) / z.std(ddof=1)
    return mean + sd * z


def _row(values, published) -> pd.Series:
    return rp.reproduction_table(_summary(values), published).iloc[0]


@pytest.mark.parametrize(
    "values",
    [_seeds(0.265, 0.004), [0.01, 0.02, 0.05], [0.0, 0.1, 0.2], [1.0, 0.9, 0.95], [0.5, 0.5, 0.5], [0.4, 0.6], [0.7]],
)
def test_our_standard_error_is_recovered_from_our_interval(values):
    """s/sqrt(n) behind every kind of interval ``bounded_t_interval`` returns: inside the range, cut at
    one bound, every value equal, one value (none); cut at both (two seeds of 0.4 and 0.6: t_1 = 12.7)
    leaves nothing to recover it from, so the table takes the sd the summary carries."""
    interval = bounded_t_interval(values, 0.95, 0.0, 1.0)
    se = rp.standard_error(interval.mean, interval.low, interval.high, interval.n, 0.95)
    if len(values) == 1 or (interval.low, interval.high) == (0.0, 1.0):
        assert math.isnan(se)
        row = _row(values, _published(50.0, 1.0, 10))
        assert len(values) == 1 or row["se"] == pytest.approx(stats.sem(values))
    else:
        assert se == pytest.approx(stats.sem(values), rel=1e-9, abs=1e-15)


def test_equal_means_with_a_wide_published_interval_never_read_lower():
    """The same mean on both sides: reproduced or inconclusive, whatever the published width."""
    for half_width in (0.1, 0.3, 1.5, 5.0):
        for shift in (-0.2, 0.0, 0.2):  # points
            row = _row(_seeds(0.2653 + shift / 100, 0.004), _published(26.53, half_width, 10))
            assert row["outcome"] in (rp.REPRODUCED, rp.INCONCLUSIVE), (half_width, shift, row["verdict"])
    # a wide published interval leaves the question open instead of claiming a difference
    wide = _row(_seeds(0.2653, 0.004), _published(26.53, 5.0, 10))
    assert wide["outcome"] == rp.INCONCLUSIVE and wide["verdict"] == "inconclusive"


def test_a_small_difference_inside_the_margin_is_reproduced_not_lower():
    """10 seeds 0.3 points below a Reality Check number whose interval our old
    check ignored; our interval excludes it, yet both intervals put the difference within ± 1 point."""
    values = _seeds(0.2623, 0.002)
    summary = _summary(values)
    assert summary["high"].iloc[0] < 0.2653  # the published number lies above our interval
    row = _row(values, _published(26.53, 0.29, 10))
    assert row["outcome"] == rp.REPRODUCED and row["verdict"] == "reproduced (equivalent within ± 1 point)"
    assert row["difference"] == pytest.approx(-0.3)
    assert row["difference_low"] < 0 < row["difference_high"]  # the published interval's width explains the gap
    # with a margin of 0.1 points neither equivalence nor a difference is shown
    strict = rp.judge(rp.reproduction_table(summary, _published(26.53, 0.29, 10)), 0.001, 0.95).iloc[0]
    assert strict["outcome"] == rp.INCONCLUSIVE
    # without its interval, the number is one published run: judged by the prediction interval of one run
    # (se = s sqrt(1/n + 1)), not as an exact mean (which read "ours lower" at that margin)
    single = rp.judge(rp.reproduction_table(summary, _published(26.53)), 0.001, 0.95).iloc[0]
    assert single["verdict"] == "inconclusive (published value without interval: one run, prediction interval)"
    as_exact = 100 * stats.t.ppf(0.975, 9) * stats.sem(values)  # the old half-width: 0.14, so -0.3 was "lower"
    assert single["difference_high"] - single["difference"] > as_exact and single["difference_high"] > 0


def test_clearly_different_means_read_lower_or_higher():
    assert _row(_seeds(0.23, 0.004), _published(26.53, 0.29, 10))["outcome"] == rp.LOWER
    assert _row(_seeds(0.30, 0.004), _published(26.53, 0.29, 10))["outcome"] == rp.HIGHER
    higher = _row(_seeds(0.30, 0.004), _published(26.53))
    assert higher["verdict"] == "ours higher (published value without interval: one run, prediction interval)"


def test_a_published_number_without_an_interval_is_one_run_judged_by_a_prediction_interval():
    """Hand-computed: 10 seeds, sd 0.4 points; one published run varies like one of ours, so
    se = s sqrt(1/10 + 1) = 0.4 x 1.0488 = 0.4195 points, t_{0.975, 9} = 2.2622: half-width 0.949
    points (as an exact mean it was s / sqrt(10) x t = 0.286)."""
    values = _seeds(0.2653, 0.004)
    row = _row(values, _published(26.53))
    assert row["verdict"].endswith("(published value without interval: one run, prediction interval)")
    assert math.isnan(row["se_published"]) and row["df"] == 9
    half = (row["difference_high"] - row["difference_low"]) / 2
    assert half == pytest.approx(100 * 2.262157 * 0.004 * math.sqrt(1 / 10 + 1), rel=1e-5)  # 0.949 points
    assert row["difference"] == pytest.approx(0.0, abs=1e-9) and row["outcome"] == rp.REPRODUCED  # 90%: ± 0.769
    # a run 1.5 points below: outside our mean's own interval, inside one run's spread? 1.5 > 0.949: lower
    assert _row(_seeds(0.2503, 0.004), _published(26.53))["outcome"] == rp.LOWER
    assert _row(_seeds(0.2593, 0.004), _published(26.53))["outcome"] == rp.INCONCLUSIVE  # 0.6 < 0.949
    # one seed: nothing to test (no spread to predict with), and the verdict says why
    alone = _row([0.26], _published(26.53, 0.29, 10))
    assert alone["outcome"] == rp.NO_TEST and alone["verdict"] == "no test (one seed)"


def test_test_selected_numbers_are_also_compared_with_our_best_test_epoch():
    """The thesis and Proxy-Anchor kept the epoch of best test score: their numbers are also compared
    with each run's best test score (the feedback record), like with like; others are not."""
    from dmlbench.analysis import literature as lit

    label = next(s.label for s in lit.PROTOCOL_SOURCES["thesis"])
    values = _seeds(0.640, 0.004, n=3)
    best = pd.DataFrame(
        [{**CELL, "seed": s, "best_value": v + 0.012} for s, v in enumerate(values)]  # +1.2 points at its best epoch
    )
    published = _published(65.2).assign(source=label)
    row = rp.reproduction_table(_summary(values), published, best=best).iloc[0]
    assert row["test_selected"] and row["best_n"] == 3 and row["best_mean"] == pytest.approx(0.652)
    assert row["difference"] == pytest.approx(-1.2) and row["best_difference"] == pytest.approx(0.0, abs=1e-9)
    half = 100 * stats.t.ppf(0.975, 2) * 0.004 * math.sqrt(1 / 3 + 1)
    assert row["best_difference_high"] == pytest.approx(half)
    assert row["best_outcome"] == rp.INCONCLUSIVE and row["outcome"] in (rp.INCONCLUSIVE, rp.LOWER)
    assert "Sec. 3.5.2" in rp.selection_evidence(label)
    other = rp.reproduction_table(_summary(values), _published(65.2), best=best).iloc[0]  # source "paper"
    assert not other["test_selected"] and other["best_verdict"] == "" and math.isnan(other["best_difference"])


def test_the_published_standard_error_uses_the_papers_n():
    """se_p = h / t_{0.975, n_p - 1} and the Welch-Satterthwaite df count n_p - 1: the same
    half-width over 3 runs is a smaller standard error, with fewer degrees of freedom, than over 10."""
    values = _seeds(0.262, 0.004)
    ten, three = _row(values, _published(26.53, 0.6, 10)), _row(values, _published(26.53, 0.6, 3))
    assert ten["se_published"] == pytest.approx(0.006 / stats.t.ppf(0.975, 9))
    assert three["se_published"] == pytest.approx(0.006 / stats.t.ppf(0.975, 2))
    for row, n_p in ((ten, 10), (three, 3)):
        se_o, se_p = stats.sem(values), row["se_published"]
        df = (se_o**2 + se_p**2) ** 2 / (se_o**4 / 9 + se_p**4 / (n_p - 1))
        assert row["df"] == pytest.approx(df)
        # Welch's test as scipy computes it from the two means, standard deviations and n
        welch = stats.ttest_ind_from_stats(
            values.mean(), values.std(ddof=1), 10, 0.2653, se_p * math.sqrt(n_p), n_p, equal_var=False
        )
        assert (welch.pvalue < 0.05) == (row["difference_high"] < 0 or row["difference_low"] > 0)
        half = (row["difference_high"] - row["difference_low"]) / 2
        assert half == pytest.approx(100 * stats.t.ppf(0.975, df) * math.hypot(se_o, se_p))
    assert ten["df"] != three["df"]


def test_equivalence_is_the_90_percent_interval_inside_the_margin():
    """TOST at level 0.05 rejects |d| >= margin exactly when d ± t_{0.95, df} se lies inside it."""
    for d in np.linspace(-1.5, 1.5, 13):
        result = rp.compare(0.5 + d / 100, 0.003, 10, 0.5, 0.002, 10, margin=0.01)
        se = math.hypot(0.003, 0.002)
        half = stats.t.ppf(0.95, result.df) * se
        inside = -0.01 < result.difference - half and result.difference + half < 0.01
        assert (result.outcome == rp.REPRODUCED) == inside, d
        assert (result.p_equivalent < 0.05) == inside


def test_judge_follows_the_reports_margin_and_keeps_a_matching_table():
    table = rp.reproduction_table(_summary(_seeds(0.2623, 0.002)), _published(26.53, 0.29, 10))
    assert rp.judge(table, 0.01, 0.95) is table
    assert rp.judge(table, 0.02, 0.95).iloc[0]["verdict"] == "reproduced (equivalent within ± 2 points)"
    empty = rp.reproduction_table(_summary([0.3, 0.31]), _published(26.53, dataset="sop"))
    assert empty.empty and {"verdict", "outcome", "half_width", "n_published"} <= set(empty.columns)
