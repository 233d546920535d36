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
from dmlbench.analysis.sections.base import Document, Section, demo_note
from dmlbench.analysis.text import common_n, format_bounds, format_interval, markdown_table, p_value, points


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
        doc.add(f"Every trained cell: mean over n = {n} seeds [95% interval]{exceptions}.", "")
        rows = []
        cells = sorted(
            block.groupby(["loss", "dim"], sort=False),
            key=lambda item: (item[0][1], chronological[analysis.names[item[0][0]]]),
        )
        for (loss, dim), cell in cells:
            by_metric = cell.set_index("metric")
            rows.append(
                [analysis.names[loss], dim]
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
            rows.append(_baseline_row(baseline, metrics))
        doc.add(markdown_table(["loss", "dim", *map(metric_header, metrics)], rows), "")
        if baseline is not None:
            doc.add(
                f"*Pretrained*: the trunk's pooled features before any training (the thesis's \"Pretrained\" row), "
                f"evaluated once, so its interval is a {int(confidence * 100)}% per-query bootstrap interval "
                "with n = test queries (in its row), not a t-interval over seeds.",
                "",
            )
    note = demo_note(params)
    if note:
        doc.note(note)
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


def _baseline_row(baseline: pd.DataFrame, metrics: list[str]) -> list:
    """The untrained trunk's row: one bootstrap interval per metric; their n (test queries), when
    shared, stated once in the row's label."""
    by_metric = baseline.set_index("metric")
    bounded = by_metric[by_metric["low"].notna()]
    queries = common_n(bounded["n"]) if bounded["n"].nunique() == 1 else None
    cells = []
    for m in metrics:
        if m not in by_metric.index:
            cells.append("-")
            continue
        mean, low, high = by_metric.loc[m, ["mean", "low", "high"]]
        if queries is not None and not math.isnan(low):
            cells.append(format_interval(mean, low, high, queries, show_n=False))
        else:
            cells.append(format_bounds(mean, low, high, int(by_metric.loc[m, "n"])))
    label = f"*Pretrained* ({baseline['weights'].iloc[0]}, no training" + (
        f"; n = {queries} test queries)" if queries is not None else ")"
    )
    return [label, int(baseline["dim"].iloc[0]), *cells]


def reproduction_lines(analysis: Analysis) -> list[str]:
    """Per grid cell of a published setup: our interval beside the published one, the difference
    with its Welch interval, the equivalence test's p and the verdict (:mod:`~dmlbench.analysis.reproduction`).
    One line when the protocol follows no published setup."""
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
    rows = []
    for r in table.itertuples():
        interval = "" if pd.isna(r.half_width) else f" ± {r.half_width:.2f} (n={int(r.n_published)})"
        rows.append(
            [
                analysis.names.get(r.loss, r.loss),
                f"{r.dataset}/{r.backbone}/{r.dim}",
                metric_header(r.metric),
                f"{r.published:.2f}{interval}{'?' if r.uncertain else ''} ({r.source})",
                format_interval(r.mean, r.low, r.high, int(r.n), show_n=int(r.n) != n),
                "-"
                if math.isnan(r.difference_low)
                else f"{r.difference:+.1f} [{r.difference_low:+.1f}, {r.difference_high:+.1f}]",
                "-" if math.isnan(r.p_equivalent) else p_value(r.p_equivalent),
                r.verdict,
            ]
        )
    counts = table["outcome"].value_counts()
    tally = ", ".join(
        f"{counts.get(o, 0)} {o}" for o in (rp.LOWER, rp.HIGHER, rp.INCONCLUSIVE, rp.NO_TEST) if counts.get(o, 0)
    )
    bare = int(table["half_width"].isna().sum())
    return lines + [
        f"Protocol `{params.protocol_name}` follows a published setup. Each published number is compared with our "
        f"mean over n = {n} seeds (independent training runs; a cell with another n states it), interval against "
        "interval, in points of the metric: our standard error s/sqrt(n) is the one behind our "
        f"{level}% interval, the published one comes from its 95% half-width h over the paper's n runs "
        "(se = h / t(0.975, n - 1); the Reality Check: 10 runs). Welch's t-test gives ours - published with its "
        f"{level}% interval (Welch-Satterthwaite df); the equivalence test (TOST, two one-sided Welch tests) asks "
        f"whether the difference lies within ± {points(rope)} (`report.rope`), p in the table. Verdict: "
        f"*reproduced* when TOST rejects a difference of {points(rope)} or more at level {1 - confidence:.2g} "
        f"(the {100 - 2 * (100 - level)}% interval of the difference inside ± {points(rope)}); else *ours "
        f"lower*/*higher* when the {level}% interval of the difference excludes 0; else *inconclusive*. A "
        "published number without an interval is taken as exact (one-sample tests on our n - 1 df) and its "
        f"verdict says so ({bare} of {len(table)} here). `?` = not verified. "
        f"{counts.get(rp.REPRODUCED, 0)} of {len(table)} published numbers reproduced"
        + (f"; {tally}." if tally else "."),
        "",
        markdown_table(
            [
                "loss",
                "cell",
                "metric",
                "published (± 95% half-width, n runs)",
                f"ours [{level}% CI]",
                f"ours - published, points [{level}% CI]",
                f"TOST p (± {points(rope)})",
                "verdict",
            ],
            rows,
            "lllrrrrl",
        ),
        "",
    ]


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
