"""How the report names metrics: one table, a short form for table headers and sentences and a
long form for figure axes. Recall@K beyond K = 1 is ``R@K`` in both."""

from __future__ import annotations

METRIC_NAMES = {  # metric key: (table header, axis label)
    "precision_at_1": ("P@1 = R@1", "P@1 (= R@1)"),
    "recall_at_1": ("R@1", "R@1"),
    "r_precision": ("R-Prec", "R-Precision"),
    "map_at_r": ("MAP@R", "MAP@R"),
    "nmi": ("NMI", "NMI"),
    "ami": ("AMI", "AMI"),
    "f1": ("F1", "F1"),
}


def _fallback(metric: str) -> str:
    return "R@" + metric.removeprefix("recall_at_") if metric.startswith("recall_at_") else metric


def metric_header(metric: str) -> str:
    """``MAP@R``, ``P@1 = R@1``, ``R@4``: a metric in a table header or a sentence."""
    return METRIC_NAMES[metric][0] if metric in METRIC_NAMES else _fallback(metric)


def metric_label(metric: str) -> str:
    """``P@1 (= R@1)``, ``R-Precision``, ``R@4``: a metric on a figure axis."""
    return METRIC_NAMES[metric][1] if metric in METRIC_NAMES else _fallback(metric)
