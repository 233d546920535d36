"""Summary: the tournament's headline, the tests' verdicts, papers vs reality, feedback and compute."""

from __future__ import annotations

from collections.abc import Iterable

import pandas as pd

from dmlbench.analysis import claims as cl
from dmlbench.analysis.labels import metric_header
from dmlbench.analysis.numbers import Analysis, Tests, seed_means
from dmlbench.analysis.sections.base import NO_TIMINGS, Document, Section, demo_note
from dmlbench.analysis.sections.papers import ours_label, ours_range
from dmlbench.analysis.sections.statistical_tests import bayes_summary, nemenyi_sentence
from dmlbench.analysis.text import format_interval, p_value
from dmlbench.evaluate.intervals import bounded_t_interval


def and_join(items: Iterable[str]) -> str:
    """``A``, ``A and B``, ``A, B and C``."""
    items = list(items)
    return items[0] if len(items) == 1 else ", ".join(items[:-1]) + " and " + items[-1]


def tournament_headline(
    ranking: pd.DataFrame, ranks: pd.DataFrame, names: dict[str, str], metric: str, tests: Tests, alpha: float
) -> str:
    """The summary's tournament bullet: a winner only when the tests separate the first-ranked loss
    from every other one; otherwise whom it is not separated from and why. A tie in total rank
    has no winner."""
    best = ranking.iloc[0]
    count = int(best["experiments"])
    over = f"{count} experiment{'' if count == 1 else 's'} ranked by test {metric}"
    tied = ranking[ranking["total_rank"] == best["total_rank"]]["loss"].tolist()
    if len(tied) > 1:
        return f"- **Tournament:** {and_join(names[loss] for loss in tied)} tie for first over {over}; no winner."
    own = ranks[ranks["loss"] == best["loss"]]["rank"]
    first = f"{names[best['loss']]} ranks first over {over} (alone at rank 1 in {int((own == 1).sum())} of {len(own)})"
    others = [loss for loss in ranking["loss"] if loss != best["loss"]]
    separated = tests.separated_from(best["loss"], others, alpha)
    how = "; ".join(dict.fromkeys(separated.values()))
    unseparated = [loss for loss in others if loss not in separated]
    if not unseparated:
        return f"- **Tournament winner:** {first}; the tests separate it from every other loss ({how})."
    text = f"- **Tournament:** {first}, but no test separates it from {and_join(names[x] for x in unseparated)}"
    if separated:
        text += f" (it is separated from {and_join(names[x] for x in separated)}: {how})"
    return text + f"; {tests.why_not_separated(alpha)}. No winner."


def demo_caveat(analysis: Analysis) -> list[str]:
    """The demo's limits, stated where its numbers are summarised; how many models picked their
    last epoch (still improving: longer training may change the ranking) for every grid."""
    params, selections = analysis.params, analysis.results.selections
    protocol = params.protocol
    lines = []
    if "glyphs" in params.datasets:
        lines.append(
            "- **Demo data:** these numbers come from the offline demo (`glyphs`, characters rendered from "
            f"matplotlib's fonts; {and_join(f'`{b}`' for b in params.backbones)} from "
            f"{'ImageNet' if protocol.pretrained else 'random'} weights, {protocol.epochs} epochs). They rank the "
            "losses on this data and protocol only and say nothing about CUB200, CARS196, SOP or In-Shop."
        )
    last = int((selections["selected_epoch"] >= protocol.epochs).sum())
    if last:
        gains = last_epoch_gains(analysis)
        size = (
            f"; their last epoch added a median {100 * gains.median():.1f} points of validation "
            f"{metric_header(protocol.selection_metric)} (largest {100 * gains.max():.1f})"
            if len(gains)
            else ""
        )
        lines.append(
            f"- **Still improving:** {last} of {len(selections)} models picked their last epoch "
            f"({protocol.epochs}) on the validation classes{size}, so longer training may change the ranking."
        )
    return lines


def last_epoch_gains(analysis: Analysis) -> pd.Series:
    """Per run that picked its last epoch: validation selection metric at the last epoch minus the one before."""
    history, metric = analysis.results.history, f"val/{analysis.params.protocol.selection_metric}"
    if metric not in history or history.empty:
        return pd.Series(dtype=float)
    keys = ["dataset", "backbone", "loss", "dim", "seed", "fold"]
    gains = []
    for _, run in history.dropna(subset=[metric]).groupby(keys, dropna=False):
        scores = run.sort_values("epoch")[metric].to_numpy()
        if len(scores) > 1 and scores[-1] >= scores.max():
            gains.append(scores[-1] - scores[-2])
    return pd.Series(gains, dtype=float)


def papers_headline(analysis: Analysis) -> str | None:
    """The summary's papers-vs-reality bullet: the median gain papers claimed over contrastive against
    their own paper's contrastive number (borrowed baselines of the same backbone and size counted
    apart, claims with neither not counted), what the 2020 re-runs measured, and our runs' range."""
    papers = analysis.papers
    claims, ours = papers.claimed["contrastive"], papers.ours["contrastive"]
    counts = cl.count_claims(claims)
    if not counts.own and not counts.borrowed:
        return None
    reference = papers.reference["contrastive"]
    parts = []
    if counts.own:
        parts.append(
            f"papers claimed a median {cl.median_improvement(claims, cl.OWN):+.0f}% R@1 over contrastive against the "
            f"contrastive number their own paper reports (n = {counts.own} claims from {counts.papers_own} "
            f"paper{'' if counts.papers_own == 1 else 's'}; a claim is one paper's number for one loss, dataset, "
            "backbone and embedding size)"
        )
    if counts.borrowed:
        parts.append(
            f"{counts.borrowed} claims set against other papers' contrastive numbers at the same backbone and size "
            f"give a median {cl.median_improvement(claims, cl.BORROWED):+.0f}%"
        )
    if counts.none:
        parts.append(f"{counts.none} claims have neither baseline and are not counted")
    line = "- **Papers vs reality:** " + "; ".join(parts)
    if len(reference):
        line += (
            f"; the Reality Check and the thesis re-measured a median {reference['improvement'].median():+.1f}% "
            f"(n = {len(reference)}: each loss on each dataset in each study)"
        )
    if len(ours):
        line += f"; {ours_label(analysis)} give {ours_range(ours)}"
        if demo_note(analysis.params) is not None:
            line += (
                " (demo data and protocol: not comparable with the papers' numbers, and not evidence that "
                "newer losses are worse)"
            )
    return line + "."


def write(analysis: Analysis, doc: Document) -> None:
    params = analysis.params
    primary = metric_header(params.report.primary_metric)
    lines = demo_caveat(analysis) + [
        tournament_headline(
            analysis.ranking, analysis.ranks, analysis.names, primary, analysis.tests, params.report.alpha
        )
    ]
    tests = analysis.tests
    if tests.friedman is not None:
        f = tests.friedman
        verdict = "differ" if f.pvalue < params.report.alpha else "cannot be told apart"
        lines.append(
            f"- **Friedman test** over {f.n_blocks} datasets x {f.n_losses} losses: chi2 = {f.statistic:.2f}, "
            f"p = {p_value(f.pvalue)} ({f.method} p): the losses' ranks {verdict} at alpha = "
            f"{params.report.alpha:g}; Nemenyi: {nemenyi_sentence(analysis)}"
        )
    else:
        lines.append(f"- **Friedman and Nemenyi tests not run:** {tests.skipped}.")
    if tests.bayes is not None and tests.bayes["better"].notna().any():
        lines.append(bayes_summary(analysis))
    line = papers_headline(analysis)
    if line:
        lines.append(line)
    if len(analysis.bias):
        per_seed = seed_means(analysis.bias, ["bias"], ["seed"])["bias"]
        interval = bounded_t_interval(per_seed.to_numpy(), params.evaluate.confidence, 0.0, 1.0)
        models = len(analysis.bias) // max(len(per_seed), 1)
        gain = format_interval(interval.mean, interval.low, interval.high, interval.n, show_n=False)
        lines.append(
            "- **Test-set feedback:** picking each run's epoch on the test set instead of on the validation classes "
            f"would have added {gain} points of test {metric_header(str(analysis.bias['metric'].iloc[0]))} "
            f"(95% t-interval over n = {interval.n} seeds, clipped at 0; each seed's value is the mean of its "
            f"{models} models over every loss and embedding size)."
        )
    costs = analysis.costs
    devices = ", ".join(sorted(set(costs["device"])))
    if analysis.results.timings:
        lines.append(
            f"- **Compute:** {costs['train_seconds'].sum() / 60:.1f} training minutes for {len(costs)} runs "
            f"({devices})."
        )
    else:
        lines.append(f"- **Compute:** {len(costs)} runs ({devices}); training timings unavailable: {NO_TIMINGS}.")
    lines.append("")
    doc.add(*lines)


SECTION = Section("Summary", "Summary", write)
