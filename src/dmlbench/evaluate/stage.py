"""The ``evaluate@<dataset>-<backbone>-<loss>-<dim>`` and ``evaluate_pretrained@<dataset>-<backbone>`` stages.

For every run (seed) of a grid cell, exact metrics on the test classes (self-retrieval, or query
against gallery for In-Shop), and a bootstrap interval over its test classes (n = classes).

Outputs (the report and the results index read them: keys may be added, never renamed):

* ``artifacts/evaluation/<combo>/runs.json`` = {"combo", "runs": {"seed<k>": {"seed", "metrics",
  "num_queries", "grid_key", "config_hash", "embeddings", "embeddings_md5", "mode", "bootstrap"}}} and
  ``per_query.npz`` (``seed<k>/<metric>``, ``seed<k>/query_index``, ``seed<k>/query_label``);
* ``artifacts/metrics/<combo>.json`` = {"n_runs", "confidence", "test": {metric: {mean, low,
  high, n, interval}}, ...}: the t-interval over seeds (n = seeds), or for a single run the
  class-cluster bootstrap (n = test classes); no interval -> null bounds. Cross-validation cells
  add ``test_separated`` and ``test_folds`` ({metric: {mean, std, n}}, the thesis's Table 12 form).

No output holds an MLflow run id: runs are found by tags ``grid_key`` + ``config_hash``. What
goes to MLflow (per run, per cell): docs/evaluation.md and docs/tracking.md. Spooled tracking
records are sent first, so that the runs exist when looked up."""

from __future__ import annotations

import math
import sys
from pathlib import Path
from typing import Any

import numpy as np

from dmlbench import paths
from dmlbench.errors import DataError
from dmlbench.evaluate import intervals as interval_stats
from dmlbench.evaluate.clustering import clustering_metrics
from dmlbench.evaluate.combine import concatenate_embeddings, fold_spread
from dmlbench.evaluate.embed import DIVERGED, EMBEDDINGS, META, UNTRAINED, require_finite
from dmlbench.evaluate.intervals import Interval, bounded_t_interval, interval_method
from dmlbench.evaluate.metrics import PerQuery, metric_range, per_query_metrics
from dmlbench.grid import Combo
from dmlbench.io import atomic_dir, md5_file, read_json, write_json
from dmlbench.params.model import Params
from dmlbench.params.sections import EvaluateConfig
from dmlbench.tracking.cells import cell_run_name, cell_tags
from dmlbench.tracking.replay import replay_spools
from dmlbench.tracking.summary import log_summary_run


def evaluate_arrays(
    arrays: Any, dataset: str, settings: EvaluateConfig, query_gallery: bool | None = None
) -> tuple[dict[str, float], PerQuery, str]:
    """Metrics, per-query values and the mode ("test" or "query->gallery") of one embeddings file."""
    has_query_gallery = "query_embeddings" in arrays and "gallery_embeddings" in arrays
    if query_gallery is None:
        query_gallery = has_query_gallery
    if query_gallery and not has_query_gallery:
        raise DataError(f"{dataset} is a query/gallery dataset but the embeddings have no query and gallery splits")
    if not query_gallery and "test_embeddings" not in arrays:
        raise DataError(f"{dataset}: the embeddings have no test split")
    split = "query" if query_gallery else "test"
    queries, labels = arrays[f"{split}_embeddings"], arrays[f"{split}_labels"]
    gallery, gallery_labels = (
        (arrays["gallery_embeddings"], arrays["gallery_labels"]) if query_gallery else (None, None)
    )
    recall_ks = settings.recall_ks(dataset)
    values = per_query_metrics(
        queries, labels, gallery, gallery_labels, recall_ks, backend=settings.backend, progress=True
    )
    mode = "query->gallery" if query_gallery else "test"
    metrics = values.means()
    if settings.clustering_for(dataset):
        # every k-means backend re-does faiss's iterations (same clusters); a torch ranking keeps
        # the automatic k-means choice (torch on CUDA, the fastest certified path on a CPU)
        kmeans_backend = settings.backend if settings.backend in ("faiss", "screened") else "auto"
        metrics.update(clustering_metrics(queries, labels, niter=settings.kmeans_niter, backend=kmeans_backend))
    return metrics, values, mode


def bootstrap_intervals(values: PerQuery, settings: EvaluateConfig) -> dict[str, dict[str, Any]]:
    """Class-cluster bootstrap interval of every per-query metric of one run (the test classes
    resampled, one set of resamples for all metrics: a paired bootstrap); ``n`` = test classes,
    ``queries`` = the queries they hold."""
    boot = settings.bootstrap
    found = interval_stats.bootstrap_intervals(
        values.metrics, settings.confidence, boot.resamples, boot.method, boot.seed, clusters=values.query_label
    )
    return {
        name: _interval_dict(interval, f"class-bootstrap-{boot.method}") | {"queries": len(values)}
        for name, interval in found.items()
    }


def _finite_or_none(x: float) -> float | None:
    return None if x is None or math.isnan(x) else float(x)


def _interval_dict(interval: Interval, kind: str) -> dict[str, Any]:
    bounded = not (math.isnan(interval.low) or math.isnan(interval.high))
    return {
        "mean": interval.mean,
        "low": _finite_or_none(interval.low),
        "high": _finite_or_none(interval.high),
        "n": interval.n,
        "interval": kind if bounded else "none",
    }


def evaluate_run(
    directory: Path, dataset: str, settings: EvaluateConfig, query_gallery: bool | None, remedy: str = DIVERGED
) -> dict:
    """Evaluate one embeddings directory: the run's entry of runs.json plus its per-query values.
    Embeddings that are not finite stop it in one line naming the run, the split and ``remedy``."""
    file = directory / EMBEDDINGS
    if not file.exists():
        raise DataError(f"{file}: missing (run its train stage first: it writes the embeddings)")
    meta = read_json(directory / META)
    with np.load(file) as stored:
        arrays = {key: stored[key] for key in stored.files}
    who = str(meta.get("run", directory.as_posix())) + ("" if meta.get("fold") is None else f" fold {meta['fold']}")
    for key, embeddings in arrays.items():
        if key.endswith("_embeddings"):
            require_finite(embeddings, who, key.removesuffix("_embeddings"), f"{remedy} ({file})")
    metrics, values, mode = evaluate_arrays(arrays, dataset, settings, query_gallery)
    return {
        "metrics": metrics,
        "num_queries": len(values),
        "grid_key": meta.get("grid_key"),
        "config_hash": meta.get("config_hash"),
        "embeddings": file.as_posix(),
        "embeddings_md5": md5_file(file),
        "mode": mode,
        "recall_at": list(settings.recall_ks(dataset)),
        "bootstrap": bootstrap_intervals(values, settings),
        "_values": values,
    }


def evaluate_cv_run(directory: Path, dataset: str, settings: EvaluateConfig, query_gallery: bool | None) -> dict:
    """Evaluate the fold models of one cross-validation run (``directory/fold<f>/``), as the
    Reality Check does: the headline ``metrics`` are those of the **concatenated** embedding
    (each fold model's embedding L2-normalised, concatenated, normalised again);
    ``metrics_separated`` is the mean of the fold models' own metrics (``folds``)."""
    folds = [f for f in paths.folds_in(directory) if f is not None]
    fold_runs = {f"fold{f}": evaluate_run(directory / f"fold{f}", dataset, settings, query_gallery) for f in folds}
    loaded = [np.load(directory / f"fold{f}" / EMBEDDINGS) for f in folds]
    try:
        splits = {key[: -len("_embeddings")] for key in loaded[0].files if key.endswith("_embeddings")}
        arrays: dict[str, np.ndarray] = {}
        for split in splits:
            arrays[f"{split}_embeddings"] = concatenate_embeddings([fold[f"{split}_embeddings"] for fold in loaded])
            arrays[f"{split}_labels"] = loaded[0][f"{split}_labels"]
    finally:
        for fold in loaded:
            fold.close()
    metrics, values, mode = evaluate_arrays(arrays, dataset, settings, query_gallery)
    separated = {name: float(np.mean([r["metrics"][name] for r in fold_runs.values()])) for name in metrics}
    return {
        "metrics": metrics,
        "metrics_separated": separated,
        "folds": {key: info["metrics"] for key, info in fold_runs.items()},
        "num_folds": len(folds),
        "num_queries": len(values),
        "grid_key": _seed_key(next(iter(fold_runs.values()))["grid_key"]),
        "config_hash": next(iter(fold_runs.values()))["config_hash"],
        "embeddings": directory.as_posix(),
        "embeddings_md5": {key: info["embeddings_md5"] for key, info in fold_runs.items()},
        "mode": mode,
        "recall_at": list(settings.recall_ks(dataset)),
        "bootstrap": bootstrap_intervals(values, settings),
        "_values": values,
        "_fold_runs": fold_runs,
    }


def _seed_interval(values: list[float], metric: str, confidence: float) -> dict[str, Any]:
    """Mean and t-interval over runs clipped to the metric's range (``t``, ``t-clipped`` where a bound
    cut it, ``none`` for one run): :func:`~dmlbench.evaluate.intervals.bounded_t_interval`."""
    lower, upper = metric_range(metric)
    label = interval_method(values, lower, upper)
    return _interval_dict(bounded_t_interval(values, confidence, lower, upper), label)


def summarize_runs(runs: dict[str, dict], settings: EvaluateConfig) -> dict[str, Any]:
    """The cell's summary (``artifacts/metrics/<combo>.json``, module docstring): the t-interval over runs
    (clipped to the metric's range), or the class-cluster bootstrap interval of a single run.
    Cross-validation runs add ``test_separated`` (t-interval of the fold-averaged metrics)."""
    first = next(iter(runs.values()))
    test = {}
    for name in first["metrics"]:
        if len(runs) == 1:
            single = first["bootstrap"].get(name)
            test[name] = single or _interval_dict(Interval(first["metrics"][name], math.nan, math.nan, 1, 0), "none")
        else:
            test[name] = _seed_interval([r["metrics"][name] for r in runs.values()], name, settings.confidence)
    summary = {
        "n_runs": len(runs),
        "confidence": settings.confidence,
        "test": test,
        "num_queries": first["num_queries"],
        "mode": first["mode"],
    }
    if "metrics_separated" in first:
        summary["cross_validation"] = {
            "folds": first["num_folds"],
            "test": "concatenated",
            "test_separated": "mean over folds",
        }
        summary["test_separated"] = {
            name: _seed_interval([r["metrics_separated"][name] for r in runs.values()], name, settings.confidence)
            for name in first["metrics_separated"]
        }
        # the thesis's way (Table 12): mean +/- sample std of the fold models (of every seed)
        folds = [fold for r in runs.values() for fold in r["folds"].values()]
        summary["test_folds"] = {
            name: {k: _finite_or_none(v) if k == "std" else v for k, v in entry.items()}
            for name, entry in fold_spread(folds).items()
        }
    return summary


def _write_outputs(evaluation_dir: Path, metrics_file: Path, key: str, runs: dict, summary: dict) -> None:
    per_query = {f"{run}/{name}": v for run, info in runs.items() for name, v in info.pop("_values").arrays().items()}
    for info in runs.values():
        info.pop("_fold_runs", None)
    with atomic_dir(evaluation_dir) as tmp:
        write_json(tmp / "runs.json", {"combo": key, "runs": runs})
        np.savez_compressed(tmp / "per_query.npz", **per_query)
    write_json(metrics_file, summary)


def _is_query_gallery(dataset: str) -> bool:
    from dmlbench.data import DATASETS

    return bool(getattr(DATASETS[dataset], "query_gallery", False))


def evaluate_stage(params: Params, combo: Combo) -> dict[str, Any]:
    params.check_run(combo)
    settings = params.evaluate
    query_gallery = _is_query_gallery(combo.dataset)
    for seed in params.seeds:  # fail before any work if an input is missing
        directory = paths.embedding_dir(combo.with_seed(seed))
        for fold in paths.folds_in(directory):
            file = paths.embedding_dir(combo.with_seed(seed), fold) / EMBEDDINGS
            if not file.exists():
                raise DataError(
                    f"{file}: missing (run the {combo.with_seed(seed).stage} stage first: it writes the embeddings)"
                )
    runs: dict[str, Any] = {}
    trained: list[dict[str, Any]] = []  # what gets test metrics in MLflow: each seed's run, each fold model's
    for seed in params.seeds:
        directory = paths.embedding_dir(combo.with_seed(seed))
        if paths.folds_in(directory) == [None]:
            info = evaluate_run(directory, combo.dataset, settings, query_gallery)
        else:
            info = evaluate_cv_run(directory, combo.dataset, settings, query_gallery)
            trained += info["_fold_runs"].values()
        trained.append(info)
        runs[f"seed{seed}"] = {"seed": seed, **info}
    summary = summarize_runs(runs, settings)
    experiment = params.tracking.experiment
    # records its trainings left in their spools (the store was down when they ended) go first
    replay_spools([paths.spool_dir(combo.with_seed(seed)) for seed in params.seeds])
    seed_runs = _log_test_metrics(trained, experiment)
    _write_outputs(paths.evaluation_dir(combo), paths.metrics_file(combo), combo.key, runs, summary)
    log_summary_run(
        experiment,
        params.protocol_name,
        combo.key,
        cell_tags(combo),
        summary,
        stage=combo.stage,
        name=cell_run_name(combo.loss_level, combo.dim),
        children=seed_runs,
        metrics_file=paths.metrics_file(combo),
    )
    return summary


TRUNK_PARAMS = ("weights", "pooling", "dim", "model_md5")  # of the embedding's meta.json: the trunk's cell params


def evaluate_pretrained_stage(params: Params, dataset: str, backbone: str) -> dict[str, Any]:
    """The untrained-trunk baseline: one run, so its interval is the class-cluster bootstrap."""
    params.check_listed(dataset, backbone)
    settings = params.evaluate
    info = evaluate_run(
        paths.pretrained_embedding_dir(dataset, backbone), dataset, settings, _is_query_gallery(dataset), UNTRAINED
    )
    runs = {paths.PRETRAINED: {"seed": None, **info}}
    summary = summarize_runs(runs, settings)
    key = f"{paths.pretrained_key(dataset, backbone)}-{paths.PRETRAINED}"
    _write_outputs(
        paths.pretrained_evaluation_dir(dataset, backbone),
        paths.pretrained_metrics_file(dataset, backbone),
        key,
        runs,
        summary,
    )
    meta = read_json(paths.pretrained_embedding_dir(dataset, backbone) / META)
    dim = meta["dim"]
    log_summary_run(
        params.tracking.experiment,
        params.protocol_name,
        key,
        {"dataset": dataset, "backbone": backbone, "loss": paths.PRETRAINED, "dim": str(dim)},
        summary,
        stage=f"evaluate_pretrained@{paths.pretrained_key(dataset, backbone)}",
        name=cell_run_name(paths.PRETRAINED, dim),
        metrics_file=paths.pretrained_metrics_file(dataset, backbone),
        # what the embedding stage recorded of the trunk: the cell's params, like a trained cell's
        params={"dataset": dataset, "backbone": backbone, **{k: meta[k] for k in TRUNK_PARAMS}},
    )
    return summary


def _seed_key(fold_key: str) -> str:
    """``.../seed0/fold1`` -> ``.../seed0``: a fold model's seed run."""
    return fold_key.rsplit("/", 1)[0]


def _log_test_metrics(runs: list[dict[str, Any]], experiment: str) -> list[Any]:
    """Attach ``test/*`` metrics, bootstrap bounds and the embeddings reference to each training
    run, found by its identity (``grid_key`` + ``config_hash``); return the seeds' runs found
    (fold models' runs excluded)."""
    from dmlbench.tracking.runs import TrackedRun, find_training_run
    from dmlbench.tracking.store import client as make_client

    mlflow_client = make_client()
    seed_runs = []
    for info in runs:
        found = None
        if info.get("grid_key") and info.get("config_hash"):
            found = find_training_run(info["grid_key"], info["config_hash"], experiment, mlflow_client)
        if found is None:
            print(f"warning: no MLflow run of {info.get('grid_key')}; test metrics not logged", file=sys.stderr)
            continue
        if "fold" not in found.data.tags:
            seed_runs.append(found)
        tracked = TrackedRun(found.info.run_id, mlflow_client)
        metrics = {f"test/{name}": value for name, value in info["metrics"].items()}
        for name, interval in info["bootstrap"].items():
            metrics[f"test/{name}/ci_low"] = interval["low"]
            metrics[f"test/{name}/ci_high"] = interval["high"]
        metrics["test/num_queries"] = info["num_queries"]
        tracked.log_metrics({k: v for k, v in metrics.items() if v is not None})
        if isinstance(info["embeddings_md5"], str):
            tracked.log_file_reference("embeddings", info["embeddings"], info["embeddings_md5"])
    return seed_runs
