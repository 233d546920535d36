"""Test-set feedback: how much picking the epoch on the test set would have flattered the scores."""

from __future__ import annotations

from dmlbench.analysis.labels import metric_header
from dmlbench.analysis.numbers import Analysis, t_bounds
from dmlbench.analysis.plots import feedback as plots
from dmlbench.analysis.sections.base import Document, Section
from dmlbench.analysis.text import common_n, format_interval, markdown_table


def write(analysis: Analysis, doc: Document) -> None:
    doc.add(
        "Papers without a validation set pick the epoch (and the hyperparameters) by the test score. Here the "
        "epoch is picked on the validation classes; the test score of every epoch is recorded only to measure "
        "how much picking on the test set would have flattered the result.",
        "",
    )
    bias = analysis.bias
    confidence = analysis.params.evaluate.confidence
    if not len(bias):
        doc.note(
            "Not measured for this grid: the training histories carry no `test_feedback/*` metrics "
            "(history.json) and run.json has no `test_feedback` record."
        )
        return
    doc.figure(
        "test_feedback",
        lambda p: plots.test_feedback(analysis.display(bias), p, analysis.order, confidence),
        "Gain from choosing each run's epoch on the test set instead of the validation classes, per run "
        f"(dots) and mean with {int(confidence * 100)}% t-interval: the optimism that test-set feedback "
        "builds into published numbers.",
    )
    rows = []
    display = analysis.display(bias)
    n = common_n(display.groupby("loss").size())
    for name in analysis.order:
        group = display[display["loss"] == name]
        if group.empty:
            continue
        rows.append(
            [name]
            + [
                format_interval(
                    group[column].mean(), *t_bounds(group[column], confidence, 0, 1), len(group), show_n=len(group) != n
                )
                for column in ("selected_value", "best_value", "bias")
            ]
        )
    metric = metric_header(str(bias["metric"].iloc[0]))
    doc.add(
        f"Per loss: mean over n = {n} runs (seeds x embedding sizes) [95% interval] unless a cell states its own n.",
        "",
        markdown_table(["loss", f"test {metric} at selected epoch", f"best test {metric}", "gain (points)"], rows),
        "",
    )


SECTION = Section("Test-set feedback", "Test-set feedback", write)
