"""One MLflow run per training run, found again by its identity instead of duplicated.

Identity = tags ``grid_key`` (``glyphs/tiny_cnn/contrastive/64/seed0``) + ``config_hash``
(hash of every resolved hyperparameter). An interrupted run is resumed (same run id, only
new epochs logged); when DVC re-executes a finished training (code or data changed), the
earlier run of the same identity is tagged ``superseded_by`` and moved to MLflow's trash,
so the active view holds exactly one run per training. Checkpoints and embeddings stay in
the DVC cache and are referenced by path and md5 tags.
"""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any, Mapping

from dmlbench.config import RunSpec, flatten
from dmlbench.tracking.store import client as make_client
from dmlbench.tracking.store import ensure_experiment, git_state


def _now_ms() -> int:
    return int(time.time() * 1000)


class TrackedRun:
    """Thin wrapper over ``MlflowClient`` calls for one run id."""

    def __init__(self, run_id: str, mlflow_client: Any | None = None):
        self.run_id = run_id
        self.client = mlflow_client or make_client()

    def log_metrics(self, metrics: Mapping[str, float], step: int | None = None) -> None:
        from mlflow.entities import Metric

        timestamp = _now_ms()
        batch = [Metric(key, float(value), timestamp, step or 0) for key, value in metrics.items()]
        if batch:
            self.client.log_batch(self.run_id, metrics=batch)

    def set_tags(self, tags: Mapping[str, Any]) -> None:
        from mlflow.entities import RunTag

        self.client.log_batch(self.run_id, tags=[RunTag(k, str(v)) for k, v in tags.items()])

    def log_artifact(self, path: str | Path, artifact_path: str | None = None) -> None:
        self.client.log_artifact(self.run_id, str(path), artifact_path)

    def log_file_reference(self, name: str, path: str | Path, md5: str) -> None:
        """Record a DVC-tracked file by path and md5 instead of copying it into MLflow."""
        self.set_tags({f"artifact.{name}.path": Path(path).as_posix(), f"artifact.{name}.md5": md5})

    def logged_steps(self, key: str) -> set[int]:
        """Steps at which ``key`` was already logged (MLflow metric history is append-only)."""
        return {m.step for m in self.client.get_metric_history(self.run_id, key)}

    def start_system_metrics(self) -> Any:
        """MLflow's ``SystemMetricsMonitor`` for this run (``system/*``: CPU, memory, disk, network,
        GPU with ``nvidia-ml-py``); continues the step count of a resumed run. Stop it with
        ``.finish()`` before the run ends. Interval: ``$MLFLOW_SYSTEM_METRICS_SAMPLING_INTERVAL``
        seconds (default 10)."""
        from mlflow.system_metrics.system_metrics_monitor import SystemMetricsMonitor

        from dmlbench.tracking.store import tracking_uri

        monitor = SystemMetricsMonitor(self.run_id, resume_logging=True, tracking_uri=tracking_uri())
        monitor.start()
        return monitor

    def finish(self, status: str = "FINISHED") -> None:
        self.client.set_terminated(self.run_id, status=status, end_time=_now_ms())

    @property
    def status(self) -> str:
        return self.client.get_run(self.run_id).info.status


def run_tags(run: RunSpec, config_hash: str, protocol: str, fold: int | None = None) -> dict[str, str]:
    commit, dirty = git_state()
    tags = {
        "kind": "train",
        "dataset": run.dataset,
        "backbone": run.backbone,
        "loss": run.loss,
        "dim": str(run.dim),
        "seed": str(run.seed),
        "protocol": protocol,
        "grid_key": run.grid_key,
        "config_hash": config_hash,
        "git_commit": commit,
        "git_dirty": str(dirty).lower(),
        "mlflow.source.git.commit": commit,
        "dvc_stage": os.environ.get("DVC_STAGE", f"train@{run.key}"),
    }
    if fold is not None:
        tags.update(fold=str(fold), grid_key=f"{run.grid_key}/fold{fold}")
    return tags


def start_training_run(
    run: RunSpec,
    resolved: Mapping[str, Any],
    config_hash: str,
    experiment: str,
    resume_run_id: str | None = None,
    fold: int | None = None,
) -> TrackedRun:
    """Resume ``resume_run_id`` if it is still active, else create the run and log its params.

    ``fold``: one fold model of a cross-validation run (each fold model is a training of its own:
    grid key ``.../seed0/fold1``, tag ``fold``, run name ``<key>-fold1``).
    """
    from mlflow.entities import Param, ViewType

    mlflow_client = make_client()
    experiment_id = ensure_experiment(experiment, mlflow_client)
    if resume_run_id:
        try:
            existing = mlflow_client.get_run(resume_run_id)
        except Exception:
            existing = None
        if existing is not None and existing.info.lifecycle_stage == "active":
            mlflow_client.update_run(resume_run_id, status="RUNNING")
            tracked = TrackedRun(resume_run_id, mlflow_client)
            tracked.set_tags({"resumed": "true", "dvc_stage": os.environ.get("DVC_STAGE", f"train@{run.key}")})
            return tracked

    tags = run_tags(run, config_hash, resolved["protocol"]["name"], fold)
    previous = mlflow_client.search_runs(
        [experiment_id],
        filter_string=f"tags.grid_key = '{tags['grid_key']}' and tags.config_hash = '{config_hash}'",
        run_view_type=ViewType.ACTIVE_ONLY,
    )
    run_name = run.key if fold is None else f"{run.key}-fold{fold}"
    created = mlflow_client.create_run(experiment_id, run_name=run_name, tags=tags)
    run_id = created.info.run_id
    params = [Param(key, str(value)) for key, value in flatten(resolved).items()]
    mlflow_client.log_batch(run_id, params=params)
    for old in previous:
        mlflow_client.set_tag(old.info.run_id, "superseded_by", run_id)
        mlflow_client.delete_run(old.info.run_id)
    return TrackedRun(run_id, mlflow_client)
