"""Convergence: validation score per epoch and per second, and the epoch model selection picked."""

from __future__ import annotations

import pandas as pd

from dmlbench.analysis.labels import metric_header
from dmlbench.analysis.numbers import RUN, Analysis, fold_models_per_seed, seed_means
from dmlbench.analysis.plots import convergence as plots
from dmlbench.analysis.sections.base import NO_TIMINGS, Document, Section
from dmlbench.analysis.text import common_n, format_interval, format_number, markdown_table
from dmlbench.evaluate.intervals import bounded_t_interval


def fold_means(history: pd.DataFrame) -> pd.DataFrame:
    """The history with a cross-validated run's fold models averaged per epoch (one curve per seed)."""
    numeric = [c for c in history.select_dtypes("number").columns if c not in RUN + ["epoch", "fold"]]
    return seed_means(history, numeric, RUN + ["epoch"])


def selected_epochs(analysis: Analysis) -> pd.DataFrame:
    """Per loss (display name, chronological) and dim: mean selected epoch, its t-interval inside
    [1, epochs trained] over seeds (a cross-validated run's fold models averaged first: n = seeds),
    n, and min and max over the models: the numbers of both the table and the figure's caption."""
    selections = analysis.results.selections
    per_seed = seed_means(selections, ["selected_epoch"])
    trained = int(analysis.results.history["epoch"].max())  # a selected epoch lies in [1, epochs trained]
    confidence = analysis.params.evaluate.confidence
    rows = []
    for name in analysis.order:
        for dim in sorted(selections["dim"].unique()):
            models = selections[(selections["loss"].map(analysis.names) == name) & (selections["dim"] == dim)]
            seeds = per_seed[(per_seed["loss"].map(analysis.names) == name) & (per_seed["dim"] == dim)]
            epochs = models["selected_epoch"].to_numpy(dtype=float)
            if not len(epochs):
                continue
            interval = bounded_t_interval(
                seeds["selected_epoch"].to_numpy(dtype=float), confidence, 1.0, float(trained)
            )
            rows.append(
                {
                    "loss": name,
                    "dim": int(dim),
                    "mean": interval.mean,
                    "low": interval.low,
                    "high": interval.high,
                    "n": interval.n,
                    "min": int(epochs.min()),
                    "max": int(epochs.max()),
                }
            )
    return pd.DataFrame(rows)


def write(analysis: Analysis, doc: Document) -> None:
    params, results = analysis.params, analysis.results
    confidence, metric = params.evaluate.confidence, params.protocol.selection_metric
    history = analysis.display(fold_means(results.history))
    epochs = selected_epochs(analysis)
    doc.figure(
        "convergence",
        lambda p: plots.convergence(history, metric, analysis.dim, p, analysis.order, confidence),
        (
            f"Validation {metric_header(metric)} per epoch (left) and against cumulative training seconds (right) at "
            if results.timings
            else f"Validation {metric_header(metric)} per epoch (training timings unavailable: {NO_TIMINGS}) at "
        )
        + f"dim {analysis.dim}, seed means with t-interval bands: "
        + _convergence_sentence(analysis, epochs),
    )
    n = common_n(epochs["n"])
    rows = [
        [r.loss, r.dim, format_interval(r.mean, r.low, r.high, r.n, scale=1, show_n=r.n != n), r.min, r.max]
        for r in epochs.itertuples()
    ]
    models = fold_models_per_seed(results.selections)
    doc.add(
        f"Epoch selected on the validation classes ({params.protocol.epochs} epochs trained); mean over n = {n} "
        f"seeds [95% t-interval over seeds, clipped to 1-{params.protocol.epochs}] unless a cell states its own n"
        + (
            f" (each seed's value is the mean of its {models} fold models, which share the seed; min and max are "
            "over the fold models):"
            if models > 1
            else ":"
        ),
        "",
        markdown_table(["loss", "dim", "selected epoch", "min", "max"], rows),
        "",
    )


def _convergence_sentence(analysis: Analysis, epochs: pd.DataFrame) -> str:
    """The figure's dim, quoting the table's rows for it with the table's rounding."""
    shown = epochs[epochs["dim"] == analysis.dim]
    last = analysis.params.protocol.epochs
    text = f"the epoch selected on validation (table below, dim {analysis.dim}) averages " + ", ".join(
        f"{r.loss} {format_number(r.mean, scale=1)}" for r in shown.itertuples()
    )
    if len(shown) and (shown["min"] >= last).all():
        return (
            text + f" of {last}: every loss peaks at the last epoch, so longer training may still change the ranking."
        )
    return text + f" of {last}."


SECTION = Section("Convergence", "Convergence", write)
