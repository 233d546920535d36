"""Collect: every output of the current grid the report reads, as long DataFrames.

Reads exactly the grid in ``params.yaml`` (stale outputs of cells removed from the grid are ignored):
per-run test metrics (``artifacts/evaluation``), training histories and run records
(``artifacts/models``) and dataset summaries (``artifacts/prepared``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import pandas as pd

from dmlbench import paths
from dmlbench.analysis.cross_validation import fold_rows
from dmlbench.config import Params
from dmlbench.errors import DataError
from dmlbench.io import read_json


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
