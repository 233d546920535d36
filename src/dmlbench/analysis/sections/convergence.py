"""Convergence: validation score per epoch and per second, and the epoch model selection picked."""

from __future__ import annotations

from dmlbench.analysis.labels import metric_header
from dmlbench.analysis.numbers import Analysis, t_bounds
from dmlbench.analysis.plots import convergence as plots
from dmlbench.analysis.sections.base import Document, Section
from dmlbench.analysis.text import format_interval, markdown_table


def write(analysis: Analysis, doc: Document) -> None:
    params, results = analysis.params, analysis.results
    confidence, metric = params.evaluate.confidence, params.protocol.selection_metric
    history = analysis.display(results.history)
    doc.figure(
        "convergence",
        lambda p: plots.convergence(history, metric, analysis.dim, p, analysis.order, confidence),
        f"Validation {metric_header(metric)} per epoch (left) and against cumulative training seconds (right) at "
        f"dim {analysis.dim}, seed means with t-interval bands: " + _convergence_sentence(analysis),
    )
    selected = results.selections.assign(loss=results.selections["loss"].map(analysis.names))
    trained = int(results.history["epoch"].max())  # a selected epoch lies in [1, epochs trained]
    rows = []
    for name in analysis.order:
        epochs = selected[selected["loss"] == name]["selected_epoch"]
        rows.append(
            [
                name,
                format_interval(epochs.mean(), *t_bounds(epochs, confidence, 1, trained), len(epochs), scale=1),
                int(epochs.min()),
                int(epochs.max()),
            ]
        )
    doc.add(
        f"Epoch selected on the validation classes ({params.protocol.epochs} epochs trained):",
        "",
        markdown_table(["loss", "selected epoch", "min", "max"], rows),
        "",
    )


def _convergence_sentence(analysis: Analysis) -> str:
    selections = analysis.results.selections
    selected = selections[selections["dim"] == analysis.dim].groupby("loss")["selected_epoch"].mean()
    epochs = analysis.params.protocol.epochs
    names = {analysis.names[loss]: epoch for loss, epoch in selected.items()}
    text = "the epoch selected on validation averages " + ", ".join(
        f"{name} {names[name]:.1f}" for name in analysis.order if name in names
    )
    if (selected >= epochs).all():
        return (
            text + f" of {epochs}: every loss peaks at the last epoch, so longer training may still change the ranking."
        )
    return text + f" of {epochs}."


SECTION = Section("Convergence", "Convergence", write)
