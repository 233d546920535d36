"""Embedding size and backbone: score against embedding size, and per backbone."""

from __future__ import annotations

from dmlbench.analysis.labels import metric_header
from dmlbench.analysis.numbers import TOP1, Analysis
from dmlbench.analysis.plots import embedding_size as plots
from dmlbench.analysis.sections.base import Document, Section
from dmlbench.analysis.text import format_number


def write(analysis: Analysis, doc: Document) -> None:
    params, results = analysis.params, analysis.results
    confidence, primary = params.evaluate.confidence, params.report.primary_metric
    runs = analysis.display(results.runs)
    dims = sorted(results.runs["dim"].unique())
    if len(dims) > 1:
        doc.figure(
            "embedding_size",
            lambda p: plots.embedding_size(runs, [primary, TOP1], p, analysis.order, confidence),
            "Test score against embedding size (log scale) for each loss - " + _size_sentence(analysis, primary),
        )
    else:
        doc.note(f"The grid has one embedding size ({dims[0]}); nothing to compare.")
    backbones = sorted(results.runs["backbone"].unique())
    if len(backbones) == 1:  # one bar per loss: Figure 1's P@1 again, nothing about backbones
        doc.note(
            f"No backbone figure (thesis Fig. 31): the grid has one backbone (`{backbones[0]}`), so it would "
            "repeat the P@1 per loss of the results figure and say nothing about backbones."
        )
        return
    doc.figure(
        "backbones",
        lambda p: plots.backbones(runs, TOP1, analysis.dim, p, analysis.order, confidence),
        f"Test P@1 per loss and backbone at embedding size {analysis.dim} (thesis Fig. 31) - a stronger "
        "backbone lifts every loss, so losses trained on different backbones cannot be compared.",
    )


def _size_sentence(analysis: Analysis, metric: str) -> str:
    """The change from the smallest to the largest size, as differences of the means the results
    tables print (same rounding), so a reader can check it against them."""
    summary = analysis.summary[analysis.summary["metric"] == metric]
    dims = sorted(summary["dim"].unique())
    small, large = summary[summary["dim"] == dims[0]], summary[summary["dim"] == dims[-1]]
    merged = small.merge(large, on=["dataset", "backbone", "loss"], suffixes=("_s", "_l"))
    gains = [
        (float(format_number(r.mean_l)) - float(format_number(r.mean_s)), analysis.names[r.loss])
        for r in merged.itertuples()
    ]
    (low, worst), (high, best) = min(gains), max(gains)
    return (
        f"going from {dims[0]} to {dims[-1]} dimensions changes {metric_header(metric)} by {low:+.1f} points "
        f"({worst}) to {high:+.1f} points ({best}): differences of the results tables' means."
    )


SECTION = Section("Embedding size and backbone", "Embedding size and backbone", write)
