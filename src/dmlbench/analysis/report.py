"""The ``report`` stage: ``reports/report.md`` and its figures, from the pipeline's outputs.

Reads exactly the grid in ``params.yaml`` (stale outputs of cells removed from the grid are
ignored): per-run test metrics (``artifacts/evaluation``), their intervals
(``artifacts/metrics``), training histories (``artifacts/models``) and dataset summaries
(``artifacts/prepared``). Every number in the report carries n and a 95% interval.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path
from typing import Any, Sequence

import pandas as pd

from dmlbench import paths
from dmlbench.analysis.tournament import tournament
from dmlbench.config import Params
from dmlbench.data import DATASETS
from dmlbench.errors import DataError
from dmlbench.evaluate.intervals import t_interval
from dmlbench.io import atomic_path, read_json
from dmlbench.tracking.store import git_state

REPORT = "report.md"
FIGURES = "figures"
METRIC_ORDER = ("precision_at_1", "recall_at_2", "recall_at_4", "recall_at_8", "r_precision", "map_at_r")
METRIC_HEADERS = {
    "precision_at_1": "P@1 = R@1",
    "r_precision": "R-Prec",
    "map_at_r": "MAP@R",
}
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
    "seaborn",
)


@dataclass
class Results:
    runs: pd.DataFrame  # dataset, backbone, loss, dim, seed, metric, value
    history: pd.DataFrame  # dataset, backbone, loss, dim, seed, epoch, train/*, val/*
    selections: pd.DataFrame  # dataset, backbone, loss, dim, seed, selected_epoch, selection_metric
    datasets: dict[str, dict[str, Any]]


def collect_results(params: Params) -> Results:
    """Load every output of the current grid; fail naming the first missing file."""
    run_rows, history_rows, selection_rows = [], [], []
    for combo in params.combos():
        runs_file = paths.evaluation_dir(combo) / "runs.json"
        if not runs_file.exists():
            raise DataError(f"{runs_file}: missing (run evaluate@{combo.key} first)")
        cell = {"dataset": combo.dataset, "backbone": combo.backbone, "loss": combo.loss, "dim": combo.dim}
        for info in read_json(runs_file)["runs"].values():
            for metric, value in info["metrics"].items():
                run_rows.append({**cell, "seed": info["seed"], "metric": metric, "value": value})
        for seed in params.seeds:
            model_dir = paths.model_dir(combo.with_seed(seed))
            for entry in read_json(model_dir / "history.json"):
                history_rows.append({**cell, "seed": seed, **entry})
            selection = read_json(model_dir / "run.json")["selection"]
            selection_rows.append(
                {**cell, "seed": seed, "selected_epoch": selection["epoch"], "selection_metric": selection["metric"]}
            )
    datasets = {name: read_json(paths.prepared_dir(name) / "info.json") for name in params.datasets}
    return Results(pd.DataFrame(run_rows), pd.DataFrame(history_rows), pd.DataFrame(selection_rows), datasets)


def summarize(runs: pd.DataFrame, confidence: float) -> pd.DataFrame:
    """Mean, t-interval and n per (dataset, backbone, loss, dim, metric)."""
    rows = []
    for key, group in runs.groupby(["dataset", "backbone", "loss", "dim", "metric"], sort=False):
        interval = t_interval(group["value"].to_numpy(), confidence)
        rows.append(
            dict(
                zip(["dataset", "backbone", "loss", "dim", "metric"], key, strict=True),
                mean=interval.mean,
                low=interval.low,
                high=interval.high,
                n=interval.n,
            )
        )
    return pd.DataFrame(rows)


def format_interval(mean: float, low: float, high: float, n: int) -> str:
    """``62.1 ± 1.8 (n=3)`` in percent; ``62.1 (n=1, no interval)`` for a single run."""
    if n < 2 or math.isnan(low):
        return f"{100 * mean:.1f} (n={n}, no interval)"
    return f"{100 * mean:.1f} ± {100 * (high - low) / 2:.1f} (n={n})"


def markdown_table(header: Sequence[str], rows: Sequence[Sequence[Any]], align: str | None = None) -> str:
    align = align or "l" + "r" * (len(header) - 1)
    marks = {"l": ":---", "r": "---:", "c": ":---:"}
    lines = ["| " + " | ".join(map(str, header)) + " |", "| " + " | ".join(marks[a] for a in align) + " |"]
    lines += ["| " + " | ".join(map(str, row)) + " |" for row in rows]
    return "\n".join(lines)


def tournament_input(runs: pd.DataFrame, metric: str) -> pd.DataFrame:
    """One score per (experiment, loss): the seed-mean of ``metric``; experiment = dataset/backbone/dim."""
    selected = runs[runs["metric"] == metric]
    scores = selected.groupby(["dataset", "backbone", "dim", "loss"], as_index=False)["value"].mean()
    scores["experiment"] = scores["dataset"] + "/" + scores["backbone"] + "/" + scores["dim"].astype(str)
    return scores.rename(columns={"value": "score"})[["experiment", "loss", "score"]]


def software_versions() -> dict[str, str]:
    versions = {}
    for package in PACKAGES:
        try:
            versions[package] = metadata.version(package)
        except metadata.PackageNotFoundError:
            continue
    return versions


def _flip_note(params: Params) -> str:
    if not params.protocol.augment.hflip:
        return ""
    flipped = [name for name in params.datasets if DATASETS[name].hflip_invariant]
    if not flipped:
        return " (no horizontal flip: no dataset here is flip-invariant)"
    return f" + horizontal flip ({', '.join(flipped)})"


def render(params: Params, results: Results, figures: dict[str, Path], report_dir: Path) -> str:
    protocol = params.protocol
    confidence = params.evaluate.confidence
    primary = params.report.primary_metric
    summary = summarize(results.runs, confidence)
    commit, dirty = git_state()
    n_runs = len(params.runs())
    lines: list[str] = [f"# {params.report.title}", ""]
    lines += [
        f"Generated by the `report` stage of `dvc repro` from **{n_runs} training runs** "
        f"({len(params.combos())} grid cells x {len(params.seeds)} seeds); git commit `{commit[:12]}`"
        + (" with uncommitted changes" if dirty else "")
        + ". Every score is the mean over seeds with its "
        f"{int(confidence * 100)}% t-interval half-width and the number of runs n.",
        "",
        "## Setup",
        "",
        "### Datasets",
        "",
    ]
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
    ]
    lines += [
        "Splits are class-disjoint: no test class is seen in training or model selection. "
        "Validation classes are carved from the training classes only.",
        "",
        "### Grid and protocol",
        "",
        f"- Backbones: {', '.join(f'`{b}`' for b in params.backbones)}; losses: {', '.join(f'`{loss}`' for loss in params.losses)}; "
        f"embedding sizes: {', '.join(map(str, params.dims))}; seeds: {', '.join(map(str, params.seeds))}.",
        f"- Protocol `{params.protocol_name}`: {protocol.description or 'see params.yaml'}",
        f"  - {protocol.epochs} epochs, batch {protocol.batch_size} = {protocol.batch_size // protocol.samples_per_class} classes x "
        f"{protocol.samples_per_class} images (PML `MPerClassSampler`);",
        f"  - {protocol.optimizer.name} lr {protocol.optimizer.lr:g}, weight decay {protocol.optimizer.weight_decay:g}, "
        f"schedule `{protocol.scheduler.name}`; losses with parameters get their own optimiser "
        f"(lr x `param_lr_multiplier`);",
        f"  - train transform RandomResizedCrop({protocol.augment.crop_size}, scale={list(protocol.augment.crop_scale)})"
        f"{_flip_note(params)}; eval transform resize {protocol.augment.eval_resize} + centre crop {protocol.augment.crop_size};",
        f"  - pooling {protocol.pooling.upper()}, linear head, L2-normalised output; "
        f"{'frozen' if protocol.frozen_bn else 'trainable'} BatchNorm; {'ImageNet' if protocol.pretrained else 'random'} initialisation.",
        f"- Model selection: the epoch with the best validation `{protocol.selection_metric}` "
        "(validation classes only; never the test set). Without a validation split the last epoch is kept.",
        "- Metrics (Reality Check definitions): every test image queries all other test images by cosine similarity; "
        "P@1 (= R@1), Recall@K = a same-class image among the K nearest, R-Precision and MAP@R with R = the number "
        "of other images of the query's class. Exact kNN with faiss.",
        "",
        "### Software",
        "",
        ", ".join(f"{k} {v}" for k, v in software_versions().items()),
        "",
        "## Results on the test classes",
        "",
    ]
    metrics = [m for m in METRIC_ORDER if m in set(summary["metric"])]
    headers = [METRIC_HEADERS.get(m, m.replace("recall_at_", "R@")) for m in metrics]
    for (dataset, backbone), block in summary.groupby(["dataset", "backbone"], sort=False):
        lines += [f"### `{dataset}` / `{backbone}`", ""]
        rows = []
        for (loss, dim), cell in block.groupby(["loss", "dim"], sort=False):
            by_metric = cell.set_index("metric")
            rows.append(
                [f"`{loss}`", dim]
                + [
                    format_interval(*by_metric.loc[m, ["mean", "low", "high"]], int(by_metric.loc[m, "n"]))
                    for m in metrics
                ]
            )
        lines += [markdown_table(["loss", "dim", *headers], rows), ""]
    lines += [
        f"![Test metrics by loss]({figures['metric_by_loss'].relative_to(report_dir).as_posix()})",
        "",
        f"*Figure 1. Test {METRIC_HEADERS.get(primary, primary)} and P@1 per loss and embedding size; points are seed means, "
        f"bars {int(confidence * 100)}% t-intervals. Overlapping bars mean the data cannot tell the losses apart.*",
        "",
        "## Tournament of losses",
        "",
        f"Losses ranked within each experiment (dataset x backbone x embedding size) by the seed-mean test "
        f"`{primary}`, rank 1 = best, ties share the average rank; then summed over experiments (thesis Table 11).",
        "",
    ]
    table = tournament(tournament_input(results.runs, primary))
    lines += [
        markdown_table(
            ["loss", "total rank", "mean rank", "std of rank", "experiments"],
            [
                [f"`{r.loss}`", f"{r.total_rank:g}", f"{r.mean_rank:.2f}", f"{r.std_rank:.2f}", r.experiments]
                for r in table.itertuples()
            ],
        ),
        "",
        "Ranks ignore the intervals above: with few experiments and overlapping intervals, adjacent ranks are not "
        "significant differences.",
        "",
        "## Convergence",
        "",
        f"![Validation curves]({figures['validation_curves'].relative_to(report_dir).as_posix()})",
        "",
        f"*Figure 2. Validation `{protocol.selection_metric}` per epoch (mean and t-interval over seeds): "
        "the curve that model selection reads.*",
        "",
    ]
    selected = results.selections.groupby("loss")["selected_epoch"].agg(["mean", "min", "max"])
    lines += [
        markdown_table(
            ["loss", "selected epoch (mean)", "min", "max"],
            [
                [f"`{loss}`", f"{row['mean']:.1f}", int(row["min"]), int(row["max"])]
                for loss, row in selected.iterrows()
            ],
        ),
        "",
        "## Limitations",
        "",
    ]
    if "glyphs" in params.datasets:
        lines.append(
            "- `glyphs` is the offline demo dataset (characters rendered from matplotlib's fonts). It shows the pipeline "
            "working end to end; its numbers say nothing about CUB200, CARS196, SOP or In-Shop."
        )
    if len(params.seeds) < 5:
        lines.append(
            f"- {len(params.seeds)} seeds per cell give wide t-intervals; the Reality Check used 10 reproductions."
        )
    if not protocol.pretrained:
        lines.append("- Backbones start from random weights, unlike the ImageNet-pretrained trunks of the papers.")
    lines += [
        "- Hyperparameters are the published defaults (thesis Table 4), not tuned on the validation split.",
        "",
    ]
    return "\n".join(lines)


def report_stage(params: Params, report_dir: Path | None = None) -> Path:
    from dmlbench.analysis import plots

    report_dir = report_dir or paths.REPORTS
    results = collect_results(params)
    figure_dir = report_dir / FIGURES
    figure_dir.mkdir(parents=True, exist_ok=True)
    confidence = params.evaluate.confidence
    primary = params.report.primary_metric
    figures = {
        "metric_by_loss": plots.metric_by_loss(
            results.runs,
            [primary, "precision_at_1"] if primary != "precision_at_1" else [primary],
            figure_dir / "metric_by_loss.png",
            confidence,
        ),
        "validation_curves": plots.validation_curves(
            results.history, params.protocol.selection_metric, figure_dir / "validation_curves.png", confidence
        ),
    }
    text = render(params, results, figures, report_dir)
    path = report_dir / REPORT
    with atomic_path(path, suffix=".md") as tmp:
        tmp.write_text(text)
    return path
