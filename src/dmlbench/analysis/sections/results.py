"""Results on the test classes: one table per dataset/backbone (every metric with its interval),
the untrained trunk's row, the cross-validation table, and the metric and Recall@K figures."""

from __future__ import annotations

import math
from typing import Iterable

import pandas as pd

from dmlbench.analysis.cross_validation import cross_validation_table
from dmlbench.analysis.labels import metric_header
from dmlbench.analysis.numbers import TOP1, Analysis
from dmlbench.analysis.plots import results as plots
from dmlbench.analysis.sections.base import Document, Section
from dmlbench.analysis.text import format_bounds, format_interval, markdown_table


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
        seeds = set(block["n"])
        same_n = len(seeds) == 1  # n once, above the table, when every cell has it
        if same_n:
            doc.add(f"Every trained cell: mean over n = {seeds.pop()} seeds [95% interval].", "")
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
                        *by_metric.loc[m, ["mean", "low", "high"]], int(by_metric.loc[m, "n"]), show_n=not same_n
                    )
                    for m in metrics
                ]
            )
        baseline = _baseline_block(results.baselines, dataset, backbone)
        if baseline is not None:
            by_metric = baseline.set_index("metric")
            rows.append(
                [f"*Pretrained* ({baseline['weights'].iloc[0]}, no training)", int(baseline["dim"].iloc[0])]
                + [
                    format_bounds(*by_metric.loc[m, ["mean", "low", "high"]], int(by_metric.loc[m, "n"]))
                    if m in by_metric.index
                    else "-"
                    for m in metrics
                ]
            )
        doc.add(markdown_table(["loss", "dim", *map(metric_header, metrics)], rows), "")
        if baseline is not None:
            doc.add(
                f"*Pretrained*: the trunk's pooled features before any training (the thesis's \"Pretrained\" row), "
                f"evaluated once, so its interval is a {int(confidence * 100)}% per-query bootstrap interval "
                "with n = test queries, not a t-interval over seeds.",
                "",
            )
    doc.add(*_cross_validation_block(analysis))
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
