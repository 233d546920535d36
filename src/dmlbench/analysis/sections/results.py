"""Results on the test classes: one table per dataset/backbone (every metric with its interval),
the untrained trunk's row, the cross-validation table, and the metric and Recall@K figures."""

from __future__ import annotations

import math
from collections.abc import Iterable

import pandas as pd

from dmlbench.analysis import literature as lit
from dmlbench.analysis import reproduction as rp
from dmlbench.analysis.cross_validation import cross_validation_table
from dmlbench.analysis.labels import metric_header
from dmlbench.analysis.numbers import TOP1, Analysis
from dmlbench.analysis.plots import results as plots
from dmlbench.analysis.sections.base import Document, Section
from dmlbench.analysis.text import (
    bootstrap_unit,
    common_n,
    format_bounds,
    format_interval,
    markdown_table,
    p_value,
    points,
)
from dmlbench.tracking.workspace import TRAINED_HERE


def table_metrics(present: Iterable[str]) -> list[str]:
    """Columns of a results table, from the metrics a cell has: P@1 (= R@1), Recall@K by K
    (R@2/4/8 for CUB/Cars, R@10/100/1000 for SOP, ...), R-Precision, MAP@R, then NMI, AMI and F1."""
    present = set(present)
    recalls = sorted(
        (m for m in present if m.startswith("recall_at_") and m != "recall_at_1"), key=lambda m: int(m[10:])
    )
    head = ["precision_at_1"] if "precision_at_1" in present else []
    return head + recalls + [m for m in ("r_precision", "map_at_r", "nmi", "ami", "f1") if m in present]


def write(analysis: Analysis, doc: Document) -> None:
    params, results = analysis.params, analysis.results
    confidence = params.evaluate.confidence
    chronological = {name: i for i, name in enumerate(analysis.order)}
    for (dataset, backbone), block in analysis.summary.groupby(["dataset", "backbone"], sort=False):
        metrics = table_metrics(block["metric"])
        doc.add(f"### `{dataset}` / `{backbone}`", "")
        n = common_n(block["n"])  # stated once; a cell with another n (a missing seed) states its own
        exceptions = "" if block["n"].nunique() == 1 else " unless the cell states its own n"
        doc.add(
            f"Every trained cell: mean over n = {n} seeds [95% t-interval over seeds, clipped to the metric's "
            f"range]{exceptions}.",
            "",
        )
        rows = []
        trained = trained_where(results.identities, dataset, backbone)
        cells = sorted(
            block.groupby(["loss", "dim"], sort=False),
            key=lambda item: (item[0][1], chronological[analysis.names[item[0][0]]]),
        )
        for (loss, dim), cell in cells:
            by_metric = cell.set_index("metric")
            rows.append(
                [analysis.names[loss], dim]
                + ([trained.get((loss, dim), "-")] if trained else [])
                + [
                    format_interval(
                        *by_metric.loc[m, ["mean", "low", "high"]],
                        int(by_metric.loc[m, "n"]),
                        show_n=int(by_metric.loc[m, "n"]) != n,
                    )
                    for m in metrics
                ]
            )
        baseline = _baseline_block(results.baselines, dataset, backbone)
        if baseline is not None:
            row = _baseline_row(baseline, metrics)
            rows.append(row[:2] + (["-"] if trained else []) + row[2:])
        columns = ["loss", "dim", *(["trained"] if trained else []), *map(metric_header, metrics)]
        doc.add(markdown_table(columns, rows), "")
        if baseline is not None:
            doc.add(
                f"*Pretrained*: the trunk's pooled features before any training (the thesis's \"Pretrained\" row), "
                f"evaluated once, so its interval is a {int(confidence * 100)}% bootstrap interval over the test "
                "classes (each drawn with all its queries: the queries of one class share its difficulty), n = test "
                "classes (in its row), not a t-interval over seeds.",
                "",
            )
    sentence = provenance_sentence(results.identities, results.identities.get("provenance", pd.Series()).nunique() > 1)
    if sentence:
        doc.add(sentence, "")
    doc.demo_note(params)
    doc.add(*_cross_validation_block(analysis))
    doc.add(*reproduction_lines(analysis))
    runs = analysis.display(results.runs)
    primary = params.report.primary_metric
    main_metrics = list(dict.fromkeys([primary, "r_precision", TOP1]))
    doc.figure(
        "metric_by_loss",
        lambda p: plots.metric_by_loss(runs, main_metrics, p, analysis.order, confidence),
        f"Test {', '.join(map(metric_header, main_metrics))} per loss (oldest left) and embedding "
        f"size; points are seed means, bars {int(confidence * 100)}% t-intervals - "
        + _best_sentence(analysis, primary),
    )
    doc.figure(
        "recall_by_loss",
        lambda p: plots.recall_by_loss(runs, p, analysis.order, confidence),
        "Recall@K per loss for every embedding size (thesis Fig. 27/28): " + _recall_sentence(analysis),
    )


def provenance_sentence(identities: pd.DataFrame, column: bool) -> str:
    """One sentence on where the runs were trained (``column``: the table has the *trained* column)."""
    where = "; `reports/results.csv` gives each run's provenance, origin, device and the protocol, dataset checksum "
    where += "and split it is paired on."
    if column:
        return (
            "Column *trained*: `here` = every seed of the cell was trained in this workspace, `pulled` = its "
            "runs' outputs came from a DVC remote or cache (a published grid) and were not trained here" + where
        )
    if identities.empty or "provenance" not in identities.columns:
        return ""
    if (identities["provenance"] == TRAINED_HERE).all():
        return "Every run was trained in this workspace" + where
    return "Every run's outputs came from a DVC remote or cache (pulled, not trained in this workspace)" + where


def trained_where(identities: pd.DataFrame, dataset: str, backbone: str) -> dict[tuple[str, int], str]:
    """(loss, dim) -> ``here``, ``pulled`` or ``2 here, 1 pulled`` (seeds) for one table; empty when
    every run of the grid has the same provenance (one sentence says which) or none was read."""
    if identities.empty or "provenance" not in identities.columns or identities["provenance"].nunique() < 2:
        return {}
    rows = identities[(identities["dataset"] == dataset) & (identities["backbone"] == backbone)]
    marks = {}
    for (loss, dim), runs in rows.groupby(["loss", "dim"], sort=False):
        here = int((runs["provenance"] == TRAINED_HERE).sum())
        pulled = len(runs) - here
        marks[(loss, dim)] = "here" if not pulled else "pulled" if not here else f"{here} here, {pulled} pulled"
    return marks


def _baseline_row(baseline: pd.DataFrame, metrics: list[str]) -> list:
    """The untrained trunk's row: one bootstrap interval per metric; their n (test classes, or queries
    for older outputs), when shared, stated once in the row's label."""
    by_metric = baseline.set_index("metric")
    bounded = by_metric[by_metric["low"].notna()]
    shared = bounded[["n", "unit", "queries"]].drop_duplicates()
    common = shared.iloc[0] if len(shared) == 1 else None
    cells = []
    for m in metrics:
        if m not in by_metric.index:
            cells.append("-")
            continue
        mean, low, high, n, unit, queries = by_metric.loc[m, ["mean", "low", "high", "n", "unit", "queries"]]
        if common is not None and not math.isnan(low):
            cells.append(format_interval(mean, low, high, int(n), show_n=False))
        else:
            cells.append(format_bounds(mean, low, high, int(n), unit=bootstrap_unit(unit, queries)))
    label = f"*Pretrained* ({baseline['weights'].iloc[0]}, no training" + (
        f"; n = {int(common['n'])} test {bootstrap_unit(common['unit'], common['queries'])})"
        if common is not None
        else ")"
    )
    return [label, int(baseline["dim"].iloc[0]), *cells]


def reproduction_lines(analysis: Analysis) -> list[str]:
    """Per grid cell of a published setup: our interval beside the published one, the difference
    with its interval (Welch, or the prediction interval of one published run), the equivalence test's
    p and the verdict, and for numbers that kept their best test epoch the same against our
    best-test-epoch score (:mod:`~dmlbench.analysis.reproduction`). One line when the protocol follows
    no published setup."""
    params = analysis.params
    lines = ["### Published numbers reproduced?", ""]
    if params.protocol_name not in lit.PROTOCOL_SOURCES:
        return lines + [
            f"Protocol `{params.protocol_name}` follows no published setup: there is no published number to "
            "reproduce for this grid.",
            "",
        ]
    confidence, rope = params.evaluate.confidence, params.report.rope
    table = rp.judge(analysis.reproduction, rope, confidence)
    if table.empty:
        return lines + [
            f"Protocol `{params.protocol_name}` follows a published setup, but no published number matches a cell "
            "of this grid (dataset, backbone, loss, embedding size and metric).",
            "",
        ]
    n, level = common_n(table["n"]), int(round(100 * confidence))
    selected = table["test_selected"].astype(bool) if "test_selected" in table.columns else table["n"] < 0
    rows = []
    for r, on_test in zip(table.itertuples(), selected, strict=True):
        interval = "" if pd.isna(r.half_width) else f" ± {r.half_width:.2f} (n={int(r.n_published)})"
        row = [
            analysis.names.get(r.loss, r.loss),
            f"{r.dataset}/{r.backbone}/{r.dim}",
            metric_header(r.metric),
            f"{r.published:.2f}{interval}{'?' if r.uncertain else ''} ({r.source})",
            format_interval(r.mean, r.low, r.high, int(r.n), show_n=int(r.n) != n),
            _difference(r.difference, r.difference_low, r.difference_high),
            "-" if math.isnan(r.p_equivalent) else p_value(r.p_equivalent),
            r.verdict,
        ]
        if selected.any():
            best = not pd.isna(getattr(r, "best_mean", math.nan))
            row += (
                [
                    format_interval(r.best_mean, r.best_low, r.best_high, int(r.best_n), show_n=int(r.best_n) != n),
                    _difference(r.best_difference, r.best_difference_low, r.best_difference_high),
                    r.best_verdict,
                ]
                if on_test and best
                else ["not recorded (no test-set feedback)" if on_test else "-", "-", "-"]
            )
        rows.append(row)
    verdicts = table["best_outcome"].where(selected & (table["best_outcome"] != ""), table["outcome"])
    counts = verdicts.value_counts()
    tally = ", ".join(
        f"{counts.get(o, 0)} {o}" for o in (rp.LOWER, rp.HIGHER, rp.INCONCLUSIVE, rp.NO_TEST) if counts.get(o, 0)
    )
    single = int(table["half_width"].isna().sum())
    header = [
        "loss",
        "cell",
        "metric",
        "published (± 95% half-width, n runs)",
        f"ours [{level}% CI]",
        f"ours - published, points [{level}% CI]",
        f"TOST p (± {points(rope)})",
        "verdict",
    ]
    if selected.any():
        header += ["ours at best test epoch", "best epoch - published", "verdict, like with like"]
    evidence = sorted({rp.selection_evidence(source) for source in table.loc[selected, "source"]} - {None})
    return lines + [
        f"Protocol `{params.protocol_name}` follows a published setup. Each published number is compared with our "
        f"mean over n = {n} seeds (independent training runs; a cell with another n states it), interval against "
        "interval, in points of the metric: our standard error is s/sqrt(n) over the seeds; a published number "
        "with an interval gets the standard error behind its 95% half-width h over the paper's n runs "
        "(se = h / t(0.975, n - 1); the Reality Check: 10 runs), and Welch's t-test gives ours - published with "
        f"its {level}% interval (Welch-Satterthwaite df). A published number without an interval is one training "
        "run, which varies about as much as one of ours: it is judged by the prediction interval of a single run, "
        f"se = s sqrt(1/n + 1) with n - 1 df ({single} of {len(table)} here), not taken as an exact mean. The "
        f"equivalence test (TOST, two one-sided tests) asks whether the difference lies within ± {points(rope)} "
        f"(`report.rope`), p in the table. Verdict: *reproduced* when TOST rejects a difference of {points(rope)} "
        f"or more at level {1 - confidence:.2g} (the {100 - 2 * (100 - level)}% interval of the difference inside "
        f"± {points(rope)}); else *ours lower*/*higher* when the {level}% interval of the difference excludes 0; "
        "else *inconclusive*. `?` = a published number read off a figure or in another paper's table, not in its own."
        + (
            " Like with like: these published numbers kept the epoch with the best *test* score ("
            + "; ".join(evidence)
            + "), ours the epoch picked on the validation classes, so they are also compared, the same way, with "
            "our best-test-epoch score (each run's best test score over its epochs, the test-set feedback record, "
            "mean over seeds); that comparison's verdict is the like-with-like one and the one counted."
            if selected.any()
            else ""
        )
        + f" {counts.get(rp.REPRODUCED, 0)} of {len(table)} published numbers reproduced"
        + (f"; {tally}." if tally else "."),
        "",
        markdown_table(header, rows, "lllrrrrl" + ("rrl" if selected.any() else "")),
        "",
    ]


def _difference(difference: float, low: float, high: float) -> str:
    return "-" if math.isnan(low) else f"{difference:+.1f} [{low:+.1f}, {high:+.1f}]"


def _baseline_block(baselines: pd.DataFrame, dataset: str, backbone: str) -> pd.DataFrame | None:
    if baselines.empty:
        return None
    block = baselines[(baselines["dataset"] == dataset) & (baselines["backbone"] == backbone)]
    return None if block.empty else block


def _cross_validation_block(analysis: Analysis) -> list[str]:
    rows = cross_validation_table(
        analysis.results.runs,
        analysis.results.folds,
        analysis.papers.literature,
        analysis.names,
        analysis.params.evaluate.confidence,
    )
    if not rows:
        return []
    return [
        "### Cross-validation: the fold models and their ensemble",
        "",
        "P@1 (= R@1) two ways: the concatenated embedding of a run's fold models (the Reality Check's way, the "
        "score used everywhere else in this report; mean and 95% t-interval over seeds), and the fold models "
        "scored one by one (the thesis's way, its Table 12: mean and sample standard deviation over the fold "
        "models of every seed; a spread, not an interval), beside the thesis's number where it published one.",
        "",
        markdown_table(
            ["loss", "dataset / backbone", "dim", "concatenated", "fold models (mean ± sd)", "thesis"], rows
        ),
        "",
    ]


def _best_sentence(analysis: Analysis, metric: str) -> str:
    summary = analysis.summary[analysis.summary["metric"] == metric]
    parts = []
    for (dataset, backbone, dim), block in summary.groupby(["dataset", "backbone", "dim"], sort=False):
        block = block.sort_values("mean", ascending=False)
        best, second = block.iloc[0], block.iloc[1] if len(block) > 1 else None
        text = f"{analysis.names[best['loss']]} leads at {dataset}/{backbone}/{dim}"
        if second is not None:
            separated = not math.isnan(best["low"]) and best["low"] > second["high"]
            text += " (clear of the runner-up's interval)" if separated else " (its interval overlaps the runner-up's)"
        parts.append(text)
    return "; ".join(parts[:4]) + ("; ..." if len(parts) > 4 else "") + "."


def _recall_sentence(analysis: Analysis) -> str:
    """Whether the order of the losses by seed-mean Recall@K is the same for every K in each cell."""
    summary = analysis.summary[analysis.summary["metric"].str.startswith("recall_at_")]
    cells = changed = 0
    for _, block in summary.groupby(["dataset", "backbone", "dim"], sort=False):
        orders = {tuple(g.sort_values("mean", ascending=False)["loss"]) for _, g in block.groupby("metric")}
        cells += 1
        changed += len(orders) > 1
    if not changed:
        return f"the order of the losses is the same at every K in all {cells} cell(s), so R@1 carries the ranking."
    return f"the order of the losses changes with K in {changed} of {cells} cell(s)."


SECTION = Section("Results on the test classes", "Results", write)
