"""One MLflow run per training run, found again by its identity instead of duplicated.

Identity = tags ``grid_key`` + ``config_hash`` (no run id in a DVC output: :func:`find_training_run`).
A resumed training continues its unfinished run, a fresh one supersedes earlier ones; runs nest cell
-> seeds -> folds; a failed run carries :func:`failure_tags`. Details: docs/tracking.md.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Protocol

from dmlbench.errors import TrainingDiverged
from dmlbench.grid import RunSpec
from dmlbench.params.model import flatten
from dmlbench.tracking.store import client as make_client
from dmlbench.tracking.store import ensure_experiment, git_state, store_lock, supersede

FAILURE_TAG_CHARS = 5000  # MLflow keeps tag values up to 8000 characters


def _now_ms() -> int:
    return int(time.time() * 1000)


def failure_tags(exc: BaseException) -> dict[str, str]:
    """Tags naming why a run failed: ``failure``, ``failure_cause`` (and ``diverged``)."""
    tags = {"failure": f"{type(exc).__name__}: {exc}"[:FAILURE_TAG_CHARS], "failure_cause": type(exc).__name__}
    if isinstance(exc, TrainingDiverged):
        tags.update(failure_cause="diverged", diverged=exc.cause)
    return tags


def start_system_metrics(run_id: str) -> Any:
    """MLflow's ``SystemMetricsMonitor`` for ``run_id``, started, continuing a resumed run's steps;
    stop it with ``.finish()``. Interval: ``$MLFLOW_SYSTEM_METRICS_SAMPLING_INTERVAL`` s (default 10)."""
    from mlflow.system_metrics.system_metrics_monitor import SystemMetricsMonitor

    from dmlbench.tracking.store import tracking_uri

    monitor = SystemMetricsMonitor(run_id, resume_logging=True, tracking_uri=tracking_uri())
    monitor.start()
    return monitor


class RunWriter(Protocol):
    """What ends a run: a :class:`TrackedRun` or a spooled run (:mod:`dmlbench.tracking.spooled`);
    ``fail`` and ``log_file_reference`` written once over its ``set_tags`` and ``finish``."""

    def set_tags(self, tags: Mapping[str, Any]) -> None: ...
    def finish(self, status: str = "FINISHED") -> None: ...

    def log_file_reference(self, name: str, path: str | Path, md5: str) -> None:
        """Record a DVC-tracked file by path and md5 instead of copying it into MLflow."""
        self.set_tags({f"artifact.{name}.path": Path(path).as_posix(), f"artifact.{name}.md5": md5})

    def fail(self, exc: BaseException) -> None:
        """End the run FAILED, tagged with why (:func:`failure_tags`)."""
        self.set_tags(failure_tags(exc))
        self.finish("FAILED")


class TrackedRun(RunWriter):
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

    def start_system_metrics(self) -> Any:
        """MLflow's system metrics monitor for this run (:func:`start_system_metrics`)."""
        return start_system_metrics(self.run_id)

    def log_dataset(self, name: str, digest: str, source: str, profile: Mapping[str, Any], context: str) -> None:
        """Record the dataset as an MLflow input of the run (``MlflowClient.log_inputs``, de-duplicated by
        (name, digest)): ``source`` a local path, ``profile`` e.g. split sizes."""
        from mlflow.entities import Dataset, DatasetInput, InputTag
        from mlflow.utils.mlflow_tags import MLFLOW_DATASET_CONTEXT

        dataset = Dataset(
            name=name,
            digest=digest,
            source_type="local",
            source=json.dumps({"uri": source}),
            profile=json.dumps(dict(profile), sort_keys=True),
        )
        # MLflow gets-or-creates the dataset row (unique per experiment, name and digest) without a
        # lock: two trainings logging one dataset for the first time at once would collide
        with store_lock():
            self.client.log_inputs(self.run_id, [DatasetInput(dataset, [InputTag(MLFLOW_DATASET_CONTEXT, context)])])

    def finish(self, status: str = "FINISHED") -> None:
        self.client.set_terminated(self.run_id, status=status, end_time=_now_ms())

    @property
    def status(self) -> str:
        return self.client.get_run(self.run_id).info.status


PARENT_TAG = "mlflow.parentRunId"
UNFINISHED = ("RUNNING", "SCHEDULED", "FAILED", "KILLED")


def training_run_name(run: RunSpec, fold: int | None = None) -> str:
    """``contrastive d32 s0`` (``... f1`` for a fold model): what differs between a cell's runs
    leads; dataset and backbone are tags and are in the cell run's name (their parent)."""
    return f"{run.combo.loss_level} d{run.dim} s{run.seed}" + ("" if fold is None else f" f{fold}")


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
        "dvc_stage": os.environ.get("DVC_STAGE", run.stage),
    }
    if run.variant:
        tags["variant"] = run.variant  # a baseline run (tuning.baselines), not a cell of the grid
    if fold is not None:
        tags.update(fold=str(fold), grid_key=f"{run.grid_key}/fold{fold}")
    return tags


def find_runs(mlflow_client: Any, experiment_id: str, tags: Mapping[str, str]) -> list[Any]:
    """Active runs with these exact tags (keys with dots in backticks), newest first."""
    from mlflow.entities import ViewType

    return mlflow_client.search_runs(
        [experiment_id],
        filter_string=" and ".join(f"tags.`{key}` = '{value}'" for key, value in tags.items()),
        run_view_type=ViewType.ACTIVE_ONLY,
        order_by=["attributes.start_time DESC"],
    )


def find_training_run(grid_key: str, config_hash: str, experiment: str, mlflow_client: Any | None = None) -> Any | None:
    """The active training run of this identity (newest first), or None: how the embed and
    evaluate stages reach a run without a run id in any DVC output."""
    mlflow_client = mlflow_client or make_client()
    experiment_id = ensure_experiment(experiment, mlflow_client)
    found = find_runs(mlflow_client, experiment_id, {"kind": "train", "grid_key": grid_key, "config_hash": config_hash})
    return found[0] if found else None


SPOOL_KEY_TAG = "spool_key"  # the spool record that created the run (:mod:`dmlbench.tracking.spool`)


def training_run_request(
    run: RunSpec,
    resolved: Mapping[str, Any],
    config_hash: str,
    experiment: str,
    resume: bool = False,
    fold: int | None = None,
    code: str | None = None,
) -> dict[str, Any]:
    """What opening a training's run sends (a spool record): tags, name and params computed in the
    training's process, and how to open it (:func:`open_training_run`)."""
    tags = run_tags(run, config_hash, resolved["protocol"]["name"], fold)
    if code is not None:
        tags["code"] = code
    return {
        "experiment": experiment,
        "tags": tags,
        "name": training_run_name(run, fold),
        "params": {key: str(value) for key, value in flatten(resolved).items()},
        "resume": resume,
        "code": code,
    }


def open_training_run(
    mlflow_client: Any, request: Mapping[str, Any], parent_run_id: str | None = None, key: str | None = None
) -> str:
    """Open the run of ``request``; its id. ``resume``: the newest unfinished run of this identity and
    code, set RUNNING; else a new run, superseding earlier ones. ``key``: the spool record's key; a run
    already tagged with it is returned (a replayed request creates no second run)."""
    from mlflow.entities import Param

    experiment_id = ensure_experiment(request["experiment"], mlflow_client)
    tags = dict(request["tags"])
    identity = {"kind": "train", "grid_key": tags["grid_key"], "config_hash": tags["config_hash"]}
    previous = find_runs(mlflow_client, experiment_id, identity)
    done = [run for run in previous if key is not None and run.data.tags.get(SPOOL_KEY_TAG) == key]
    if done:  # opened by this very request before: finish what its lost answer may have left undone
        run_id = str(done[0].info.run_id)
    else:
        if request["resume"]:
            for existing in previous:
                if existing.info.status in UNFINISHED and existing.data.tags.get("code") == request["code"]:
                    run_id = str(existing.info.run_id)
                    mlflow_client.update_run(run_id, status="RUNNING")
                    TrackedRun(run_id, mlflow_client).set_tags({"resumed": "true", "dvc_stage": tags["dvc_stage"]})
                    return run_id
        if parent_run_id is not None:
            tags[PARENT_TAG] = parent_run_id
        if key is not None:
            tags[SPOOL_KEY_TAG] = key
        run_id = str(mlflow_client.create_run(experiment_id, run_name=request["name"], tags=tags).info.run_id)
    if not (done and done[0].data.params):
        mlflow_client.log_batch(run_id, params=[Param(name, value) for name, value in request["params"].items()])
    supersede(mlflow_client, previous, run_id)
    return run_id
