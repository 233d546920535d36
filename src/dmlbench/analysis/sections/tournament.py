"""Tournament of losses: ranks within experiments summed over them (the thesis's Table 11)."""

from __future__ import annotations

import math

from dmlbench.analysis.labels import metric_header
from dmlbench.analysis.numbers import Analysis
from dmlbench.analysis.sections.base import Document, Section
from dmlbench.analysis.text import format_interval, markdown_table


def write(analysis: Analysis, doc: Document) -> None:
    params = analysis.params
    primary = params.report.primary_metric
    confidence = params.evaluate.confidence
    tests = analysis.tests
    datasets = tests.datasets
    rows = []
    for r in analysis.ranking.itertuples():
        interval = analysis.rank_intervals[r.loss]
        rows.append(
            [
                analysis.names[r.loss],
                f"{r.total_rank:g}",
                f"{r.mean_rank:.2f}",
                "-" if math.isnan(r.std_rank) else f"{r.std_rank:.2f}",
                r.experiments,
                "-"  # one dataset: the header says n = 1, the text why there is no interval
                if interval.n < 2
                else format_interval(
                    interval.mean, interval.low, interval.high, interval.n, scale=1, digits=2, show_n=False
                ),
            ]
        )
    doc.add(
        f"Losses ranked within each experiment (dataset x backbone x embedding size) by the seed-mean test "
        f"{metric_header(primary)}, rank 1 = best, ties share the average rank; then summed over "
        "experiments, as in the thesis's Table 11 (which ranked by R@1 over 12 CUB200 experiments; "
        "`tests/test_tournament.py` reproduces that table from its numbers). Total rank, mean rank and the "
        "thesis's standard deviation (sample, ddof = 1) over experiments describe this grid; they are not a test, "
        "because the experiments of one dataset share its images and are not independent. The interval is "
        f"built over the independent units instead: the {int(confidence * 100)}% t-interval of the mean rank "
        "over datasets, each dataset's rank being the loss's mean rank over its experiments "
        f"(n = {datasets} dataset{'' if datasets == 1 else 's'}; "
        + (
            "with one dataset there is no interval)."
            if datasets == 1
            else "where every dataset gives a loss the same rank the table says so rather than print a "
            "zero-width interval)."
        ),
        "",
        markdown_table(
            [
                "loss",
                "total rank",
                "mean rank",
                "std of rank",
                "experiments",
                f"mean rank over datasets [95% CI] (n = {datasets})",
            ],
            rows,
        ),
        "",
    )
    doc.demo_note(params)


SECTION = Section("Tournament of losses", "Tournament", write)
