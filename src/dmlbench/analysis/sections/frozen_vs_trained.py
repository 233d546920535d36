"""Frozen trunk versus trained: per dataset and backbone, the frozen trunk, the best 2020 loss and the
best newer loss with what training gained over the trunk (:mod:`dmlbench.analysis.paired_gain`); then
published 2021-2025 numbers of frozen and ViT-era models, and the pre-training leakage caveat."""

from __future__ import annotations

import math
import re

import numpy as np
import pandas as pd

from dmlbench import paths
from dmlbench.analysis import literature as lit
from dmlbench.analysis.collect import per_query_labels, per_query_scores
from dmlbench.analysis.labels import metric_header
from dmlbench.analysis.numbers import TOP1, Analysis, rows_of
from dmlbench.analysis.paired_gain import PairedGain, paired_gain
from dmlbench.analysis.sections.base import Document, Section
from dmlbench.analysis.text import bootstrap_unit, format_bounds, format_interval, markdown_table
from dmlbench.grid import Combo

PUBLISHED_FROM = 2021  # the literature table: numbers published in this year or later
# row labels: the best loss a 2020 study ran (methods.csv ``studies_2020`` not empty), the best other
TIERS = ("best 2020 loss", "best newer loss")
RECIPE_ROW = "the recipe's own loss"  # the protocol's reference_loss: what its source published with
PROTOCOLS = {  # literature.csv ``setting`` -> how the table names it
    "frozen": "no training on it",
    "test_selection": "selects on the test classes",
}

LEAKAGE = (
    "**Pre-training leakage.** A frozen model's score on these benchmarks is not necessarily a score on unseen "
    "images. ImageNet-1k, behind every ImageNet-pretrained trunk here, contains dozens of bird species, some of "
    "them CUB200 classes, and the CUB-200-2011 dataset's own page warns that its images overlap with ImageNet's, "
    "so CUB's test set may overlap the trunk's training set (www.vision.caltech.edu/datasets/cub_200_2011; "
    "an MD5 comparison found 23 byte-identical CUB/ImageNet pairs: Guo 2016, guopei.github.io). DINOv2's "
    "LVD-142M was built by retrieving web images close to curated datasets, several fine-grained ones among "
    "them (Oquab et al. 2023, appendix Table 15); CLIP- and LAION-style web crawls contain many photos of cars "
    "and of retail products, the domains of Cars196, SOP and In-Shop. How far the test images themselves were "
    "seen is published for none of these models. The trained models start from the same pretrained trunk, so "
    "leakage can raise both the frozen and the trained scores: the direction of its effect on the gain of "
    "training is unknown, and a frozen foundation model's number may be higher than on truly unseen classes."
)


def write(analysis: Analysis, doc: Document) -> None:
    params, results = analysis.params, analysis.results
    level = int(params.evaluate.confidence * 100)
    primary = params.report.primary_metric
    metrics = list(dict.fromkeys([TOP1, primary]))
    doc.add(
        "Does training still beat the trunk it starts from? Per dataset and backbone: the trunk's pooled "
        "features before any training (*frozen*), the *best 2020 loss* - the best of the losses the two 2020 "
        "studies compared under one protocol (Musgrave, Belongie & Lim, *A Metric Learning Reality Check*, ECCV "
        "2020; Psomas, *Metric Learning: A Deep Dive*, 2020; `methods.csv` column `studies_2020`) - and the "
        "*best newer loss* - the best of this benchmark's losses that neither study ran, whatever the year of "
        f"their paper. {_tier_members(analysis)} {_recipe(analysis)}Each at embedding size "
        f"{analysis.dim}. *Best* is the highest seed-mean test {metric_header(primary)}: it is picked on the "
        "very scores it is reported with, so the best loss's score and gain are optimistic (the largest of "
        "several noisy means). Trained scores: mean over seeds with its "
        f"{level}% t-interval (n = seeds); frozen: one evaluation with its {level}% bootstrap interval over the "
        "test classes (n = classes; the queries of one class share its difficulty, so they are not independent). "
        f"*Gain*: trained minus frozen in points, mean over seeds, with a {level}% interval over both of its "
        "sources of chance: the training seed (a t-interval over the per-seed gains, seeds - 1 degrees of "
        "freedom; every seed is scored on the same test set, so their spread holds no test-sampling noise) and "
        "the test classes (a bootstrap of the classes, one draw shared by the trunk and every seed, which answer "
        "the same queries), their half-widths added in quadrature (Zou & Donner's MOVER; "
        "`analysis/paired_gain.py`): never narrower than the seeds' t-interval alone.",
        "",
    )
    if results.baselines.empty:
        doc.note(
            "No frozen-trunk evaluation (stages `embed_pretrained` / `evaluate_pretrained`) among this grid's "
            "outputs: nothing to compare training with."
        )
    else:
        for (dataset, backbone), baseline in results.baselines.groupby(["dataset", "backbone"], sort=False):
            doc.add(f"### `{dataset}` / `{backbone}`", "")
            doc.add(*_block(analysis, dataset, backbone, baseline, metrics))
        doc.demo_note(params)
    doc.add(*literature_lines(analysis.papers.literature, analysis.papers.methods), LEAKAGE, "")


def _block(analysis: Analysis, dataset: str, backbone: str, baseline: pd.DataFrame, metrics: list[str]) -> list[str]:
    by_metric = baseline.set_index("metric")
    weights = str(baseline["weights"].iloc[0])
    frozen = [f"frozen trunk ({weights})", "-", int(baseline["dim"].iloc[0])]
    for metric in metrics:
        if metric in by_metric.index:
            mean, low, high, n, unit, queries = by_metric.loc[metric, ["mean", "low", "high", "n", "unit", "queries"]]
            frozen += [format_bounds(mean, low, high, int(n), unit=bootstrap_unit(unit, queries)), "0 (reference)"]
        else:
            frozen += ["-", "-"]
    rows, notes = [frozen], []
    reference = analysis.params.protocol.reference_loss
    recipe = [(RECIPE_ROW, reference)] if reference in analysis.params.losses else []
    for label, loss in _tiers(analysis, dataset, backbone, metrics[-1]) + recipe:
        if loss is None:
            why = "no loss of this grid was run by a 2020 study" if label == TIERS[0] else "a 2020 study ran every loss"
            rows.append([label, f"none in this grid ({why})", "-", *["-"] * (2 * len(metrics))])
            continue
        row = [label, _named(analysis, loss), analysis.dim]
        for metric in metrics:
            row.append(_trained_cell(analysis, dataset, backbone, loss, metric))
            gain = _gain(analysis, Combo(dataset, backbone, loss, analysis.dim), metric)
            row.append(_gain_cell(gain) if isinstance(gain, PairedGain) else "-")
            if isinstance(gain, str):
                notes.append(f"{analysis.names[loss]}, {metric_header(metric)}: {gain}")
        rows.append(row)
    header = ["", "loss (year)", "dim"]
    for metric in metrics:
        header += [metric_header(metric), f"gain over frozen, points ({metric_header(metric)})"]
    lines = [markdown_table(header, rows, "ll" + "r" * (len(header) - 2)), ""]
    if notes:
        lines += ["No gain interval for: " + "; ".join(notes) + ".", ""]
    return lines


def in_2020_tier(loss: str, methods: pd.DataFrame) -> bool:
    """Whether a 2020 study (the Reality Check or the thesis) trained ``loss`` (methods.csv ``studies_2020``)."""
    return bool(lit.studies_2020(loss, methods))


def _tier_members(analysis: Analysis) -> str:
    """The sentence naming this grid's losses in each tier."""
    methods = analysis.papers.methods
    parts = []
    for label, members in (
        ("2020 losses", [loss for loss in analysis.params.losses if in_2020_tier(loss, methods)]),
        ("newer losses", [loss for loss in analysis.params.losses if not in_2020_tier(loss, methods)]),
    ):
        names = ", ".join(_named(analysis, loss) for loss in members)
        parts.append(f"{label}: {names or 'none'}")
    return f"In this grid, {'; '.join(parts)}."


def _recipe(analysis: Analysis) -> str:
    """The sentence naming the one recipe every row trained under, and its own loss (if in the grid)."""
    params = analysis.params
    reference = params.protocol.reference_loss
    if reference is None or reference not in params.losses:
        return ""
    return (
        f"Every loss trained under one recipe, protocol `{params.protocol_name}`; *{RECIPE_ROW}* is the loss its "
        f"source published its numbers with, {_named(analysis, reference)}, beside which the other losses are "
        "compared under the same recipe. "
    )


def _named(analysis: Analysis, loss: str) -> str:
    year = lit.loss_year(loss, analysis.papers.methods)
    return analysis.names[loss] + ("" if math.isnan(year) else f" ({int(year)})")


def _tiers(analysis: Analysis, dataset: str, backbone: str, metric: str) -> list[tuple[str, str | None]]:
    """(row label, best loss or None) for the losses a 2020 study ran and the newer ones (:data:`TIERS`)."""
    cells = rows_of(analysis.summary, dataset=dataset, backbone=backbone, dim=analysis.dim, metric=metric)
    studied = cells["loss"].map(lambda loss: in_2020_tier(loss, analysis.papers.methods)).to_numpy(dtype=bool)
    tiers = []
    for label, mask in zip(TIERS, (studied, ~studied), strict=True):
        part = cells[mask]
        tiers.append((label, None if part.empty else str(part.loc[part["mean"].idxmax(), "loss"])))
    return tiers


def _trained_cell(analysis: Analysis, dataset: str, backbone: str, loss: str, metric: str) -> str:
    cell = rows_of(analysis.summary, dataset=dataset, backbone=backbone, loss=loss, dim=analysis.dim, metric=metric)
    if cell.empty:
        return "-"
    mean, low, high, n = cell.iloc[0][["mean", "low", "high", "n"]]
    return format_interval(mean, low, high, int(n))


def _gain(analysis: Analysis, combo: Combo, metric: str) -> PairedGain | str:
    """The paired gain of ``combo``'s seeds over the frozen trunk, or why there is none."""
    params = analysis.params
    frozen = per_query_scores(paths.pretrained_evaluation_dir(combo.dataset, combo.backbone), paths.PRETRAINED, metric)
    if frozen is None:
        return "the frozen trunk's per-query values are missing"
    classes = per_query_labels(paths.pretrained_evaluation_dir(combo.dataset, combo.backbone), paths.PRETRAINED)
    if classes is None:
        return "the frozen trunk's per-query classes are missing (its evaluation predates them: re-run it)"
    trained = []
    for seed in params.seeds:
        found = per_query_scores(paths.evaluation_dir(combo), f"seed{seed}", metric)
        if found is None:
            return f"seed {seed}'s per-query values are missing"
        if not np.array_equal(found[0], frozen[0]):
            return f"seed {seed} was evaluated on other queries than the frozen trunk"
        trained.append(found[1])
    boot = params.evaluate.bootstrap
    return paired_gain(np.vstack(trained), frozen[1], classes, params.evaluate.confidence, boot.resamples, boot.seed)


def _gain_cell(gain: PairedGain) -> str:
    if gain.low == gain.high:
        return f"{100 * gain.estimate:+.1f} (no spread over seeds or classes; {gain.label})"
    return f"{100 * gain.estimate:+.1f} [{100 * gain.low:+.1f}, {100 * gain.high:+.1f}] ({gain.label})"


def literature_lines(literature: pd.DataFrame, methods: pd.DataFrame) -> list[str]:
    """The published 2021+ R@1 of frozen models and trained methods (``literature.csv``), one row per
    (source, model) with its datasets as columns."""
    rows = lit.top1(literature)
    rows = rows[rows["year"] >= PUBLISHED_FROM]
    if rows.empty:
        return []
    table = []
    for (paper, loss, backbone, setting), group in rows.groupby(["paper", "loss", "backbone", "setting"], sort=False):
        values = {r.dataset: f"{r.value:g}{'?' if r.uncertain else ''}" for r in group.itertuples()}
        table.append(
            [
                f"frozen `{backbone}`" if loss == "pretrained" else lit.display_name(loss, methods),
                f"{re.split(r'[,(]', paper, maxsplit=1)[0].strip()} {int(group['year'].iloc[0])}",
                backbone or "n/s",
                PROTOCOLS.get(setting, setting),
                *[values.get(d, "-") for d in lit.DATASETS],
            ]
        )
    return [
        "Published R@1 (= P@1, %) since 2021 (`literature.csv`; `?` = taken from a secondary source, not read in "
        "the paper; one run each, no n and no interval published). *Selects on the test classes*: the paper "
        "holds out no validation classes, so its hyper-parameters and stopping epoch were chosen on the test "
        "classes it reports; *no training on it*: a frozen model scored on the benchmark's test classes "
        "without training on the benchmark (but see the leakage note below). The OML model zoo scores every "
        "frozen model with one protocol (224 x 224 images; its README warns that splits and bounding boxes "
        "may differ from the papers').",
        "",
        markdown_table(
            ["model", "source", "backbone", "protocol", *[lit.DATASET_LABELS[d] for d in lit.DATASETS]],
            table,
            "llll" + "r" * len(lit.DATASETS),
        ),
        "",
    ]


SECTION = Section("Frozen trunk versus trained", "Frozen vs trained", write)
