"""Setup: datasets, grid, protocol, where each loss's hyperparameters come from, metrics, software."""

from __future__ import annotations

from importlib import metadata

from dmlbench.analysis.collect import Results
from dmlbench.analysis.numbers import Analysis
from dmlbench.analysis.sections.base import Document, Section
from dmlbench.analysis.text import markdown_table
from dmlbench.data import DATASETS
from dmlbench.data.content import describe_counts
from dmlbench.params.model import Params
from dmlbench.params.protocol import AugmentConfig

PACKAGES = (
    "torch",
    "torchvision",
    "pytorch-metric-learning",
    "faiss-cpu",
    "faiss-gpu",
    "dvc",
    "mlflow",
    "numpy",
    "scipy",
    "scikit-posthocs",
    "baycomp",
    "seaborn",
)


def software_versions() -> dict[str, str]:
    versions = {}
    for package in PACKAGES:
        try:
            versions[package] = metadata.version(package)
        except metadata.PackageNotFoundError:
            continue
    return versions


def write(analysis: Analysis, doc: Document) -> None:
    params, results = analysis.params, analysis.results
    protocol = params.protocol
    lines = ["### Datasets", ""]
    rows = []
    for name, info in results.datasets.items():
        splits = info["splits"]
        cells = [
            f"{splits[s]['classes']} / {splits[s]['images']}" if s in splits else "-" for s in ("train", "val", "test")
        ]
        rows.append([f"`{name}`", DATASETS[name].description, *cells, f"{info['image_size']} px"])
    lines += [
        markdown_table(
            ["dataset", "description", "train classes / images", "val", "test", "prepared size"], rows, "llrrrr"
        ),
        "",
        "Splits are class-disjoint: no test class is seen in training or model selection. "
        "Validation classes are carved from the training classes only.",
        *[f"- {line}" for name, info in results.datasets.items() for line in describe_counts(name, info.get("counts"))],
        "",
        "### Grid and protocol",
        "",
        f"- Backbones: {', '.join(f'`{b}`' for b in params.backbones)}; losses: "
        f"{', '.join(analysis.names[loss] for loss in params.losses)}; embedding sizes: "
        f"{', '.join(map(str, params.dims))}; seeds: {', '.join(map(str, params.seeds))}.",
        f"- Protocol `{params.protocol_name}`: {protocol.description or 'see params.yaml'}",
        f"  - {protocol.epochs} epochs, batch {protocol.batch_size} = "
        f"{protocol.batch_size // protocol.samples_per_class} classes x {protocol.samples_per_class} images "
        + (
            "(PML `MPerClassSampler`);"
            if protocol.sampler == "pml"
            else "(distinct classes; an epoch is one pass over the training classes);"
        ),
        f"  - {protocol.optimizer.name} lr {protocol.optimizer.lr:g}, weight decay "
        f"{protocol.optimizer.weight_decay:g}, schedule `{protocol.scheduler.name}`; losses with parameters get "
        "their own optimiser (at an explicit `param_lr`, else the lr x the protocol's multiplier, else the loss's "
        "default absolute `param_lr` (thesis Table 4), else the lr x the loss's multiplier);",
        f"  - {_transforms(protocol.augment)}{flip_note(params)} (overrides may change them per dataset);",
        f"  - pooling {protocol.pooling.upper()}, {'linear head' if protocol.head == 'linear' else 'no head'}, "
        "L2-normalised output; "
        f"{'frozen' if protocol.frozen_bn else 'trainable'} BatchNorm; "
        f"{'ImageNet' if protocol.pretrained else 'random'} initialisation.",
        f"- Model selection: the epoch with the best validation `{protocol.selection_metric}` "
        "(validation classes only; never the test set). Without a validation split the last epoch is kept.",
        *_precision_note(params, results),
        *_loss_settings(analysis),
        *_cross_validation_note(results),
        "- Metrics (Reality Check definitions): every test image queries all other test images by cosine "
        "similarity; P@1 (= R@1), Recall@K = a same-class image among the K nearest, R-Precision and MAP@R with "
        "R = the number of other images of the query's class. Exact kNN with faiss. NMI, AMI and the pairwise "
        "clustering F1 (Oh Song et al. 2016) come from one k-means of the test embeddings with k = classes.",
        "",
        "### Software",
        "",
        ", ".join(f"{k} {v}" for k, v in software_versions().items()),
        "",
    ]
    doc.add(*lines)


def _loss_settings(analysis: Analysis) -> list[str]:
    """Where each loss's hyperparameters come from: the protocol's published values (per dataset /
    backbone when they differ), ``losses.<name>`` of params.yaml, or the loss module's defaults."""
    params = analysis.params
    lines = [
        (
            "- Loss hyperparameters: tuned per loss (section [Tuning](#tuning)) around these published values: each "
            "loss module's defaults (thesis Table 4, else the loss's paper), except where listed:"
            if params.protocol.hyperparameters == "tuned"
            else "- Loss hyperparameters: each loss module's defaults (thesis Table 4, else the loss's paper), except "
            "where listed:"
        )
    ]
    untouched = []
    for loss in params.losses:
        by_cell: dict[str, list[str]] = {}
        for combo in params.combos():
            if combo.loss != loss:
                continue
            values = {**params.protocol_for(combo).losses.get(loss, {}), **params.loss_values.get(loss, {})}
            if values:
                text = ", ".join(
                    f"{key} {value:g}" if isinstance(value, float) else f"{key} {value}"
                    for key, value in values.items()
                )
                where = f"{combo.dataset}/{combo.backbone}"
                if where not in by_cell.setdefault(text, []):
                    by_cell[text].append(where)
        if not by_cell:
            untouched.append(analysis.names[loss])
            continue
        cells = "; ".join(
            f"{text}" + ("" if len(by_cell) == 1 else f" ({', '.join(where)})") for text, where in by_cell.items()
        )
        source = "`params.yaml` `losses:`" if params.loss_values.get(loss) else f"protocol `{params.protocol_name}`"
        if params.loss_values.get(loss) and params.protocol.losses.get(loss):
            source = f"protocol `{params.protocol_name}` and `params.yaml` `losses:`"
        lines.append(f"  - {analysis.names[loss]}: {cells} (from {source});")
    if untouched:
        publishes = bool(params.protocol.losses) or any(o.set.get("losses") for o in params.protocol.overrides)
        why = (
            f"protocol `{params.protocol_name}` publishes no values for them"
            if publishes
            else f"protocol `{params.protocol_name}` sets no loss hyperparameters for them"
        )
        lines.append(f"  - {', '.join(untouched)}: the defaults ({why}).")
    return lines


PRECISION_WORDS = {
    "bf16": "bf16 autocast (the loss in float32)",
    "fp16": "fp16 autocast with loss scaling (the loss in float32)",
    "fp32": "float32",
    "fp32 (TF32 convolutions)": "float32 with TF32 convolutions (cuDNN's default on Ampere and later)",
}


def _precision_note(params: Params, results: Results) -> list[str]:
    """The training step's arithmetic, as each model's ``run.json`` records it (``precision``:
    what the protocol's ``amp`` became on the device that trained it), counted per device."""
    selections = results.selections
    if selections.empty or "precision" not in selections:
        return []
    counts = selections.fillna({"precision": "not recorded"}).groupby(["precision", "device"], sort=True).size()
    unit = "fold models" if selections["fold"].notna().any() else "models"
    parts = [
        f"{PRECISION_WORDS.get(precision, precision)}: {count} {unit} ({device})"
        for (precision, device), count in counts.items()
    ]
    where = f"protocol `amp: {params.protocol.amp}`; per model in `run.json`"
    return [f"- Training arithmetic ({where}): {'; '.join(parts)}."]


def _cross_validation_note(results: Results) -> list[str]:
    """Setup line for datasets prepared with a cross-validation split (Reality Check protocol)."""
    cv = {name: info.get("num_folds", 0) for name, info in results.datasets.items() if info.get("num_folds", 0)}
    if not cv:
        return []
    folds = ", ".join(f"`{name}` {k} folds" for name, k in cv.items())
    return [
        f"- Cross-validation ({folds}): each run trains one model per fold (its validation classes select "
        "it); a run's scores are those of the **concatenated** embedding of its fold models (each L2-normalised, "
        "concatenated, normalised again), as in the Reality Check; the fold models' own scores are in the "
        "cross-validation table of the results and in `artifacts/metrics/*.json` (`test_separated`: fold means "
        "over seeds; `test_folds`: mean and sd over the fold models)."
    ]


def _transforms(augment: AugmentConfig) -> str:
    """The train and eval transforms of ``augment`` in words."""
    size = augment.crop_size
    train = (
        f"Resize(({size}, {size}))"
        if augment.train == "squash"
        else f"RandomResizedCrop({size}, scale={list(augment.crop_scale)})"
    )
    if augment.rand_augment:
        train += f" + RandAugment({augment.rand_augment}, magnitude {augment.rand_augment_magnitude})"
    resize = (
        f"Resize(({augment.eval_resize}, {augment.eval_resize}))"
        if augment.eval == "squash"
        else f"resize {augment.eval_resize}"
    )
    return f"train transform {train}; eval transform {resize} + centre crop {size}"


def flip_note(params: Params) -> str:
    """The horizontal flip as training applies it: the protocol's ``augment.hflip`` (per dataset /
    backbone through its overrides) and only on a flip-invariant dataset (``DatasetSpec.hflip_invariant``;
    glyphs are not: a mirrored letter is another glyph), as ``train/loop.py`` resolves it."""
    protocol: dict[str, bool] = {}
    applied: dict[str, bool] = {}
    for combo in params.combos():
        on = params.protocol_for(combo).augment.hflip
        protocol[combo.dataset] = protocol.get(combo.dataset, False) or on
        applied[combo.dataset] = applied.get(combo.dataset, False) or (on and DATASETS[combo.dataset].hflip_invariant)
    if not any(protocol.values()):
        return " (protocol: no horizontal flip)"
    if all(applied[d] == protocol[d] for d in protocol):
        return f" + horizontal flip ({', '.join(d for d in protocol if applied[d])})"
    parts = [f"on for {d}" for d in applied if applied[d]]
    parts += [f"off for {d} (not flip-invariant)" for d in applied if protocol[d] and not applied[d]]
    parts += [f"off for {d} (protocol)" for d in applied if not protocol[d]]
    return f" (horizontal flip - protocol: hflip on; applied: {', '.join(parts)})"


SECTION = Section("Setup", "Setup", write)
