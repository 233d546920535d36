"""Statistical tests: Friedman + Nemenyi with the critical-difference diagram, the Bayesian
comparison of tournament neighbours, and Holm-adjusted win rates."""

from __future__ import annotations

import math

import pandas as pd

from dmlbench.analysis import bayesian as bz
from dmlbench.analysis.friedman import FriedmanResult
from dmlbench.analysis.labels import metric_header
from dmlbench.analysis.numbers import Analysis
from dmlbench.analysis.plots import statistical_tests as plots
from dmlbench.analysis.sections.base import Document, Section
from dmlbench.analysis.statistics import MIN_BLOCKS
from dmlbench.analysis.text import markdown_table, p_value, points, probability

SELECTED_PAIRS = (
    "The pairs are neighbours in the ranking that these same test scores produced: each pair is chosen after "
    'seeing the data, which favours "A better", so read the verdicts as a description of this grid.'
)


def write(analysis: Analysis, doc: Document) -> None:
    params = analysis.params
    tests = analysis.tests
    primary = metric_header(params.report.primary_metric)
    doc.add(
        "Blocks: the datasets, the independent unit of Demšar (2006). The backbones and embedding sizes of one "
        "dataset share its training and test images, so they are repeated measures of one block, not blocks of "
        f"their own: a dataset's block holds each loss's mean rank over its experiments (ranked by seed-mean test "
        f"{primary}). This grid: {tests.grid}. The tests ask whether the losses' ranks differ across datasets by "
        "more than chance; they generalise to datasets like these under this protocol only.",
        "",
    )
    if tests.friedman is None:
        doc.note(f"Friedman and Nemenyi tests not run: {tests.skipped}.")
    else:
        f = tests.friedman
        doc.add(
            f"- Friedman test: chi2 = {f.statistic:.2f}, p = {p_value(f.pvalue)} ({f.method_text}), "
            f"N = {f.n_blocks} datasets, k = {f.n_losses} losses{_floor(f)}.",
            f"- Nemenyi post-hoc (scikit-posthocs): critical difference of mean ranks CD = {tests.cd:.2f} at "
            f"alpha = {params.report.alpha:g}; {nemenyi_sentence(analysis)}"
            if tests.nemenyi is not None
            else f"- Nemenyi post-hoc test not run: the Friedman test finds no difference at alpha = "
            f"{params.report.alpha:g}, and pairs are compared only after it does (Demšar 2006).",
            "",
        )
        if tests.nemenyi is not None:
            _critical_difference_figure(analysis, doc)
    if analysis.ranking["loss"].nunique() < 2:
        doc.note("No head-to-head comparison: the grid has one loss.")
        return
    _bayes_lines(analysis, doc)
    if tests.wins is None:
        doc.add(
            "### Win rates",
            "",
            f"Not run: win rates and their Holm-adjusted sign tests are pairwise comparisons after a Friedman test "
            f"that rejects, and count wins over at least {MIN_BLOCKS} independent datasets (over N blocks a two-sided "
            f"sign test cannot go below p = 2 / 2^N); this grid has {tests.grid}"
            + ("" if tests.friedman is None or tests.friedman.pvalue < params.report.alpha else ", and its Friedman "
               "test does not reject")
            + ". The tournament above describes the order within each experiment.",
            "",
        )  # fmt: skip
        return
    wins = tests.wins.set_index(["loss", "opponent"])
    ranked = list(analysis.ranking["loss"])
    rows = []
    for better, worse in zip(ranked, ranked[1:], strict=False):
        w = wins.loc[(better, worse)]
        rate = "-" if w["n"] == 0 else f"{w['rate']:.2f} [{w['low']:.2f}, {w['high']:.2f}]"
        rows.append(
            [
                f"{analysis.names[better]} vs {analysis.names[worse]}",
                f"{int(w['wins'])} / {int(w['defeats'])} / {int(w['ties'])}",
                rate,
                int(w["n"]),
                "-" if w["n"] == 0 else p_value(w["p_value"]),
                "-" if w["n"] == 0 else p_value(w["p_holm"]),
            ]
        )
    m = int(tests.wins["m"].iloc[0])
    doc.add(
        "### Win rates",
        "",
        "Neighbours in the tournament, head to head over the datasets (a loss wins a dataset when its mean rank "
        "there is better; win rate with its 95% Wilson interval, n = datasets decided; two-sided sign-test p, and "
        f"Holm-adjusted p over the m = {m} pairs of losses):",
        "",
        markdown_table(
            ["pair", "wins / defeats / ties", "win rate [95% CI]", "n", "sign test p", f"Holm p (m = {m})"],
            rows,
            "lrrrrr",
        ),
        "",
    )
    wins = tests.wins.assign(
        loss=tests.wins["loss"].map(analysis.names), opponent=tests.wins["opponent"].map(analysis.names)
    )
    doc.figure(
        "win_rates",
        lambda p: plots.win_rate_heatmap(wins, analysis.order, p, params.evaluate.confidence),
        "How often the row loss beats the column loss over the datasets, with 95% Wilson intervals: a rate whose "
        "interval covers 0.5 is no evidence of a difference.",
    )


def _floor(f: FriedmanResult) -> str:
    """The smallest p these blocks could give, where it was computed (the exact test)."""
    if math.isnan(f.min_pvalue):
        return ""
    return f"; the smallest p {f.n_blocks} datasets and {f.n_losses} losses can give is {p_value(f.min_pvalue)}"


def _critical_difference_figure(analysis: Analysis, doc: Document) -> None:
    tests, alpha = analysis.tests, analysis.params.report.alpha
    ranks = tests.friedman.mean_ranks.rename(index=analysis.names)
    pvalues = tests.nemenyi.rename(index=analysis.names, columns=analysis.names)
    doc.figure(
        "critical_difference",
        lambda p: plots.critical_difference_diagram(
            ranks,
            pvalues,
            tests.cd,
            p,
            alpha,
            f"Mean rank over {tests.friedman.n_blocks} datasets (1 = best); CD = {tests.cd:.2f} at alpha = {alpha:g}",
        ),
        "Critical-difference diagram: mean rank of each loss (1 = best) over the datasets, after a significant "
        f"Friedman test; losses joined by a bar are not significantly different (Nemenyi, alpha = {alpha:g}) - "
        + nemenyi_sentence(analysis),
    )


def nemenyi_sentence(analysis: Analysis) -> str:
    """The Nemenyi pairs that differ, or why none are named (no Friedman test, or not significant)."""
    tests = analysis.tests
    if tests.nemenyi is None:
        return "not run (it follows a significant Friedman test only)."
    ranks = tests.friedman.mean_ranks
    pairs = [
        f"{analysis.names[a]} > {analysis.names[b]}"
        for i, a in enumerate(ranks.index)
        for b in ranks.index[i + 1 :]
        if tests.nemenyi.loc[a, b] < analysis.params.report.alpha
    ]
    if not pairs:
        return "no pair of losses is significantly different."
    return "significant pairs: " + ", ".join(pairs) + "."


def _bayes_lines(analysis: Analysis, doc: Document) -> None:
    """The Bayesian comparison of tournament neighbours (:mod:`dmlbench.analysis.bayesian`)."""
    tests = analysis.tests
    table = tests.bayes
    primary = metric_header(analysis.params.report.primary_metric)
    rows = []
    for r in table.itertuples():
        pair = f"{analysis.names[r.a]} vs {analysis.names[r.b]}"
        if math.isnan(r.better):
            rows.append([pair, r.experiment, int(r.n), "-", "-", "-", "-"])
            continue
        difference = f"{100 * r.difference:+.1f} [{100 * r.low:+.1f}, {100 * r.high:+.1f}]"
        rows.append([pair, r.experiment, int(r.n), difference, *map(probability, (r.better, r.equivalent, r.worse))])
    seeds = sorted({int(n) for n in table.loc[table["experiment"] != bz.ACROSS, "n"]})
    if (table["experiment"] == bz.ACROSS).any():
        across = (
            f"Across datasets: baycomp's Bayesian signed-rank test on the {tests.datasets} dataset means (each the "
            f"mean of its experiments' seed means; datasets are the independent units), Monte Carlo, "
            f"{bz.NSAMPLES} draws, fixed seed."
        )
    else:
        across = (
            f"Across datasets: not run; the Bayesian signed-rank test needs at least {bz.MIN_DATASETS} independent "
            f"datasets and this grid has {tests.grid}."
        )
    doc.add(
        "### Bayesian comparison",
        "",
        "Neighbours in the tournament (A = the better-ranked loss), compared with baycomp (Benavoli et al., JMLR "
        f"2017): posterior probabilities that A is practically better than B (mean test {primary} difference "
        f"> {points(tests.rope)}), practically equivalent (within ± {points(tests.rope)}, the ROPE, "
        "`report.rope`) or practically worse. Per experiment: Bayesian t-test of the paired differences of its "
        f"n = {', '.join(map(str, seeds))} matched seeds (seed k gives both losses the same initial weights and "
        "batches; independent seeds, so no cross-validation correlation: rho = 0); its Student posterior has "
        "n - 1 degrees of freedom (its 95% credible interval is the t-interval shown), wide with few seeds, and "
        "speaks for that experiment's data split only; the experiments of one dataset share its images, so their "
        f"verdicts are not independent replications. {across} A probability >= {bz.DECISION:g} is a decision; "
        f"anything less is undecided. {SELECTED_PAIRS}",
        "",
        markdown_table(
            [
                "pair (A vs B)",
                "experiment",
                "n",
                "A - B (points) [95% CI]",
                "P(A better)",
                "P(equivalent)",
                "P(B better)",
            ],
            rows,
            "llrrrrr",
        ),
        "",
        bz.HIERARCHICAL_NOTE,
        "",
    )
    if not table["better"].notna().any():
        doc.note(f"No Bayesian comparison: every experiment has fewer than {bz.MIN_SEEDS} matched seeds.")
        return
    bayes = table.assign(a=table["a"].map(analysis.names), b=table["b"].map(analysis.names))
    doc.figure(
        "bayesian_comparison",
        lambda p: plots.bayesian_comparison(bayes, p, points(tests.rope)),
        "Bayesian comparison of neighbours in the tournament (A = the better-ranked loss): posterior "
        f"probability that A is practically better (blue), equivalent within ± {points(tests.rope)} "
        "(grey) or practically worse (red), per experiment over its n matched seeds"
        + (" and across datasets" if (table["experiment"] == bz.ACROSS).any() else "")
        + "; dotted lines at 0.05 and 0.95.",
    )


def bayes_summary(analysis: Analysis) -> str:
    """Per neighbour pair: how many experiments decide A better / equivalent / B better (P >= 0.95),
    saying how many datasets they come from and that the pairs were picked from the same ranking."""
    tests = analysis.tests
    table = tests.bayes.dropna(subset=["better"])
    parts = []
    for (a, b), group in table.groupby(["a", "b"], sort=False):
        names = {
            "better": f"{analysis.names[a]} better",
            "equivalent": "equivalent",
            "worse": f"{analysis.names[b]} better",
            "undecided": "undecided",
        }
        per_experiment = group[group["experiment"] != bz.ACROSS]
        counts = pd.Series([bz.verdict(r.better, r.equivalent, r.worse) for r in per_experiment.itertuples()])
        counts = counts.value_counts()
        text = f"{analysis.names[a]} vs {analysis.names[b]}: " + ", ".join(
            f"{names[v]} in {counts[v]}" for v in ("better", "equivalent", "worse", "undecided") if v in counts
        )
        text += f" of {len(per_experiment)} experiment{'' if len(per_experiment) == 1 else 's'}"
        across = group[group["experiment"] == bz.ACROSS]
        if len(across):
            r = across.iloc[0]
            text += f"; across datasets {names[bz.verdict(r['better'], r['equivalent'], r['worse'])]}"
        parts.append(text)
    seeds = sorted({int(n) for n in table.loc[table["experiment"] != bz.ACROSS, "n"]})
    across = (
        ""
        if (table["experiment"] == bz.ACROSS).any()
        else f"; no test across datasets (it needs {bz.MIN_DATASETS} datasets)"
    )
    return (
        f"- **Bayesian comparison** of tournament neighbours, per experiment over its "
        f"n = {', '.join(map(str, seeds))} seeds (ROPE ± {points(tests.rope)} of test "
        f"{metric_header(analysis.params.report.primary_metric)}; a verdict needs P >= {bz.DECISION:g}): "
        + "; ".join(parts)
        + f". The experiments come from {tests.grid}: those of one dataset are not independent replications, "
        f"and each pair was picked as neighbours in the ranking these same scores produced{across}."
    )


SECTION = Section("Statistical tests", "Statistical tests", write)
