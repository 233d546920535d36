"""Limitations: what this grid's numbers cannot say."""

from __future__ import annotations

from dmlbench.analysis.numbers import Analysis
from dmlbench.analysis.sections.base import Document, Section
from dmlbench.analysis.statistics import MIN_BLOCKS
from dmlbench.params.tuning import tuning_settings


def write(analysis: Analysis, doc: Document) -> None:
    params = analysis.params
    protocol = params.protocol
    lines = []
    if "glyphs" in params.datasets:
        lines.append(
            "- `glyphs` is the offline demo dataset (characters rendered from matplotlib's fonts). It shows the "
            "pipeline working end to end; its numbers say nothing about CUB200, CARS196, SOP or In-Shop, and its "
            "papers-vs-reality points compare relative improvements only."
        )
    if len(params.seeds) < 5:
        lines.append(
            f"- {len(params.seeds)} seeds per cell give wide t-intervals; the Reality Check used 10 reproductions."
        )
    if not protocol.pretrained:
        lines.append("- Backbones start from random weights, unlike the ImageNet-pretrained trunks of the papers.")
    if len(params.backbones) == 1:
        lines.append(f"- One backbone (`{next(iter(params.backbones))}`): the backbone comparison is degenerate.")
    if 512 not in params.dims:
        lines.append(
            f"- The grid has no 512-d embedding (the papers' size); backbone, convergence and papers-vs-reality "
            f"figures use dim {analysis.dim}."
        )
    cropped = {
        name: info["max_aspect"]
        for name, info in analysis.results.datasets.items()
        if float(info.get("max_aspect", 1.0)) > 1.0
    }
    if cropped:
        listed = ", ".join(f"`{name}` {aspect:.3g}" for name, aspect in cropped.items())
        lines.append(
            "- Deviation from the Reality Check and the thesis: the prepared cache centre-crops each image's long side "
            f"to at most max_aspect x its short side ({listed}) before RandomResizedCrop, which they applied to the "
            "full image; wider images (many in Cars196) lose the ends of their frame here (docs/datasets.md)."
        )
    tests = analysis.tests
    if tests.friedman is not None and tests.friedman.n_blocks < 10:
        lines.append(
            f"- The tests across datasets rest on {tests.friedman.n_blocks} datasets; with so few, only large and "
            "consistent differences can reach significance"
            + (
                f", and the sign tests and the Bayesian test across datasets (from {MIN_BLOCKS} datasets) are not run."
                if tests.friedman.n_blocks < MIN_BLOCKS
                else "."
            )
        )
    elif tests.friedman is None and tests.datasets < 2:
        lines.append(
            f"- {tests.datasets} dataset: no independent blocks to compare the losses across, so only the "
            "per-experiment tests over seeds apply; the tournament and those comparisons describe this grid and test "
            "nothing beyond it."
        )
    if tests.bayes is not None and tests.bayes["better"].notna().any():
        lines.append(
            "- The Bayesian comparison per experiment conditions on that experiment's data split; no model pooling "
            "seeds across experiments (hierarchical) was run."
        )
    if not len(analysis.bias):
        lines.append("- Test-set feedback was not recorded for these runs, so its bias is not measured here.")
    if analysis.params.protocol.hyperparameters == "tuned":
        tuning = tuning_settings(analysis.params)
        lines.append(
            f"- Each loss's hyperparameters come from one search of {tuning.trials} trials at dim "
            f"{tuning.dim} and seed "
            f"{tuning.seed} (the Reality Check ran 50): another seed or a larger budget may find other values, and the "
            "values found at one size train every size."
        )
    else:
        lines.append(
            "- Hyperparameters are the published values (thesis Table 4 or the protocol's), not tuned on the "
            "validation split."
        )
    lines += [
        "- Published numbers marked uncertain in `literature.csv` were read off a figure or in another paper's "
        "table rather than their own paper's; papers' claims carry no interval, and their backbones, sizes and "
        "training recipes differ.",
        "",
    ]
    doc.add(*lines)


SECTION = Section("Limitations", "Limitations", write)
