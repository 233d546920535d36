"""Summary: the tournament's headline, the tests' verdicts, papers vs reality, feedback and compute."""

from __future__ import annotations

from typing import Any

import pandas as pd

from dmlbench.analysis.labels import metric_header
from dmlbench.analysis.numbers import Analysis
from dmlbench.analysis.sections.base import Document, Section
from dmlbench.analysis.sections.papers import ours_label
from dmlbench.analysis.sections.statistical_tests import bayes_summary, nemenyi_sentence
from dmlbench.analysis.text import format_interval, p_value
from dmlbench.evaluate.intervals import t_interval


def tournament_headline(
    ranking: pd.DataFrame, rank_intervals: dict[str, Any], names: dict[str, str], metric: str
) -> str:
    """The summary's tournament bullet: the winner, or every loss sharing the best total rank (a
    tie has no winner), with the mean rank's interval."""
    best = ranking.iloc[0]
    interval = rank_intervals[best["loss"]]
    rank = format_interval(interval.mean, interval.low, interval.high, interval.n, scale=1, digits=2)
    tied = ranking[ranking["total_rank"] == best["total_rank"]]["loss"].tolist()
    over = f"over {int(best['experiments'])} experiment(s) ranked by test {metric}."
    if len(tied) > 1:
        return f"- **Tournament:** {' and '.join(names[loss] for loss in tied)} tie for first, mean rank {rank} {over}"
    return f"- **Tournament winner:** {names[best['loss']]}, mean rank {rank} {over}"


def write(analysis: Analysis, doc: Document) -> None:
    params = analysis.params
    primary = metric_header(params.report.primary_metric)
    lines = [tournament_headline(analysis.ranking, analysis.rank_intervals, analysis.names, primary)]
    tests = analysis.tests
    if tests.skipped is None:
        verdict = "differ" if tests.friedman.pvalue < params.report.alpha else "cannot be told apart"
        seed_blocks = " (seed blocks, not independent: p is optimistic)" if tests.blocks == "experiment_seed" else ""
        lines.append(
            f"- **Friedman test** over {tests.friedman.n_blocks} blocks x {tests.friedman.n_losses} losses"
            f"{seed_blocks}: chi2 = {tests.friedman.statistic:.2f}, p = {p_value(tests.friedman.pvalue)}: the losses' "
            f"ranks {verdict} at alpha = {params.report.alpha:g}; Nemenyi: {nemenyi_sentence(analysis)}"
        )
    else:
        lines.append(f"- **Friedman and Nemenyi tests not run:** {tests.skipped}.")
    if tests.bayes is not None and tests.bayes["better"].notna().any():
        lines.append(bayes_summary(analysis))
    papers = analysis.papers
    claims, ours = papers.claimed["contrastive"], papers.ours["contrastive"]
    if len(claims):
        line = (
            f"- **Papers vs reality:** papers claimed a median {claims['improvement'].median():+.0f}% R@1 over "
            f"contrastive ({len(claims)} claims); the Reality Check and the thesis re-measured a median "
            f"{papers.reference['contrastive']['improvement'].median():+.1f}%"
        )
        if len(ours):
            line += f"; {ours_label(analysis)} give {ours['estimate'].min():+.1f}% to {ours['estimate'].max():+.1f}%"
        lines.append(line + ".")
    if len(analysis.bias):
        interval = t_interval(analysis.bias["bias"].to_numpy(), params.evaluate.confidence)
        lines.append(
            "- **Test-set feedback:** picking each run's epoch on the test set would have added "
            f"{format_interval(interval.mean, interval.low, interval.high, interval.n)} points of test "
            f"{metric_header(str(analysis.bias['metric'].iloc[0]))}."
        )
    costs = analysis.costs
    lines += [
        f"- **Compute:** {costs['train_seconds'].sum() / 60:.1f} training minutes for {len(costs)} runs "
        f"({', '.join(sorted(set(costs['device'])))}).",
        "",
    ]
    doc.add(*lines)


SECTION = Section("Summary", "Summary", write)
