"""Summary runs in MLflow: one run per grid cell with its seed-mean test metrics and intervals
(written by the evaluate stages, :mod:`dmlbench.evaluate.stage`)."""

from __future__ import annotations

import hashlib
import json

from dmlbench.config import Params
from dmlbench.tracking.store import client as make_client
from dmlbench.tracking.store import ensure_experiment, git_state


def log_summary_run(params: Params, key: str, cell: dict[str, str], summary: dict, stage: str) -> str:
    """One MLflow run per grid cell, tagged ``kind=summary``, holding ``test/<metric>`` (seed mean),
    ``test/<metric>/ci_low|ci_high`` and ``n_runs``.

    Why a run of its own, in the training runs' experiment: the MLflow UI then lists, sorts and
    charts grid cells side by side, filtered by ``tags.kind = 'summary'`` (training runs have
    ``kind=train``), with no experiment to switch. Idempotent: a cell's summary run is found
    again by ``tags.combo_key``; if its ``tags.summary_md5`` matches, nothing is logged, else a
    new run replaces it (the old one is tagged ``superseded_by`` and moved to the trash, as
    training runs are), so each cell has exactly one active summary run.
    """
    from mlflow.entities import Metric, RunTag, ViewType

    digest = hashlib.md5(json.dumps(summary, sort_keys=True).encode()).hexdigest()
    mlflow_client = make_client()
    experiment_id = ensure_experiment(params.tracking.experiment, mlflow_client)
    existing = mlflow_client.search_runs(
        [experiment_id],
        filter_string=f"tags.kind = 'summary' and tags.combo_key = '{key}'",
        run_view_type=ViewType.ACTIVE_ONLY,
    )
    for run in existing:
        if run.data.tags.get("summary_md5") == digest:
            return run.info.run_id
    commit, dirty = git_state()
    tags = {
        "kind": "summary",
        "combo_key": key,
        **cell,
        "n_runs": str(summary["n_runs"]),
        "interval": f"{summary['confidence']:.0%} "
        + ("t over seeds" if summary["n_runs"] > 1 else "per-query bootstrap"),
        "summary_md5": digest,
        "dvc_stage": stage,
        "git_commit": commit,
        "git_dirty": str(dirty).lower(),
        "protocol": params.protocol_name,
    }
    created = mlflow_client.create_run(experiment_id, run_name=f"summary {key}", tags=tags)
    run_id = created.info.run_id
    timestamp = int(created.info.start_time)
    metrics = [Metric("n_runs", float(summary["n_runs"]), timestamp, 0)]
    for name, entry in summary["test"].items():
        metrics.append(Metric(f"test/{name}", float(entry["mean"]), timestamp, 0))
        for bound in ("low", "high"):
            if entry[bound] is not None:
                metrics.append(Metric(f"test/{name}/ci_{bound}", float(entry[bound]), timestamp, 0))
    mlflow_client.log_batch(run_id, metrics=metrics, tags=[RunTag("interval_n", str(_interval_n(summary)))])
    mlflow_client.set_terminated(run_id, status="FINISHED")
    for old in existing:
        mlflow_client.set_tag(old.info.run_id, "superseded_by", run_id)
        mlflow_client.delete_run(old.info.run_id)
    return run_id


def _interval_n(summary: dict) -> int:
    return int(next(iter(summary["test"].values()))["n"])
