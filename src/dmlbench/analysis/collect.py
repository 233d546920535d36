"""Collect: every output of the current grid the report reads (exactly the grid in ``params.yaml``),
as long DataFrames: test metrics, training histories, run records and dataset summaries.

Wall-clock timings live in each training's run log (``artifacts/runlog/``, not DVC outputs); they
join the history only when every run has one, since a partial set would bias sums and means over
runs (else no timing column and ``Results.timings`` is False).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from dmlbench import paths
from dmlbench.analysis.cross_validation import fold_rows
from dmlbench.errors import DataError
from dmlbench.io import read_json
from dmlbench.params.model import Params
from dmlbench.tracking.runlog import TIMING_KEYS, read_runlog


@dataclass
class Results:
    runs: pd.DataFrame  # dataset, backbone, loss, dim, seed, metric, value
    history: pd.DataFrame  # dataset, backbone, loss, dim, seed, epoch, train/*, val/*, test_feedback/*
    # dataset, backbone, loss, dim, seed, selected_epoch, selection_metric, tf_*, device, precision
    selections: pd.DataFrame
    datasets: dict[str, dict[str, Any]]
    # the untrained trunk ("Pretrained" row): dataset, backbone, weights, dim, metric, mean, low, high, n (queries)
    baselines: pd.DataFrame = field(default_factory=pd.DataFrame)
    # cross-validation cells: each fold model's own test metrics
    # (dataset, backbone, loss, dim, seed, fold, metric, value)
    folds: pd.DataFrame = field(default_factory=pd.DataFrame)
    # whether the history has the wall-clock timing columns (every run's run log was found)
    timings: bool = True
    # per run: what identifies it for pairing and where it was trained (analysis.identity.run_identities)
    identities: pd.DataFrame = field(default_factory=pd.DataFrame)


def collect_results(params: Params) -> Results:
    """Load every output of the current grid; fail naming the first missing file."""
    run_rows, history_rows, selection_rows, fold_metric_rows = [], [], [], []
    timing_rows: list[dict[str, Any]] = []
    logs_missing = 0
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
                runlog = read_runlog(paths.runlog_file(run, fold))
                if runlog is None or runlog.get("config_hash") != info.get("config_hash") or "epochs" not in runlog:
                    logs_missing += 1  # restored from a cache, or the log of another training
                else:
                    timing_rows += [{**cell, "seed": seed, "fold": fold, **entry} for entry in runlog["epochs"]]
                    info["device"] = runlog.get("device", info.get("device"))
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
                        "precision": info.get("precision", "not recorded"),
                    }
                )
    datasets = {}
    for name in params.datasets:
        info_file = paths.prepared_dir(name) / "info.json"
        if not info_file.exists():
            raise DataError(f"{info_file}: missing (run prepare@{name} first)")
        datasets[name] = read_json(info_file)
    history = pd.DataFrame(history_rows)
    in_history = [c for c in TIMING_KEYS if c in history.columns]  # history.json written by older code
    if timing_rows and logs_missing == 0:
        keys = ["dataset", "backbone", "loss", "dim", "seed", "fold", "epoch"]
        history = history.drop(columns=in_history).merge(pd.DataFrame(timing_rows), on=keys, how="left")
        timed = True
    else:
        timed = "train/epoch_seconds" in in_history and bool(history["train/epoch_seconds"].notna().all())
        if not timed:
            history = history.drop(columns=in_history)
    return Results(
        pd.DataFrame(run_rows),
        history,
        pd.DataFrame(selection_rows),
        datasets,
        collect_baselines(params),
        pd.DataFrame(fold_metric_rows),
        timings=timed,
    )


def collect_baselines(params: Params) -> pd.DataFrame:
    """The ``evaluate_pretrained`` results of every dataset x backbone: one evaluation each, with its
    bootstrap interval (``n`` in ``unit``: test classes, or queries for an evaluation written before
    the class bootstrap; ``queries``); a missing one is left out of the report."""
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
                    n = int(bounds.get("n", info.get("num_queries", 1)))
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
                            "n": n,
                            # a class-cluster interval records its queries; an older query bootstrap's n were queries
                            "unit": "classes" if "queries" in bounds else "queries",
                            "queries": int(bounds.get("queries", n)),
                        }
                    )
    return pd.DataFrame(rows)


PER_QUERY = "per_query.npz"  # the evaluate stages' per-query values (dmlbench.evaluate.stage)


def per_query_scores(evaluation_dir: Path, run: str, metric: str) -> tuple[np.ndarray, np.ndarray] | None:
    """(query rows, per-query ``metric``) of one run (``seed<k>`` or ``pretrained``) of an evaluation
    directory's ``per_query.npz``; None when the file, the run or the metric is missing."""
    file = Path(evaluation_dir) / PER_QUERY
    if not file.exists():
        return None
    with np.load(file) as stored:
        index, values = f"{run}/query_index", f"{run}/{metric}"
        if index not in stored.files or values not in stored.files:
            return None
        return stored[index], stored[values]


def per_query_labels(evaluation_dir: Path, run: str) -> np.ndarray | None:
    """The class label of each query of one run (same order as :func:`per_query_scores`), the unit
    that interval bootstraps resample; None where the file predates the labels (re-run its evaluate
    stage) or the run is missing."""
    file = Path(evaluation_dir) / PER_QUERY
    if not file.exists():
        return None
    with np.load(file) as stored:
        key = f"{run}/query_label"
        return stored[key] if key in stored.files else None
