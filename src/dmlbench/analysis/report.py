"""The ``report`` stage: ``reports/report.md`` and its figures, from the pipeline's outputs.

Reads exactly the grid in ``params.yaml`` (stale outputs of cells removed from the grid are
ignored): per-run test metrics (``artifacts/evaluation``), training histories and run records
(``artifacts/models``), embeddings (``artifacts/embeddings``, for the retrieval gallery) and
dataset summaries (``artifacts/prepared``), plus the published numbers in
:mod:`dmlbench.analysis.literature`. Every measured number in the report carries n and a 95%
interval. The report and its figures are also logged to MLflow as one "report" run per
report content (:mod:`dmlbench.tracking.report_run`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from importlib import metadata
from pathlib import Path
from typing import Any, Callable, Iterable, Sequence

import numpy as np
import pandas as pd

from dmlbench import paths
from dmlbench.analysis import bayesian as bz
from dmlbench.analysis import literature as lit
from dmlbench.analysis import statistics as st
from dmlbench.analysis.cross_validation import cross_validation_table, fold_rows
from dmlbench.analysis.tournament import experiment_ranks, tournament
from dmlbench.config import Combo, Params
from dmlbench.data import DATASETS
from dmlbench.errors import DataError
from dmlbench.evaluate.intervals import t_interval
from dmlbench.io import atomic_dir, atomic_path, read_json
from dmlbench.tracking.store import git_state

REPORT = "report.md"
FIGURES = "figures"
BASELINES = ("contrastive", "triplet")
TOP1 = "precision_at_1"  # = Recall@1, what papers report
METRIC_HEADERS = {
    "precision_at_1": "P@1 = R@1",
    "recall_at_1": "R@1",
    "r_precision": "R-Prec",
    "map_at_r": "MAP@R",
    "nmi": "NMI",
    "ami": "AMI",
    "f1": "F1",
}


def table_metrics(present: Iterable[str]) -> list[str]:
    """Columns of a results table, from the metrics a cell has: P@1 (= R@1), Recall@K by K
    (R@2/4/8 for CUB/Cars, R@10/100/1000 for SOP, ...), R-Precision, MAP@R, then NMI, AMI and F1."""
    present = set(present)
    recalls = sorted(
        (m for m in present if m.startswith("recall_at_") and m != "recall_at_1"), key=lambda m: int(m[10:])
    )
    head = ["precision_at_1"] if "precision_at_1" in present else []
    return head + recalls + [m for m in ("r_precision", "map_at_r", "nmi", "ami", "f1") if m in present]


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


# --------------------------------------------------------------------------- inputs


@dataclass
class Results:
    runs: pd.DataFrame  # dataset, backbone, loss, dim, seed, metric, value
    history: pd.DataFrame  # dataset, backbone, loss, dim, seed, epoch, train/*, val/*, test_feedback/*
    selections: pd.DataFrame  # dataset, backbone, loss, dim, seed, selected_epoch, selection_metric, tf_*, device
    datasets: dict[str, dict[str, Any]]
    # the untrained trunk ("Pretrained" row): dataset, backbone, weights, dim, metric, mean, low, high, n (queries)
    baselines: pd.DataFrame = field(default_factory=pd.DataFrame)
    # cross-validation cells: each fold model's own test metrics (dataset, backbone, loss, dim, seed, fold, metric, value)
    folds: pd.DataFrame = field(default_factory=pd.DataFrame)


def collect_results(params: Params) -> Results:
    """Load every output of the current grid; fail naming the first missing file."""
    run_rows, history_rows, selection_rows, fold_metric_rows = [], [], [], []
    for combo in params.combos():
        runs_file = paths.evaluation_dir(combo) / "runs.json"
        if not runs_file.exists():
            raise DataError(f"{runs_file}: missing (run evaluate@{combo.key} first)")
        cell = {"dataset": combo.dataset, "backbone": combo.backbone, "loss": combo.loss, "dim": combo.dim}
        runs_json = read_json(runs_file)
        for info in runs_json["runs"].values():
            for metric, value in info["metrics"].items():
                run_rows.append({**cell, "seed": info["seed"], "metric": metric, "value": value})
        fold_metric_rows += fold_rows(runs_json, cell)
        for seed in params.seeds:
            run = combo.with_seed(seed)
            for fold in paths.folds_in(paths.model_dir(run)):  # cross-validation: one entry per fold model
                model_dir = paths.model_dir(run, fold)
                for name in ("history.json", "run.json"):
                    if not (model_dir / name).exists():
                        raise DataError(f"{model_dir / name}: missing (run train@{run.key} first)")
                for entry in read_json(model_dir / "history.json"):
                    history_rows.append({**cell, "seed": seed, "fold": fold, **entry})
                info = read_json(model_dir / "run.json")
                feedback = info.get("test_feedback") or {}
                selection_rows.append(
                    {
                        **cell,
                        "seed": seed,
                        "fold": fold,
                        "selected_epoch": info["selection"]["epoch"],
                        "selection_metric": info["selection"]["metric"],
                        "tf_metric": feedback.get("metric"),
                        "tf_best_epoch": feedback.get("best_epoch"),
                        "tf_best_value": feedback.get("best_value"),
                        "tf_selected_value": feedback.get("selected_value"),
                        "device": info.get("device", "unknown device"),
                    }
                )
    datasets = {}
    for name in params.datasets:
        info_file = paths.prepared_dir(name) / "info.json"
        if not info_file.exists():
            raise DataError(f"{info_file}: missing (run prepare@{name} first)")
        datasets[name] = read_json(info_file)
    return Results(
        pd.DataFrame(run_rows),
        pd.DataFrame(history_rows),
        pd.DataFrame(selection_rows),
        datasets,
        collect_baselines(params),
        pd.DataFrame(fold_metric_rows),
    )


def collect_baselines(params: Params) -> pd.DataFrame:
    """The ``evaluate_pretrained`` results of every dataset x backbone: one evaluation each, with the
    per-query bootstrap interval (n = test queries); a missing one is left out of the report."""
    rows = []
    for dataset in params.datasets:
        for backbone in params.backbones:
            runs_file = paths.pretrained_evaluation_dir(dataset, backbone) / "runs.json"
            meta_file = paths.pretrained_embedding_dir(dataset, backbone) / "meta.json"
            if not runs_file.exists() or not meta_file.exists():
                continue
            meta = read_json(meta_file)
            for info in read_json(runs_file)["runs"].values():
                for metric, value in info["metrics"].items():
                    bounds = info.get("bootstrap", {}).get(metric) or {}
                    low, high = bounds.get("low"), bounds.get("high")
                    rows.append(
                        {
                            "dataset": dataset,
                            "backbone": backbone,
                            "weights": meta.get("weights", ""),
                            "dim": meta["dim"],
                            "metric": metric,
                            "mean": value,
                            "low": math.nan if low is None else low,
                            "high": math.nan if high is None else high,
                            "n": int(bounds.get("n", info.get("num_queries", 1))),
                        }
                    )
    return pd.DataFrame(rows)


# --------------------------------------------------------------------------- numbers


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


def format_interval(mean: float, low: float, high: float, n: int, scale: float = 100, digits: int = 1) -> str:
    """``62.1 ± 1.8 (n=3)`` (percent by default); ``62.1 (n=1, no interval)`` for a single value."""
    if n < 2 or math.isnan(low):
        return f"{scale * mean:.{digits}f} (n={n}, no interval)"
    return f"{scale * mean:.{digits}f} ± {scale * (high - low) / 2:.{digits}f} (n={n})"


def format_bounds(mean: float, low: float, high: float, n: int, scale: float = 100, digits: int = 1) -> str:
    """``2.6 [1.9, 3.3] (n=2000 queries)``: an interval that need not be symmetric (bootstrap)."""
    if math.isnan(low):
        return f"{scale * mean:.{digits}f} (n=1 run, no interval)"
    return f"{scale * mean:.{digits}f} [{scale * low:.{digits}f}, {scale * high:.{digits}f}] (n={n} queries)"


def format_signed_interval(estimate: float, low: float, high: float, n: str) -> str:
    """``+12.3% [+4.0, +21.1] (n=3 vs 3)`` for relative improvements given as fractions."""
    if math.isnan(low):
        return f"{100 * estimate:+.1f}% ({n}, no interval)"
    return f"{100 * estimate:+.1f}% [{100 * low:+.1f}, {100 * high:+.1f}] ({n})"


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


def focus_dim(params: Params) -> int:
    """``report.focus_dim``, else 512 when the grid has it (the papers' size), else the largest dim."""
    if params.report.focus_dim is not None:
        return params.report.focus_dim
    return 512 if 512 in params.dims else max(params.dims)


def feedback_bias(results: Results) -> pd.DataFrame:
    """Per run: test score of the best test epoch minus that of the epoch selected on validation.

    From ``run.json`` ``test_feedback`` when present, else from the ``test_feedback/<metric>``
    columns of ``history.json`` (the selection metric's). Empty when neither was recorded.
    """
    rows = []
    history = results.history
    for sel in results.selections.itertuples(index=False):
        cell = {"dataset": sel.dataset, "backbone": sel.backbone, "loss": sel.loss, "dim": sel.dim, "seed": sel.seed}
        if sel.tf_best_value is not None and not pd.isna(sel.tf_best_value):
            rows.append(
                {
                    **cell,
                    "metric": sel.tf_metric,
                    "best_epoch": sel.tf_best_epoch,
                    "best_value": sel.tf_best_value,
                    "selected_epoch": sel.selected_epoch,
                    "selected_value": sel.tf_selected_value,
                }
            )
            continue
        metric = sel.selection_metric or "map_at_r"
        column = f"test_feedback/{metric}"
        if column not in history.columns:
            continue
        mask = np.ones(len(history), dtype=bool)
        for key, value in cell.items():
            mask &= (history[key] == value).to_numpy()
        if not pd.isna(sel.fold):  # one fold model of a cross-validation run
            mask &= (history["fold"] == sel.fold).to_numpy()
        curve = history.loc[mask, ["epoch", column]].dropna()
        if curve.empty:
            continue
        best = curve.loc[curve[column].idxmax()]
        at_selected = curve.loc[curve["epoch"] == sel.selected_epoch, column]
        if at_selected.empty:
            continue
        rows.append(
            {
                **cell,
                "metric": metric,
                "best_epoch": int(best["epoch"]),
                "best_value": float(best[column]),
                "selected_epoch": sel.selected_epoch,
                "selected_value": float(at_selected.iloc[0]),
            }
        )
    frame = pd.DataFrame(rows)
    if len(frame):
        frame["bias"] = frame["best_value"] - frame["selected_value"]
    return frame


def run_costs(results: Results) -> pd.DataFrame:
    """Per run: training seconds (sum over epochs), mean training images/s, epochs, device."""
    history = results.history
    keys = ["dataset", "backbone", "loss", "dim", "seed"]
    seconds_column = "train/epoch_seconds" if "train/epoch_seconds" in history.columns else None
    rows = []
    for key, group in history.groupby(keys, sort=False):
        rows.append(
            {
                **dict(zip(keys, key, strict=True)),
                "train_seconds": float(group[seconds_column].sum()) if seconds_column else math.nan,
                "images_per_second": float(group["train/images_per_second"].mean())
                if "train/images_per_second" in group.columns
                else math.nan,
                "epochs": int(group["epoch"].max()),
            }
        )
    costs = pd.DataFrame(rows)
    devices = results.selections[keys + ["device"]].drop_duplicates(subset=keys)  # folds share a device
    return costs.merge(devices, on=keys, how="left").fillna({"device": "unknown device"})


# --------------------------------------------------------------------------- analysis


@dataclass
class Tests:
    """Friedman + Nemenyi (or why they were not run), Holm-adjusted win rates, Bayesian comparison."""

    blocks: str
    scores: pd.DataFrame | None = None
    friedman: st.FriedmanResult | None = None
    nemenyi: pd.DataFrame | None = None
    cd: float | None = None
    wins: pd.DataFrame | None = None
    skipped: str | None = None
    grid: str = ""  # the complete experiments, e.g. "2 experiments (1 dataset x 1 backbone x 2 embedding sizes)"
    experiments: int = 0  # independent experiment blocks
    bayes: pd.DataFrame | None = None  # bayesian.compare_neighbours
    rope: float = 0.01  # metric units


@dataclass
class Papers:
    claimed: dict[str, pd.DataFrame]
    reference: dict[str, pd.DataFrame]
    ours: dict[str, pd.DataFrame]  # per baseline: our relative improvements (percent)
    ours_absolute: pd.DataFrame  # display, year, dataset, mean, low, high (percent), n
    literature: pd.DataFrame
    methods: pd.DataFrame


@dataclass
class Analysis:
    params: Params
    results: Results
    summary: pd.DataFrame
    names: dict[str, str]
    order: list[str]  # display names, oldest loss first
    ranking: pd.DataFrame
    rank_intervals: dict[str, Any]
    tests: Tests
    papers: Papers
    bias: pd.DataFrame
    costs: pd.DataFrame
    dim: int

    def display(self, frame: pd.DataFrame) -> pd.DataFrame:
        return frame.assign(loss=frame["loss"].map(self.names))


def analyse(params: Params, results: Results) -> Analysis:
    confidence = params.evaluate.confidence
    primary = params.report.primary_metric
    methods = lit.load_methods()
    literature = lit.load_literature(methods=methods)
    losses = list(params.losses)
    names = {loss: lit.display_name(loss, methods) for loss in losses}
    chronological = sorted(losses, key=lambda loss: (_year(loss, methods), losses.index(loss)))
    order = [names[loss] for loss in chronological]

    ranking = tournament(tournament_input(results.runs, primary))
    ranks = experiment_ranks(tournament_input(results.runs, primary))
    rank_intervals = {loss: t_interval(group["rank"].to_numpy(), confidence) for loss, group in ranks.groupby("loss")}

    tests = Tests(blocks=params.report.blocks, rope=params.report.rope)
    scores = st.score_matrix(results.runs, primary, params.report.blocks)
    experiments = st.score_matrix(results.runs, primary, "experiment")
    tests.scores, tests.experiments = scores, len(experiments)
    tests.grid = st.grid_text(results.runs, primary)
    tests.wins = st.win_rates(scores, confidence) if scores.shape[1] > 1 else None
    tests.skipped = st.friedman_shortfall(scores, params.report.blocks, tests.grid)
    if tests.skipped is None:
        tests.friedman = st.friedman(scores)
        tests.nemenyi = st.nemenyi(scores)
        tests.cd = st.critical_difference(scores.shape[1], scores.shape[0], params.report.alpha)
    if scores.shape[1] > 1:
        seeds = st.seed_scores(results.runs, primary)
        tests.bayes = bz.compare_neighbours(seeds, experiments, list(ranking["loss"]), params.report.rope)

    return Analysis(
        params=params,
        results=results,
        summary=summarize(results.runs, confidence),
        names=names,
        order=order,
        ranking=ranking,
        rank_intervals=rank_intervals,
        tests=tests,
        papers=papers_vs_reality(params, results, literature, methods, names, confidence),
        bias=feedback_bias(results),
        costs=run_costs(results),
        dim=focus_dim(params),
    )


def _year(loss: str, methods: pd.DataFrame) -> float:
    year = lit.loss_year(loss, methods)
    return math.inf if math.isnan(year) else year


def papers_vs_reality(
    params: Params,
    results: Results,
    literature: pd.DataFrame,
    methods: pd.DataFrame,
    names: dict[str, str],
    confidence: float,
) -> Papers:
    """Claimed and re-measured relative improvements over the baselines, and ours at the focus dim."""
    dim = focus_dim(params)
    claimed, reference, ours = {}, {}, {}
    for baseline in BASELINES:
        claims = lit.claimed_improvements(literature, baseline)
        claimed[baseline] = claims.assign(display=claims["loss"].map(lambda x: lit.display_name(x, methods)))
        refs = lit.reference_improvements(literature, baseline, methods)
        reference[baseline] = refs
        ours[baseline] = _our_improvements(results.runs, baseline, dim, names, methods, confidence)
    top1 = results.runs[(results.runs["metric"] == TOP1) & (results.runs["dim"] == dim)]
    rows = []
    for (dataset, backbone, loss), group in top1.groupby(["dataset", "backbone", "loss"], sort=False):
        interval = t_interval(group["value"].to_numpy(), confidence)
        low, high = (interval.low, interval.high) if interval.n > 1 else (interval.mean, interval.mean)
        rows.append(
            {
                "dataset": dataset,
                "backbone": backbone,
                "loss": loss,
                "display": names[loss],
                "year": lit.loss_year(loss, methods),
                "mean": 100 * interval.mean,
                "low": 100 * low,
                "high": 100 * high,
                "n": interval.n,
            }
        )
    return Papers(claimed, reference, ours, pd.DataFrame(rows), literature, methods)


def _our_improvements(
    runs: pd.DataFrame, baseline: str, dim: int, names: dict[str, str], methods: pd.DataFrame, confidence: float
) -> pd.DataFrame:
    """Our relative P@1 improvement of each loss over ``baseline`` per dataset/backbone at ``dim`` (percent)."""
    top1 = runs[(runs["metric"] == TOP1) & (runs["dim"] == dim)]
    rows = []
    for (dataset, backbone), block in top1.groupby(["dataset", "backbone"], sort=False):
        base = block[block["loss"] == baseline]["value"].to_numpy()
        if base.size == 0:
            continue
        for loss, group in block.groupby("loss", sort=False):
            if loss == baseline:
                continue
            try:
                ratio = st.relative_improvement(group["value"].to_numpy(), base, confidence)
            except ValueError:  # a mean of 0 (collapsed embeddings): no ratio
                continue
            rows.append(
                {
                    "dataset": dataset,
                    "backbone": backbone,
                    "loss": loss,
                    "display": names[loss],
                    "year": lit.loss_year(loss, methods),
                    "estimate": 100 * ratio.estimate,
                    "low": 100 * (ratio.estimate if math.isnan(ratio.low) else ratio.low),
                    "high": 100 * (ratio.estimate if math.isnan(ratio.high) else ratio.high),
                    "interval": ratio,
                }
            )
    return pd.DataFrame(rows)


def _dated(frame: pd.DataFrame) -> pd.DataFrame:
    """Rows whose loss has a publication year (what the by-year figures can place)."""
    return frame[frame["year"].notna()] if len(frame) else frame


# --------------------------------------------------------------------------- figures


@dataclass
class Figure:
    """A figure in the report: file (None when omitted), caption, or why it is missing."""

    path: Path | None
    caption: str
    note: str = ""


def make_figures(analysis: Analysis, figure_dir: Path) -> dict[str, Figure]:
    """Draw every figure into ``figure_dir``; a figure the data cannot support is omitted with a note."""
    from dmlbench.analysis import plots

    params, results = analysis.params, analysis.results
    confidence = params.evaluate.confidence
    primary = params.report.primary_metric
    runs = analysis.display(results.runs)
    order = analysis.order
    figures: dict[str, Figure] = {}

    def draw(name: str, build: Callable[[Path], Path], caption: str) -> None:
        figures[name] = Figure(build(figure_dir / f"{name}.png"), caption)

    main_metrics = list(dict.fromkeys([primary, "r_precision", TOP1]))
    draw(
        "metric_by_loss",
        lambda p: plots.metric_by_loss(runs, main_metrics, p, order, confidence),
        f"Test {', '.join(METRIC_HEADERS.get(m, m) for m in main_metrics)} per loss (oldest left) and embedding "
        f"size; points are seed means, bars {int(confidence * 100)}% t-intervals - "
        + _best_sentence(analysis, primary),
    )
    draw(
        "recall_by_loss",
        lambda p: plots.recall_by_loss(runs, p, order, confidence),
        "Recall@K per loss for every embedding size (thesis Fig. 27/28): " + _recall_sentence(analysis),
    )
    dims = sorted(results.runs["dim"].unique())
    if len(dims) > 1:
        draw(
            "embedding_size",
            lambda p: plots.embedding_size(runs, [primary, TOP1], p, order, confidence),
            "Test score against embedding size (log scale) for each loss - " + _size_sentence(analysis, primary),
        )
    else:
        figures["embedding_size"] = Figure(
            None, "", f"The grid has one embedding size ({dims[0]}); nothing to compare."
        )
    backbones = sorted(results.runs["backbone"].unique())
    draw(
        "backbones",
        lambda p: plots.backbones(runs, TOP1, analysis.dim, p, order, confidence),
        f"Test P@1 per loss and backbone at embedding size {analysis.dim} (thesis Fig. 31)"
        + (
            f"; this grid has one backbone (`{backbones[0]}`), so the figure shows the losses only "
            "and says nothing about backbones."
            if len(backbones) == 1
            else " - a stronger backbone lifts every loss, so losses trained on different backbones cannot be compared."
        ),
    )
    history = analysis.display(results.history)
    draw(
        "convergence",
        lambda p: plots.convergence(history, params.protocol.selection_metric, analysis.dim, p, order, confidence),
        f"Validation {METRIC_HEADERS.get(params.protocol.selection_metric, params.protocol.selection_metric)} per "
        f"epoch (left) and against cumulative training seconds (right) at dim {analysis.dim}, seed means with "
        "t-interval bands: " + _convergence_sentence(analysis),
    )
    if len(analysis.bias):
        draw(
            "test_feedback",
            lambda p: plots.test_feedback(analysis.display(analysis.bias), p, order, confidence),
            "Gain from choosing each run's epoch on the test set instead of the validation classes, per run "
            f"(dots) and mean with {int(confidence * 100)}% t-interval: the optimism that test-set feedback "
            "builds into published numbers.",
        )
    else:
        figures["test_feedback"] = Figure(
            None,
            "",
            "Not measured for this grid: the training histories carry no `test_feedback/*` metrics "
            "(history.json) and run.json has no `test_feedback` record.",
        )
    draw(
        "cost",
        lambda p: plots.cost(analysis.display(analysis.costs), p, order),
        "Training time per run and training throughput per loss and embedding size (mean over runs, whiskers "
        "min-max); evaluation time is not included.",
    )
    tests = analysis.tests
    if tests.skipped is None:
        ranks = tests.friedman.mean_ranks.rename(index=analysis.names)
        pvalues = tests.nemenyi.rename(index=analysis.names, columns=analysis.names)
        draw(
            "critical_difference",
            lambda p: plots.critical_difference_diagram(
                ranks,
                pvalues,
                tests.cd,
                p,
                params.report.alpha,
                f"Mean rank over {tests.friedman.n_blocks} blocks (1 = best); CD = {tests.cd:.2f} "
                f"at alpha = {params.report.alpha:g}",
            ),
            "Critical-difference diagram: mean rank of each loss (1 = best) over the blocks; losses joined by a "
            "bar are not significantly different (Nemenyi, "
            f"alpha = {params.report.alpha:g}) - " + _nemenyi_sentence(analysis),
        )
    else:
        figures["critical_difference"] = Figure(None, "", f"No critical-difference diagram: {tests.skipped}.")
    if tests.bayes is not None and tests.bayes["better"].notna().any():
        bayes = tests.bayes.assign(a=tests.bayes["a"].map(analysis.names), b=tests.bayes["b"].map(analysis.names))
        draw(
            "bayesian_comparison",
            lambda p: plots.bayesian_comparison(bayes, p, _points(tests.rope)),
            "Bayesian comparison of neighbours in the tournament (A = the better-ranked loss): posterior "
            f"probability that A is practically better (blue), equivalent within ± {_points(tests.rope)} "
            "(grey) or practically worse (red), per experiment over its n matched seeds"
            + (" and across experiments" if (tests.bayes["experiment"] == bz.ACROSS).any() else "")
            + "; dotted lines at 0.05 and 0.95.",
        )
    elif tests.bayes is not None:
        figures["bayesian_comparison"] = Figure(
            None, "", f"No Bayesian comparison: every experiment has fewer than {bz.MIN_SEEDS} matched seeds."
        )
    if tests.wins is not None:
        wins = tests.wins.assign(
            loss=tests.wins["loss"].map(analysis.names), opponent=tests.wins["opponent"].map(analysis.names)
        )
        draw(
            "win_rates",
            lambda p: plots.win_rate_heatmap(wins, order, p, confidence),
            "How often the row loss beats the column loss over the blocks, with 95% Wilson intervals: a rate whose "
            "interval covers 0.5 is no evidence of a difference.",
        )
    papers = analysis.papers
    ours_label = _ours_label(analysis)
    draw(
        "papers_vs_reality",
        lambda p: plots.papers_vs_reality(
            papers.claimed, papers.reference, {b: _dated(f) for b, f in papers.ours.items()}, p, ours_label
        ),
        "Relative R@1 improvement over contrastive (left) and triplet (right) by the year the loss was published: "
        "(a) as claimed by papers against the baselines they reported, (b) as re-measured under one protocol by "
        "the Reality Check, the thesis and our runs - " + _papers_sentence(analysis),
    )
    reference_rows = lit.reference_rows(lit.top1(papers.literature)).assign(
        year=lambda d: d["loss"].map(lambda x: lit.loss_year(x, papers.methods))
    )
    reference_rows = reference_rows[reference_rows["year"].notna()]  # "pretrained" has no year
    claims = lit.top1(papers.literature)
    claims = claims[claims["kind"].isin(["claimed", "baseline"])].assign(
        display=lambda d: d["loss"].map(lambda x: lit.display_name(x, papers.methods))
    )
    draw(
        "papers_claims",
        lambda p: plots.papers_absolute(claims, reference_rows, _dated(papers.ours_absolute), p, ours_label),
        "Absolute R@1 by year: the numbers papers claimed for their losses (red), the contrastive and triplet "
        "numbers they compared against (grey), the same losses re-run under one protocol (blue, green), and our "
        "runs (black) - the baselines papers reported are far below what the old losses reach when trained well.",
    )
    gallery = _gallery(analysis, figure_dir / "gallery.png")
    figures["gallery"] = gallery
    return figures


def _gallery(analysis: Analysis, path: Path) -> Figure:
    from dmlbench.analysis.gallery import GalleryRun, retrieval_gallery
    from dmlbench.data.cache import PreparedDataset

    params = analysis.params
    config = params.report.gallery
    dataset, backbone = next(iter(params.datasets)), next(iter(params.backbones))
    ranked = [loss for loss in analysis.ranking["loss"]]
    chosen = ranked if len(ranked) <= config.max_losses else ranked[: config.max_losses - 1] + ranked[-1:]
    seed = params.seeds[0]
    runs = []
    for loss in chosen:
        run = Combo(dataset, backbone, loss, analysis.dim).with_seed(seed)
        fold = paths.folds_in(paths.embedding_dir(run))[0]  # cross-validation: the first fold model
        npz = paths.embedding_dir(run, fold) / "embeddings.npz"
        if not npz.exists():
            return Figure(None, "", f"No retrieval gallery: {npz} is missing (run embed@{run.key}).")
        runs.append(GalleryRun(f"{analysis.names[loss]} (rank {ranked.index(loss) + 1})", npz))
    prepared = PreparedDataset.load(paths.prepared_dir(dataset), in_memory=False)
    built = retrieval_gallery(runs, prepared, path, config.queries, config.neighbours, config.seed)
    shown = "all losses" if len(chosen) == len(ranked) else f"the {len(chosen) - 1} best-ranked losses and the worst"
    return Figure(
        built,
        f"Retrieval on `{dataset}` with `{backbone}`, dim {analysis.dim}, seed {seed}, {shown}: each row is a test "
        f"query (left) and its {config.neighbours} nearest test images per loss, green = same class, red = another "
        "class.",
    )


def _ours_label(analysis: Analysis) -> str:
    cells = analysis.papers.ours_absolute
    if cells.empty:
        return "our runs"
    datasets = ", ".join(dict.fromkeys(cells["dataset"]))
    return f"our runs ({datasets}, dim {analysis.dim})"


# --------------------------------------------------------------------------- sentences


def _best_sentence(analysis: Analysis, metric: str) -> str:
    summary = analysis.summary[analysis.summary["metric"] == metric]
    parts = []
    for (dataset, backbone, dim), block in summary.groupby(["dataset", "backbone", "dim"], sort=False):
        block = block.sort_values("mean", ascending=False)
        best, second = block.iloc[0], block.iloc[1] if len(block) > 1 else None
        text = f"{analysis.names[best['loss']]} leads at {dataset}/{backbone}/{dim}"
        if second is not None:
            separated = not math.isnan(best["low"]) and best["low"] > second["high"]
            text += " (clear of the runner-up's interval)" if separated else " (its interval overlaps the runner-up's)"
        parts.append(text)
    return "; ".join(parts[:4]) + ("; ..." if len(parts) > 4 else "") + "."


def _recall_sentence(analysis: Analysis) -> str:
    """Whether the order of the losses by seed-mean Recall@K is the same for every K in each cell."""
    summary = analysis.summary[analysis.summary["metric"].str.startswith("recall_at_")]
    cells = changed = 0
    for _, block in summary.groupby(["dataset", "backbone", "dim"], sort=False):
        orders = {tuple(g.sort_values("mean", ascending=False)["loss"]) for _, g in block.groupby("metric")}
        cells += 1
        changed += len(orders) > 1
    if not changed:
        return f"the order of the losses is the same at every K in all {cells} cell(s), so R@1 carries the ranking."
    return f"the order of the losses changes with K in {changed} of {cells} cell(s)."


def _size_sentence(analysis: Analysis, metric: str) -> str:
    summary = analysis.summary[analysis.summary["metric"] == metric]
    dims = sorted(summary["dim"].unique())
    small, large = summary[summary["dim"] == dims[0]], summary[summary["dim"] == dims[-1]]
    merged = small.merge(large, on=["dataset", "backbone", "loss"], suffixes=("_s", "_l"))
    gains = 100 * (merged["mean_l"] - merged["mean_s"])
    return (
        f"going from {dims[0]} to {dims[-1]} dimensions changes {METRIC_HEADERS.get(metric, metric)} by "
        f"{gains.min():+.1f} to {gains.max():+.1f} points across losses."
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


def _nemenyi_sentence(analysis: Analysis) -> str:
    tests = analysis.tests
    ranks = tests.friedman.mean_ranks
    pairs = [
        f"{analysis.names[a]} > {analysis.names[b]}"
        for i, a in enumerate(ranks.index)
        for b in ranks.index[i + 1 :]
        if tests.nemenyi.loc[a, b] < analysis.params.report.alpha
    ]
    if not pairs:
        return "no pair of losses is significantly different."
    return "significant pairs: " + ", ".join(pairs) + "."


def _papers_sentence(analysis: Analysis) -> str:
    papers = analysis.papers
    claims = papers.claimed["contrastive"]
    reference = papers.reference["contrastive"]
    text = ""
    if len(claims):
        text += (
            f"papers claim {claims['improvement'].min():+.0f}% to {claims['improvement'].max():+.0f}% over contrastive"
        )
    if len(reference):
        text += f", re-runs measure {reference['improvement'].min():+.0f}% to {reference['improvement'].max():+.0f}%"
    ours = papers.ours["contrastive"]
    if len(ours):
        text += f", our runs {ours['estimate'].min():+.0f}% to {ours['estimate'].max():+.0f}%"
    return (text or "no claims to compare") + "."


# --------------------------------------------------------------------------- markdown


def _figure(lines: list[str], figures: dict[str, Figure], name: str, counter: list[int]) -> None:
    figure = figures.get(name)
    if figure is None:
        return
    if figure.path is None:
        lines += [f"> {figure.note}", ""]
        return
    counter[0] += 1
    lines += [
        f"![{name.replace('_', ' ')}]({FIGURES}/{figure.path.name})",
        "",
        f"*Figure {counter[0]}. {figure.caption}*",
        "",
    ]


def _loss_settings(analysis: Analysis) -> list[str]:
    """Where each loss's hyperparameters come from: the protocol's published values (per dataset /
    backbone when they differ), ``losses.<name>`` of params.yaml, or the loss module's defaults."""
    params = analysis.params
    lines = [
        "- Loss hyperparameters: each loss module's defaults (thesis Table 4, else the loss's paper), except "
        "where listed:"
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


def _flip_note(params: Params) -> str:
    if not params.protocol.augment.hflip:
        return ""
    flipped = [name for name in params.datasets if DATASETS[name].hflip_invariant]
    if not flipped:
        return " (no horizontal flip: no dataset here is flip-invariant)"
    return f" + horizontal flip ({', '.join(flipped)})"


def render(analysis: Analysis, figures: dict[str, Figure]) -> str:
    params, results = analysis.params, analysis.results
    confidence = params.evaluate.confidence
    commit, dirty = git_state()
    counter = [0]
    lines: list[str] = [f"# {params.report.title}", ""]
    lines += [
        f"Generated by the `report` stage of `dvc repro` from **{len(params.runs())} training runs** "
        f"({len(params.combos())} grid cells x {len(params.seeds)} seeds); git commit `{commit[:12]}`"
        + (" with uncommitted changes" if dirty else "")
        + f". Every measured score is the mean over seeds with its {int(confidence * 100)}% t-interval "
        "half-width and the number of runs n; scores are percentages.",
        "",
        "**Contents:** [Summary](#summary) · [Setup](#setup) · [Results](#results-on-the-test-classes) · "
        "[Tournament](#tournament-of-losses) · [Statistical tests](#statistical-tests) · "
        "[Papers vs reality](#papers-versus-reality) · [Embedding size and backbone](#embedding-size-and-backbone) · "
        "[Convergence](#convergence) · [Test-set feedback](#test-set-feedback) · [Cost](#cost) · "
        "[Retrieval examples](#retrieval-examples) · [Limitations](#limitations)",
        "",
    ]
    lines += _summary_section(analysis)
    lines += _setup_section(analysis)
    lines += ["## Results on the test classes", ""]
    summary = analysis.summary
    chronological = {name: i for i, name in enumerate(analysis.order)}
    for (dataset, backbone), block in summary.groupby(["dataset", "backbone"], sort=False):
        metrics = table_metrics(block["metric"])
        headers = [METRIC_HEADERS.get(m, m.replace("recall_at_", "R@")) for m in metrics]
        lines += [f"### `{dataset}` / `{backbone}`", ""]
        rows = []
        cells = sorted(
            block.groupby(["loss", "dim"], sort=False),
            key=lambda item: (item[0][1], chronological[analysis.names[item[0][0]]]),
        )
        for (loss, dim), cell in cells:
            by_metric = cell.set_index("metric")
            rows.append(
                [analysis.names[loss], dim]
                + [
                    format_interval(*by_metric.loc[m, ["mean", "low", "high"]], int(by_metric.loc[m, "n"]))
                    for m in metrics
                ]
            )
        baseline = _baseline_block(results.baselines, dataset, backbone)
        if baseline is not None:
            by_metric = baseline.set_index("metric")
            rows.append(
                [f"*Pretrained* ({baseline['weights'].iloc[0]}, no training)", int(baseline["dim"].iloc[0])]
                + [
                    format_bounds(*by_metric.loc[m, ["mean", "low", "high"]], int(by_metric.loc[m, "n"]))
                    if m in by_metric.index
                    else "-"
                    for m in metrics
                ]
            )
        lines += [markdown_table(["loss", "dim", *headers], rows), ""]
        if baseline is not None:
            lines += [
                f"*Pretrained*: the trunk's pooled features before any training (the thesis's \"Pretrained\" row), "
                f"evaluated once, so its interval is a {int(confidence * 100)}% per-query bootstrap interval "
                "with n = test queries, not a t-interval over seeds.",
                "",
            ]
    lines += _cross_validation_block(analysis)
    _figure(lines, figures, "metric_by_loss", counter)
    _figure(lines, figures, "recall_by_loss", counter)
    lines += _tournament_section(analysis)
    lines += _tests_section(analysis, figures, counter)
    lines += _papers_section(analysis, figures, counter)
    lines += ["## Embedding size and backbone", ""]
    _figure(lines, figures, "embedding_size", counter)
    _figure(lines, figures, "backbones", counter)
    lines += ["## Convergence", ""]
    _figure(lines, figures, "convergence", counter)
    selected = results.selections.assign(loss=results.selections["loss"].map(analysis.names))
    rows = []
    for name in analysis.order:
        epochs = selected[selected["loss"] == name]["selected_epoch"]
        rows.append(
            [
                name,
                format_interval(epochs.mean(), *_bounds(epochs, confidence), len(epochs), scale=1),
                int(epochs.min()),
                int(epochs.max()),
            ]
        )
    lines += [
        f"Epoch selected on the validation classes ({params.protocol.epochs} epochs trained):",
        "",
        markdown_table(["loss", "selected epoch", "min", "max"], rows),
        "",
    ]
    lines += _feedback_section(analysis, figures, counter)
    lines += _cost_section(analysis, figures, counter)
    lines += ["## Retrieval examples", ""]
    _figure(lines, figures, "gallery", counter)
    lines += _limitations_section(analysis, figures)
    return "\n".join(lines)


def _cross_validation_block(analysis: Analysis) -> list[str]:
    rows = cross_validation_table(
        analysis.results.runs,
        analysis.results.folds,
        analysis.papers.literature,
        analysis.names,
        analysis.params.evaluate.confidence,
    )
    if not rows:
        return []
    return [
        "### Cross-validation: the fold models and their ensemble",
        "",
        "P@1 (= R@1) two ways: the concatenated embedding of a run's fold models (the Reality Check's way, the "
        "score used everywhere else in this report; mean and 95% t-interval over seeds), and the fold models "
        "scored one by one (the thesis's way, its Table 12: mean and sample standard deviation over the fold "
        "models of every seed; a spread, not an interval), beside the thesis's number where it published one.",
        "",
        markdown_table(
            ["loss", "dataset / backbone", "dim", "concatenated", "fold models (mean ± sd)", "thesis"], rows
        ),
        "",
    ]


def _baseline_block(baselines: pd.DataFrame, dataset: str, backbone: str) -> pd.DataFrame | None:
    if baselines.empty:
        return None
    block = baselines[(baselines["dataset"] == dataset) & (baselines["backbone"] == backbone)]
    return None if block.empty else block


def _bounds(values: pd.Series, confidence: float) -> tuple[float, float]:
    interval = t_interval(values.to_numpy(dtype=float), confidence)
    return interval.low, interval.high


def tournament_headline(
    ranking: pd.DataFrame, rank_intervals: dict[str, Any], names: dict[str, str], metric: str
) -> str:
    """The summary's tournament bullet: the winner, or every loss sharing the best total rank (a
    tie has no winner), with the mean rank's interval."""
    best = ranking.iloc[0]
    interval = rank_intervals[best["loss"]]
    rank = format_interval(interval.mean, interval.low, interval.high, interval.n, scale=1, digits=2)
    tied = ranking[ranking["total_rank"] == best["total_rank"]]["loss"].tolist()
    over = f"over {int(best['experiments'])} experiment(s) ranked by test {metric}."
    if len(tied) > 1:
        return f"- **Tournament:** {' and '.join(names[loss] for loss in tied)} tie for first, mean rank {rank} {over}"
    return f"- **Tournament winner:** {names[best['loss']]}, mean rank {rank} {over}"


def _summary_section(analysis: Analysis) -> list[str]:
    params = analysis.params
    primary = METRIC_HEADERS.get(params.report.primary_metric, params.report.primary_metric)
    lines = ["## Summary", "", tournament_headline(analysis.ranking, analysis.rank_intervals, analysis.names, primary)]
    tests = analysis.tests
    if tests.skipped is None:
        verdict = "differ" if tests.friedman.pvalue < params.report.alpha else "cannot be told apart"
        seed_blocks = " (seed blocks, not independent: p is optimistic)" if tests.blocks == "experiment_seed" else ""
        lines.append(
            f"- **Friedman test** over {tests.friedman.n_blocks} blocks x {tests.friedman.n_losses} losses"
            f"{seed_blocks}: chi2 = {tests.friedman.statistic:.2f}, p = {_p(tests.friedman.pvalue)}: the losses' "
            f"ranks {verdict} at alpha = {params.report.alpha:g}; Nemenyi: {_nemenyi_sentence(analysis)}"
        )
    else:
        lines.append(f"- **Friedman and Nemenyi tests not run:** {tests.skipped}.")
    if tests.bayes is not None and tests.bayes["better"].notna().any():
        lines.append(_bayes_summary(analysis))
    papers = analysis.papers
    claims, ours = papers.claimed["contrastive"], papers.ours["contrastive"]
    if len(claims):
        line = (
            f"- **Papers vs reality:** papers claimed a median {claims['improvement'].median():+.0f}% R@1 over "
            f"contrastive ({len(claims)} claims); the Reality Check and the thesis re-measured a median "
            f"{papers.reference['contrastive']['improvement'].median():+.1f}%"
        )
        if len(ours):
            line += f"; {_ours_label(analysis)} give {ours['estimate'].min():+.1f}% to {ours['estimate'].max():+.1f}%"
        lines.append(line + ".")
    if len(analysis.bias):
        interval = t_interval(analysis.bias["bias"].to_numpy(), params.evaluate.confidence)
        lines.append(
            "- **Test-set feedback:** picking each run's epoch on the test set would have added "
            f"{format_interval(interval.mean, interval.low, interval.high, interval.n)} points of test "
            f"{METRIC_HEADERS.get(str(analysis.bias['metric'].iloc[0]), analysis.bias['metric'].iloc[0])}."
        )
    costs = analysis.costs
    lines += [
        f"- **Compute:** {costs['train_seconds'].sum() / 60:.1f} training minutes for {len(costs)} runs "
        f"({', '.join(sorted(set(costs['device'])))}).",
        "",
    ]
    return lines


def _p(value: float) -> str:
    return f"{value:.2g}" if value >= 1e-4 else f"{value:.1e}"


def _setup_section(analysis: Analysis) -> list[str]:
    params, results = analysis.params, analysis.results
    protocol = params.protocol
    lines = ["## Setup", "", "### Datasets", ""]
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
        "",
        "### Grid and protocol",
        "",
        f"- Backbones: {', '.join(f'`{b}`' for b in params.backbones)}; losses: "
        f"{', '.join(analysis.names[loss] for loss in params.losses)}; embedding sizes: "
        f"{', '.join(map(str, params.dims))}; seeds: {', '.join(map(str, params.seeds))}.",
        f"- Protocol `{params.protocol_name}`: {protocol.description or 'see params.yaml'}",
        f"  - {protocol.epochs} epochs, batch {protocol.batch_size} = "
        f"{protocol.batch_size // protocol.samples_per_class} classes x {protocol.samples_per_class} images "
        "(PML `MPerClassSampler`);",
        f"  - {protocol.optimizer.name} lr {protocol.optimizer.lr:g}, weight decay "
        f"{protocol.optimizer.weight_decay:g}, schedule `{protocol.scheduler.name}`; losses with parameters get "
        "their own optimiser (at `param_lr`, else the lr x the protocol's or the loss's multiplier);",
        f"  - train transform RandomResizedCrop({protocol.augment.crop_size}, "
        f"scale={list(protocol.augment.crop_scale)}){_flip_note(params)}; eval transform resize "
        f"{protocol.augment.eval_resize} + centre crop {protocol.augment.crop_size};",
        f"  - pooling {protocol.pooling.upper()}, linear head, L2-normalised output; "
        f"{'frozen' if protocol.frozen_bn else 'trainable'} BatchNorm; "
        f"{'ImageNet' if protocol.pretrained else 'random'} initialisation.",
        f"- Model selection: the epoch with the best validation `{protocol.selection_metric}` "
        "(validation classes only; never the test set). Without a validation split the last epoch is kept.",
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
    return lines


def _tournament_section(analysis: Analysis) -> list[str]:
    params = analysis.params
    primary = params.report.primary_metric
    confidence = params.evaluate.confidence
    rows = []
    for r in analysis.ranking.itertuples():
        interval = analysis.rank_intervals[r.loss]
        rows.append(
            [
                analysis.names[r.loss],
                f"{r.total_rank:g}",
                format_interval(interval.mean, interval.low, interval.high, interval.n, scale=1, digits=2),
                "-" if math.isnan(r.std_rank) else f"{r.std_rank:.2f}",
                r.experiments,
            ]
        )
    return [
        "## Tournament of losses",
        "",
        f"Losses ranked within each experiment (dataset x backbone x embedding size) by the seed-mean test "
        f"{METRIC_HEADERS.get(primary, primary)}, rank 1 = best, ties share the average rank; then summed over "
        "experiments, as in the thesis's Table 11 (which ranked by R@1 over 12 CUB200 experiments; "
        "`tests/test_tournament.py` reproduces that table from its numbers). The standard deviation is the "
        f"thesis's (sample, ddof = 1); the mean rank carries its {int(confidence * 100)}% t-interval over "
        "experiments.",
        "",
        markdown_table(["loss", "total rank", "mean rank", "std of rank", "experiments"], rows),
        "",
    ]


def _tests_section(analysis: Analysis, figures: dict[str, Figure], counter: list[int]) -> list[str]:
    params = analysis.params
    tests = analysis.tests
    primary = METRIC_HEADERS.get(params.report.primary_metric, params.report.primary_metric)
    block_text = {
        "experiment_seed": "one block per seed of each dataset x backbone x embedding size (seed k gives every "
        "loss the same initial weights and batches); the seeds of one experiment share its data, so these blocks "
        "are not independent and the p-values below are optimistic",
        "experiment": "one block per dataset x backbone x embedding size, scored by its seed mean (independent "
        "blocks, as Demšar 2006 asks)",
    }[tests.blocks]
    lines = [
        "## Statistical tests",
        "",
        f"Blocks: {block_text}; score: test {primary}. The tests ask whether the losses' ranks within blocks "
        "differ by more than chance; they generalise to these datasets and this protocol only.",
        "",
    ]
    if tests.skipped is None:
        f = tests.friedman
        lines += [
            f"- Friedman test (scipy): chi2({f.n_losses - 1}) = {f.statistic:.2f}, p = {_p(f.pvalue)}, "
            f"N = {f.n_blocks} blocks, k = {f.n_losses} losses.",
            f"- Nemenyi post-hoc (scikit-posthocs): critical difference of mean ranks CD = {tests.cd:.2f} at "
            f"alpha = {params.report.alpha:g}; {_nemenyi_sentence(analysis)}",
            "",
        ]
        _figure(lines, figures, "critical_difference", counter)
    else:
        lines += [f"> Friedman and Nemenyi tests not run: {tests.skipped}.", ""]
    if tests.wins is None:
        return lines + ["> No head-to-head comparison: the grid has one loss.", ""]
    lines += _bayes_lines(analysis, figures, counter)
    wins = tests.wins.set_index(["loss", "opponent"])
    ranked = list(analysis.ranking["loss"])
    rows = []
    for better, worse in zip(ranked, ranked[1:], strict=False):
        w = wins.loc[(better, worse)]
        rate = "-" if w["n"] == 0 else f"{w['rate']:.2f} [{w['low']:.2f}, {w['high']:.2f}]"
        rows.append(
            [
                f"{analysis.names[better]} vs {analysis.names[worse]}",
                f"{int(w['wins'])} / {int(w['defeats'])} / {int(w['ties'])}",
                rate,
                int(w["n"]),
                "-" if w["n"] == 0 else _p(w["p_value"]),
                "-" if w["n"] == 0 else _p(w["p_holm"]),
            ]
        )
    m = int(tests.wins["m"].iloc[0])
    lines += [
        "### Win rates",
        "",
        "Neighbours in the tournament, head to head over the same blocks (win rate with its 95% Wilson interval; "
        f"two-sided sign-test p, and Holm-adjusted p over the m = {m} pairs of losses):",
        "",
        markdown_table(
            ["pair", "wins / defeats / ties", "win rate [95% CI]", "n", "sign test p", f"Holm p (m = {m})"],
            rows,
            "lrrrrr",
        ),
        "",
    ]
    _figure(lines, figures, "win_rates", counter)
    return lines


def _points(value: float) -> str:
    """A difference in metric units as percentage points: ``1 point``, ``0.5 points``."""
    return f"{100 * value:g} point{'' if 100 * value == 1 else 's'}"


def _probability(p: float) -> str:
    """Posterior probability to 2 decimals, never rounded to a certainty: ``> 0.99``, ``< 0.01``."""
    return "> 0.99" if p >= 0.995 else "< 0.01" if p < 0.005 else f"{p:.2f}"


def _bayes_lines(analysis: Analysis, figures: dict[str, Figure], counter: list[int]) -> list[str]:
    """The Bayesian comparison of tournament neighbours (:mod:`dmlbench.analysis.bayesian`)."""
    tests = analysis.tests
    table = tests.bayes
    primary = METRIC_HEADERS.get(analysis.params.report.primary_metric, analysis.params.report.primary_metric)
    rows = []
    for r in table.itertuples():
        pair = f"{analysis.names[r.a]} vs {analysis.names[r.b]}"
        if math.isnan(r.better):
            rows.append([pair, r.experiment, int(r.n), "-", "-", "-", "-"])
            continue
        difference = f"{100 * r.difference:+.1f} [{100 * r.low:+.1f}, {100 * r.high:+.1f}]"
        rows.append([pair, r.experiment, int(r.n), difference, *map(_probability, (r.better, r.equivalent, r.worse))])
    seeds = sorted({int(n) for n in table.loc[table["experiment"] != bz.ACROSS, "n"]})
    if (table["experiment"] == bz.ACROSS).any():
        across = (
            f"Across experiments: baycomp's Bayesian signed-rank test on the {tests.experiments} experiment means "
            f"(Monte Carlo, {bz.NSAMPLES} draws, fixed seed)."
        )
    else:
        across = (
            f"Across experiments: not run; the Bayesian signed-rank test on experiment means needs at least "
            f"{bz.MIN_EXPERIMENTS} experiments and this grid has {tests.grid}."
        )
    lines = [
        "### Bayesian comparison",
        "",
        "Neighbours in the tournament (A = the better-ranked loss), compared with baycomp (Benavoli et al., JMLR "
        f"2017): posterior probabilities that A is practically better than B (mean test {primary} difference "
        f"> {_points(tests.rope)}), practically equivalent (within ± {_points(tests.rope)}, the ROPE, "
        "`report.rope`) or practically worse. Per experiment: Bayesian t-test of the paired differences of its "
        f"n = {', '.join(map(str, seeds))} matched seeds (seed k gives both losses the same initial weights and "
        "batches; independent seeds, so no cross-validation correlation: rho = 0); its Student posterior has "
        "n - 1 degrees of freedom (its 95% credible interval is the t-interval shown), wide with few seeds, and "
        "speaks for that experiment's data split only. "
        f"{across} A probability >= {bz.DECISION:g} is a decision; anything less is undecided.",
        "",
        markdown_table(
            [
                "pair (A vs B)",
                "experiment",
                "n",
                "A - B (points) [95% CI]",
                "P(A better)",
                "P(equivalent)",
                "P(B better)",
            ],
            rows,
            "llrrrrr",
        ),
        "",
        bz.HIERARCHICAL_NOTE,
        "",
    ]
    _figure(lines, figures, "bayesian_comparison", counter)
    return lines


def _bayes_summary(analysis: Analysis) -> str:
    """Per neighbour pair: how many experiments decide A better / equivalent / B better (P >= 0.95)."""
    tests = analysis.tests
    table = tests.bayes.dropna(subset=["better"])
    parts = []
    for (a, b), group in table.groupby(["a", "b"], sort=False):
        names = {
            "better": f"{analysis.names[a]} better",
            "equivalent": "equivalent",
            "worse": f"{analysis.names[b]} better",
            "undecided": "undecided",
        }
        per_experiment = group[group["experiment"] != bz.ACROSS]
        counts = pd.Series([bz.verdict(r.better, r.equivalent, r.worse) for r in per_experiment.itertuples()])
        counts = counts.value_counts()
        text = f"{analysis.names[a]} vs {analysis.names[b]}: " + ", ".join(
            f"{names[v]} in {counts[v]}" for v in ("better", "equivalent", "worse", "undecided") if v in counts
        )
        text += f" of {len(per_experiment)} experiment{'' if len(per_experiment) == 1 else 's'}"
        across = group[group["experiment"] == bz.ACROSS]
        if len(across):
            r = across.iloc[0]
            text += f"; across experiments {names[bz.verdict(r['better'], r['equivalent'], r['worse'])]}"
        parts.append(text)
    seeds = sorted({int(n) for n in table.loc[table["experiment"] != bz.ACROSS, "n"]})
    return (
        f"- **Bayesian comparison** of tournament neighbours (ROPE ± {_points(tests.rope)} of test "
        f"{METRIC_HEADERS.get(analysis.params.report.primary_metric, analysis.params.report.primary_metric)}, "
        f"n = {', '.join(map(str, seeds))} seeds per experiment; a verdict needs P >= {bz.DECISION:g}): "
        + "; ".join(parts)
        + "."
    )


def _papers_section(analysis: Analysis, figures: dict[str, Figure], counter: list[int]) -> list[str]:
    papers = analysis.papers
    literature = lit.top1(papers.literature)
    lines = [
        "## Papers versus reality",
        "",
        "Deep metric learning papers claim large gains over the contrastive and triplet losses; re-run under one "
        "protocol, the gains mostly vanish (Musgrave et al., *A Metric Learning Reality Check*, ECCV 2020; "
        "Psomas, *Metric Learning: A Deep Dive*, 2020). The published numbers come from "
        "`src/dmlbench/analysis/literature.csv`: every row cites its source, and numbers recalled rather than "
        "read from the paper are marked uncertain (hollow markers). A claim is compared with the baseline "
        "number its own paper reports when it has one, else with the median of what papers reported up to that "
        "year.",
        "",
    ]
    rows = []
    for loss in analysis.params.losses:
        for dataset in lit.DATASETS:
            cells = _published_cells(literature, loss, dataset)
            if cells is not None:
                rows.append([analysis.names[loss], lit.DATASET_LABELS.get(dataset, dataset), *cells])
    if rows:
        lines += [
            "Published R@1 (= P@1, %) of the losses in this grid. Claimed: the loss's own paper (backbone-dim; "
            "`?` = not verified; papers give no n and no interval), or for an old loss the range other papers "
            "reported for it as their baseline. Reality Check: BN-Inception, 4-fold "
            "cross-validation models concatenated to 512-d, mean ± 95% CI as published. Thesis: BN-Inception "
            "512-d, one run each.",
            "",
            markdown_table(["loss", "dataset", "claimed", "Reality Check", "thesis"], rows, "llrrr"),
            "",
        ]
    ours_rows = []
    for baseline in BASELINES:
        frame = papers.ours[baseline]
        for r in frame.itertuples():
            interval = r.interval
            ours_rows.append(
                [
                    r.display,
                    f"{r.dataset}/{r.backbone}/{analysis.dim}",
                    baseline,
                    format_signed_interval(
                        interval.estimate, interval.low, interval.high, f"n={interval.n_a} vs {interval.n_b}"
                    ),
                ]
            )
    if ours_rows:
        lines += [
            f"Our runs: relative P@1 improvement over the baselines at dim {analysis.dim} (delta-method "
            f"{int(analysis.params.evaluate.confidence * 100)}% t-interval):",
            "",
            markdown_table(["loss", "cell", "over", "relative improvement"], ours_rows, "lllr"),
            "",
        ]
    else:
        lines += [
            f"> Our relative improvements need contrastive or triplet in the grid; this grid has neither at dim "
            f"{analysis.dim}.",
            "",
        ]
    _figure(lines, figures, "papers_vs_reality", counter)
    _figure(lines, figures, "papers_claims", counter)
    return lines


def _published_cells(literature: pd.DataFrame, loss: str, dataset: str) -> list[str] | None:
    """[claimed, Reality Check, thesis] cells of the papers table; None when nothing is published."""
    rows = literature[(literature["loss"] == loss) & (literature["dataset"] == dataset)]
    claims = rows[rows["kind"] == "claimed"]
    baselines = rows[rows["kind"] == "baseline"]
    rc = rows[(rows["paper"] == lit.REALITY_CHECK) & (rows["setting"] == "rc_concatenated")]
    thesis = rows[
        (rows["paper"] == lit.THESIS)
        & (rows["setting"] == "test_selection")
        & (rows["backbone"] == "bn_inception")
        & (rows["dim"] == 512)
    ]
    if claims.empty and baselines.empty and rc.empty and thesis.empty:
        return None
    claimed = "; ".join(
        f"{c.value:g}{'?' if c.uncertain else ''} ({c.backbone or 'n/s'}-{'' if pd.isna(c.dim) else c.dim})"
        for c in claims.itertuples()
    )
    if not claimed and len(baselines):
        claimed = (
            f"as a baseline: {baselines['value'].min():g}-{baselines['value'].max():g} "
            f"({baselines['paper'].nunique()} papers)"
        )
    return [
        claimed or "-",
        "-" if rc.empty else f"{rc['value'].iloc[0]:.2f} ± {_rc_ci(rc['note'].iloc[0])}",
        "-" if thesis.empty else f"{thesis['value'].iloc[0]:.2f}",
    ]


def _rc_ci(note: str) -> str:
    marker = "95% CI half-width "
    return f"{float(note.split(marker, 1)[1]):.2f}" if marker in note else "?"


def _feedback_section(analysis: Analysis, figures: dict[str, Figure], counter: list[int]) -> list[str]:
    lines = [
        "## Test-set feedback",
        "",
        "Papers without a validation set pick the epoch (and the hyperparameters) by the test score. Here the "
        "epoch is picked on the validation classes; the test score of every epoch is recorded only to measure "
        "how much picking on the test set would have flattered the result.",
        "",
    ]
    _figure(lines, figures, "test_feedback", counter)
    bias = analysis.bias
    if len(bias):
        confidence = analysis.params.evaluate.confidence
        rows = []
        display = analysis.display(bias)
        for name in analysis.order:
            group = display[display["loss"] == name]
            if group.empty:
                continue
            rows.append(
                [
                    name,
                    format_interval(
                        group["selected_value"].mean(), *_bounds(group["selected_value"], confidence), len(group)
                    ),
                    format_interval(group["best_value"].mean(), *_bounds(group["best_value"], confidence), len(group)),
                    format_interval(group["bias"].mean(), *_bounds(group["bias"], confidence), len(group)),
                ]
            )
        metric = METRIC_HEADERS.get(str(bias["metric"].iloc[0]), str(bias["metric"].iloc[0]))
        lines += [
            markdown_table(["loss", f"test {metric} at selected epoch", f"best test {metric}", "gain (points)"], rows),
            "",
        ]
    return lines


def _cost_section(analysis: Analysis, figures: dict[str, Figure], counter: list[int]) -> list[str]:
    costs = analysis.display(analysis.costs)
    confidence = analysis.params.evaluate.confidence
    lines = ["## Cost", ""]
    _figure(lines, figures, "cost", counter)
    rows = []
    for name in analysis.order:
        group = costs[costs["loss"] == name]
        rows.append(
            [
                name,
                format_interval(
                    group["train_seconds"].mean(), *_bounds(group["train_seconds"], confidence), len(group), scale=1
                ),
                format_interval(
                    group["images_per_second"].mean(),
                    *_bounds(group["images_per_second"], confidence),
                    len(group),
                    scale=1,
                    digits=0,
                ),
            ]
        )
    lines += [
        f"Training cost per run ({', '.join(sorted(set(costs['device'])))}; timings on a shared machine are "
        "indicative only):",
        "",
        markdown_table(["loss", "training seconds per run", "images / s"], rows),
        "",
    ]
    return lines


def _limitations_section(analysis: Analysis, figures: dict[str, Figure]) -> list[str]:
    params = analysis.params
    protocol = params.protocol
    lines = ["## Limitations", ""]
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
    tests = analysis.tests
    if tests.skipped is None and tests.friedman.n_blocks < 10:
        lines.append(
            f"- The significance tests rest on {tests.friedman.n_blocks} blocks; with so few, only large "
            "differences can reach significance."
        )
    if tests.blocks == "experiment_seed":
        lines.append(
            "- The Friedman, Nemenyi and sign tests treat the seeds of one experiment as separate blocks; they share "
            "its data, so they are not independent: the p-values are optimistic and say nothing about other datasets."
        )
    if tests.bayes is not None and tests.bayes["better"].notna().any():
        lines.append(
            "- The Bayesian comparison per experiment conditions on that experiment's data split; no model pooling "
            "seeds across experiments (hierarchical) was run."
        )
    if not len(analysis.bias):
        lines.append("- Test-set feedback was not recorded for these runs, so its bias is not measured here.")
    lines += [
        "- Hyperparameters are the published defaults (thesis Table 4), not tuned on the validation split.",
        "- Published numbers marked uncertain in `literature.csv` were recalled or read off a figure; papers' "
        "claims carry no interval, and their backbones, sizes and training recipes differ.",
        "",
    ]
    return lines


# --------------------------------------------------------------------------- stage


def report_stage(params: Params, report_dir: Path | None = None, log_to_mlflow: bool = True) -> Path:
    """Write ``report.md`` and ``figures/`` (replacing the previous ones atomically), then log them to MLflow."""
    report_dir = Path(report_dir or paths.REPORTS)
    results = collect_results(params)
    analysis = analyse(params, results)
    with atomic_dir(report_dir / FIGURES) as tmp:  # the new figures replace the old ones only when all are drawn
        figures = make_figures(analysis, tmp)
        text = render(analysis, figures)
    path = report_dir / REPORT
    with atomic_path(path, suffix=".md") as tmp:
        tmp.write_text(text)
    if log_to_mlflow:
        from dmlbench.tracking.report_run import log_report

        log_report(params, path, report_dir / FIGURES, report_metrics(analysis))
    return path


def report_metrics(analysis: Analysis) -> dict[str, float]:
    """Headline numbers logged on the MLflow report run."""
    metrics: dict[str, float] = {}
    for r in analysis.ranking.itertuples():
        metrics[f"mean_rank/{r.loss}"] = float(r.mean_rank)
    if analysis.tests.skipped is None:
        metrics["friedman/statistic"] = float(analysis.tests.friedman.statistic)
        metrics["friedman/p_value"] = float(analysis.tests.friedman.pvalue)
        metrics["nemenyi/critical_difference"] = float(analysis.tests.cd)
    if len(analysis.bias):
        metrics["test_feedback/mean_gain"] = float(analysis.bias["bias"].mean())
    return {k: v for k, v in metrics.items() if math.isfinite(v)}
