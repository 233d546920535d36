"""The report in MLflow: one "report" run per report content, found again instead of duplicated.

Identity: tags ``report_key`` (grid and report settings) and ``content_hash`` (report and figures):
the same content logs nothing, new content supersedes the earlier runs. Artifacts keep the report's
layout, so its relative image links work.
"""

from __future__ import annotations

import hashlib
import json
import os
import time
from collections.abc import Mapping
from pathlib import Path

from dmlbench.params.model import Params
from dmlbench.tracking.runs import find_runs
from dmlbench.tracking.store import client as make_client
from dmlbench.tracking.store import ensure_experiment, git_state, supersede

ARTIFACT_DIR = "report"


def report_key(params: Params) -> str:
    """Hash of what the report is about: the grid, the protocol and the report settings."""
    identity = {
        "datasets": list(params.datasets),
        "backbones": list(params.backbones),
        "losses": list(params.losses),
        "dims": params.dims,
        "seeds": params.seeds,
        "protocol": params.protocol_name,
        "report": params.report.model_dump(mode="json"),
    }
    return hashlib.sha256(json.dumps(identity, sort_keys=True).encode()).hexdigest()[:16]


def content_hash(report: Path, figure_dir: Path) -> str:
    """SHA-256 (16 hex digits) over the report text and every figure's name and bytes."""
    digest = hashlib.sha256()
    for path in [report, *sorted(figure_dir.glob("*.png"))]:
        digest.update(path.name.encode() + b"\0" + path.read_bytes() + b"\0")
    return digest.hexdigest()[:16]


def log_report(params: Params, report: Path, figure_dir: Path, metrics: Mapping[str, float]) -> str:
    """Log ``report`` and its figures to MLflow unless this exact content is already there; return the run id."""
    from mlflow.entities import Metric, Param, RunTag

    client = make_client()
    experiment_id = ensure_experiment(params.tracking.experiment, client)
    key, content = report_key(params), content_hash(report, figure_dir)
    previous = find_runs(client, experiment_id, {"kind": "report", "report_key": key})
    for run in previous:
        if run.data.tags.get("content_hash") == content and run.info.status == "FINISHED":
            print(f"report already in MLflow: run {run.info.run_id} (same content)")
            return run.info.run_id

    commit, dirty = git_state()
    run = client.create_run(
        experiment_id,
        run_name="report",
        tags={
            "kind": "report",
            "report_key": key,
            "content_hash": content,
            "git_commit": commit,
            "git_dirty": str(dirty).lower(),
            "mlflow.source.git.commit": commit,
            "dvc_stage": os.environ.get("DVC_STAGE", "report"),
        },
    )
    run_id = run.info.run_id
    try:
        now = int(time.time() * 1000)
        client.log_batch(
            run_id,
            metrics=[Metric(name, float(value), now, 0) for name, value in metrics.items()],
            params=[
                Param("grid.runs", str(len(params.runs()))),
                Param("grid.losses", ",".join(params.losses)),
                Param("grid.datasets", ",".join(params.datasets)),
                Param("grid.backbones", ",".join(params.backbones)),
                Param("grid.dims", ",".join(map(str, params.dims))),
                Param("grid.seeds", ",".join(map(str, params.seeds))),
                Param("protocol", params.protocol_name),
                *(Param(f"report.{k}", str(v)) for k, v in params.report.model_dump(mode="json").items()),
            ],
            tags=[RunTag("mlflow.note.content", f"Generated report; see artifacts/{ARTIFACT_DIR}/{report.name}")],
        )
        client.log_artifact(run_id, str(report), ARTIFACT_DIR)
        for figure in sorted(figure_dir.glob("*.png")):
            client.log_artifact(run_id, str(figure), f"{ARTIFACT_DIR}/{figure_dir.name}")
    except BaseException:
        client.set_terminated(run_id, status="FAILED")
        raise
    client.set_terminated(run_id, status="FINISHED")
    supersede(client, previous, run_id)
    print(f"report logged to MLflow: run {run_id}")
    return run_id
