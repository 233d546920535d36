"""``python -m dmlbench.tracking.pulled``: pulled runs made visible in this workspace's MLflow store.

A ``dvc pull`` brings outputs but no MLflow run: each pulled run the store lacks becomes one FINISHED
run tagged ``source = pulled``, ``original_run = <grid_key>@<config_hash>``, ``kind = pulled_train``
(idempotent on ``original_run``). The report stage calls :func:`import_pulled`.
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Iterable
from typing import Any

import yaml

from dmlbench import paths
from dmlbench.grid import RunSpec
from dmlbench.io import read_json
from dmlbench.params.model import Params, flatten
from dmlbench.tracking.runlog import read_runlog
from dmlbench.tracking.runs import find_runs, training_run_name
from dmlbench.tracking.store import client as make_client
from dmlbench.tracking.store import ensure_experiment
from dmlbench.tracking.workspace import PULLED, default_remote, provenance, workspace_id

MLFLOW_METRICS, MLFLOW_PARAMS = 1000, 100  # per log_batch call (MLflow's limits)


def pulled_runs(params: Params) -> list[RunSpec]:
    """The runs of the grid whose outputs are here but were not trained in this workspace."""
    here, found = workspace_id(), []
    for run in params.runs():
        fold = paths.folds_in(paths.model_dir(run))[0]
        info_file = paths.model_dir(run, fold) / "run.json"
        if not info_file.exists():
            continue
        info = read_json(info_file)
        if provenance(read_runlog(paths.runlog_file(run, fold)), info.get("config_hash"), here) == PULLED:
            found.append(run)
    return found


def pulled_record(run: RunSpec, protocol: str, origin: str) -> dict[str, Any]:
    """Tags, params, per-epoch metrics and test metrics of one pulled run, from its DVC outputs."""
    fold = paths.folds_in(paths.model_dir(run))[0]
    model = paths.model_dir(run, fold)
    info = read_json(model / "run.json")
    config_file, history_file = model / "config.yaml", model / "history.json"
    resolved = yaml.safe_load(config_file.read_text()) if config_file.exists() else {}
    history = read_json(history_file) if history_file.exists() else []
    runs_file = paths.evaluation_dir(run.combo) / "runs.json"
    evaluated = read_json(runs_file)["runs"].get(f"seed{run.seed}", {}) if runs_file.exists() else {}
    config_hash = str(info.get("config_hash", "unknown"))
    tags = {
        "source": PULLED,
        "original_run": f"{run.grid_key}@{config_hash}",
        "kind": "pulled_train",
        "dataset": run.dataset,
        "backbone": run.backbone,
        "loss": run.loss,
        "dim": str(run.dim),
        "seed": str(run.seed),
        "protocol": str((resolved.get("protocol") or {}).get("name", protocol)),
        "grid_key": run.grid_key,
        "config_hash": config_hash,
        "code": str(info.get("code", "unknown")),
        "device": str(info.get("device", "unknown")),
        "precision": str(info.get("precision", "unknown")),
        "origin": origin,
    }
    return {
        "name": f"{training_run_name(run)} (pulled)",
        "tags": tags,
        "params": {key: str(value)[:6000] for key, value in flatten(resolved).items()},
        "history": history,
        "test": {f"test/{k}": float(v) for k, v in evaluated.get("metrics", {}).items()},
    }


def import_pulled(params: Params, runs: Iterable[RunSpec] | None = None, mlflow_client: Any | None = None) -> int:
    """Import each pulled run (default: :func:`pulled_runs`) the store lacks; how many (0 on a second call)."""
    from mlflow.entities import Metric, Param

    runs = pulled_runs(params) if runs is None else list(runs)
    if not runs:
        return 0
    mlflow_client = mlflow_client or make_client()
    experiment_id = ensure_experiment(params.tracking.experiment, mlflow_client)
    remote = default_remote()
    origin = f"DVC remote {remote}" if remote else "DVC cache"
    imported = 0
    for run in runs:
        record = pulled_record(run, params.protocol_name, origin)
        if find_runs(mlflow_client, experiment_id, {"source": PULLED, "original_run": record["tags"]["original_run"]}):
            continue
        created = mlflow_client.create_run(experiment_id, tags=record["tags"], run_name=record["name"])
        run_id, stamp = created.info.run_id, int(time.time() * 1000)
        metrics = [
            Metric(key, float(value), stamp, int(entry["epoch"]))
            for entry in record["history"]
            for key, value in entry.items()
            if key != "epoch" and isinstance(value, int | float) and not isinstance(value, bool)
        ]
        metrics += [Metric(key, value, stamp, 0) for key, value in record["test"].items()]
        params_list = [Param(key, value) for key, value in record["params"].items()]
        for start in range(0, len(params_list), MLFLOW_PARAMS):
            mlflow_client.log_batch(run_id, params=params_list[start : start + MLFLOW_PARAMS])
        for start in range(0, len(metrics), MLFLOW_METRICS):
            mlflow_client.log_batch(run_id, metrics=metrics[start : start + MLFLOW_METRICS])
        mlflow_client.set_terminated(run_id, "FINISHED")
        imported += 1
    return imported


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--params", default="params.yaml", help="the grid whose pulled runs to import")
    args = parser.parse_args(argv)
    from dmlbench.params.load import load_params

    params = load_params(args.params)
    found = pulled_runs(params)
    imported = import_pulled(params, found)
    print(f"tracking: {imported} pulled run(s) imported, {len(found) - imported} already in the store")
    return 0


if __name__ == "__main__":
    sys.exit(main())
