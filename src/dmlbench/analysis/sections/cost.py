"""Cost: training time and throughput per loss."""

from __future__ import annotations

from dmlbench.analysis.numbers import Analysis, fold_models_per_seed
from dmlbench.analysis.plots import cost as plots
from dmlbench.analysis.sections.base import NO_TIMINGS, Document, Section, seed_cell
from dmlbench.analysis.text import common_n, markdown_table


def write(analysis: Analysis, doc: Document) -> None:
    if not analysis.results.timings:
        doc.note(f"Training timings are unavailable: {NO_TIMINGS} (e.g. outputs restored from a DVC cache).")
        return
    costs = analysis.display(analysis.costs)
    confidence = analysis.params.evaluate.confidence
    doc.figure(
        "cost",
        lambda p: plots.cost(costs, p, analysis.order),
        "Training time per run and training throughput per loss and embedding size (mean over runs, whiskers "
        "min-max); evaluation time is not included.",
    )
    # the runs of one seed (its embedding sizes, datasets, backbones) are different cells, not repeats:
    # each seed's value is the mean over its runs, and the interval is over seeds
    per_seed = costs.groupby(["loss", "seed"], as_index=False)[["train_seconds", "images_per_second"]].mean()
    runs_per_seed = int(costs.groupby(["loss", "seed"]).size().max())
    rows = []
    n = common_n(per_seed.groupby("loss").size())
    for name in analysis.order:
        group = per_seed[per_seed["loss"] == name]
        rows.append(
            [
                name,
                seed_cell(group["train_seconds"], confidence, n, scale=1),
                seed_cell(group["images_per_second"], confidence, n, scale=1, digits=0),
            ]
        )
    dims = costs["dim"].nunique()
    cells = f"{runs_per_seed} runs ({dims} embedding sizes)" if dims > 1 else f"{runs_per_seed} runs"
    models = fold_models_per_seed(analysis.results.selections)
    pooled = (
        f"; each seed's value is the mean of its {cells}, which differ in their cell and share the seed, so they "
        "are not repeats"
        if runs_per_seed > 1
        else ""
    )
    doc.add(
        f"Training cost per run ({', '.join(sorted(set(costs['device'])))}; timings on a shared machine are "
        f"indicative only); mean over n = {n} seeds per loss [95% t-interval over seeds, clipped at 0] unless a cell "
        f"states its own n{pooled}"
        + (f"; a run's seconds are the sum over its {models} fold models." if models > 1 else "."),
        "",
        markdown_table(["loss", "training seconds per run", "images / s"], rows),
        "",
    )


SECTION = Section("Cost", "Cost", write)
