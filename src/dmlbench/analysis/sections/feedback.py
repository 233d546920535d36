"""Test-set feedback: how much picking the epoch on the test set would have flattered the scores."""

from __future__ import annotations

from dmlbench.analysis.labels import metric_header
from dmlbench.analysis.numbers import RUN, Analysis, fold_models_per_seed, seed_means
from dmlbench.analysis.plots import feedback as plots
from dmlbench.analysis.sections.base import Document, Section, seed_cell
from dmlbench.analysis.text import common_n, markdown_table


def write(analysis: Analysis, doc: Document) -> None:
    doc.add(
        "Papers without a validation set pick the epoch (and the hyperparameters) by the test score. Here the "
        "epoch is picked on the validation classes; the test score of every epoch is recorded only to measure "
        "how much picking the *epoch* on the test set would have flattered the result (hyperparameters picked on "
        "the test set would add more; that part is not measured here).",
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
    columns = ["selected_value", "best_value", "bias"]
    per_run = seed_means(bias, columns, RUN + ["metric"])
    models = fold_models_per_seed(bias)
    doc.figure(
        "test_feedback",
        lambda p: plots.test_feedback(analysis.display(per_run), p, analysis.order, confidence),
        "Gain from choosing each run's epoch on the test set instead of the validation classes, per run "
        + (f"(dots; each the mean of its {models} fold models) " if models > 1 else "(dots) ")
        + f"and mean with {int(confidence * 100)}% t-interval over seeds per embedding size: how much choosing "
        "only the epoch on the test set would have raised these runs' test scores.",
    )
    per_seed = seed_means(per_run, columns, ["loss", "seed"])  # the embedding sizes of one seed pooled
    display = analysis.display(per_seed)
    n = common_n(display.groupby("loss").size())
    rows = []
    for name in analysis.order:
        group = display[display["loss"] == name]
        if group.empty:
            continue
        rows.append([name] + [seed_cell(group[column], confidence, n, 0, 1) for column in columns])
    metric = metric_header(str(bias["metric"].iloc[0]))
    dims = int(bias["dim"].nunique())
    pooled = " x ".join(
        part for part, count in ((f"{dims} embedding sizes", dims), (f"{models} fold models", models)) if count > 1
    )
    doc.add(
        f"Per loss: mean over n = {n} seeds [95% t-interval over seeds, clipped to the range] unless a cell states "
        "its own n"
        + (
            f"; each seed's value is the mean of its {dims * models} models ({pooled}), which share the seed "
            "and are not independent."
            if pooled
            else "."
        ),
        "",
        markdown_table(["loss", f"test {metric} at selected epoch", f"best test {metric}", "gain (points)"], rows),
        "",
    )


SECTION = Section("Test-set feedback", "Test-set feedback", write)
