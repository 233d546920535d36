"""Tournament of losses: ranks within experiments summed over them (the thesis's Table 11)."""

from __future__ import annotations

import math

from dmlbench.analysis.labels import metric_header
from dmlbench.analysis.numbers import Analysis
from dmlbench.analysis.sections.base import Document, Section, demo_note
from dmlbench.analysis.text import format_interval, markdown_table


def write(analysis: Analysis, doc: Document) -> None:
    params = analysis.params
    primary = params.report.primary_metric
    confidence = params.evaluate.confidence
    rows = []
    for r in analysis.ranking.itertuples():
        interval = analysis.rank_intervals[r.loss]
        rows.append(
            [
                analysis.names[r.loss],
                f"{r.total_rank:g}",
                format_interval(
                    interval.mean, interval.low, interval.high, interval.n, scale=1, digits=2, show_n=False
                ),
                "-" if math.isnan(r.std_rank) else f"{r.std_rank:.2f}",
                r.experiments,
            ]
        )
    doc.add(
        f"Losses ranked within each experiment (dataset x backbone x embedding size) by the seed-mean test "
        f"{metric_header(primary)}, rank 1 = best, ties share the average rank; then summed over "
        "experiments, as in the thesis's Table 11 (which ranked by R@1 over 12 CUB200 experiments; "
        "`tests/test_tournament.py` reproduces that table from its numbers). The standard deviation is the "
        f"thesis's (sample, ddof = 1); the mean rank carries its {int(confidence * 100)}% t-interval over "
        "its n = experiments (last column); where every experiment gives a loss the same rank there is no "
        "spread to build an interval from, and the table says so rather than print a zero-width interval.",
        "",
        markdown_table(["loss", "total rank", "mean rank [95% CI]", "std of rank", "experiments (n)"], rows),
        "",
    )
    note = demo_note(params)
    if note:
        doc.note(note)


SECTION = Section("Tournament of losses", "Tournament", write)
