"""Opening a training's MLflow run at once, as the spool does when it replays a training's request."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from dmlbench.grid import RunSpec
from dmlbench.tracking.runs import TrackedRun, open_training_run, training_run_request
from dmlbench.tracking.store import client as make_client


def start_training_run(
    run: RunSpec,
    resolved: Mapping[str, Any],
    config_hash: str,
    experiment: str,
    resume: bool = False,
    fold: int | None = None,
    parent_run_id: str | None = None,
    code: str | None = None,
) -> TrackedRun:
    """:func:`open_training_run` at once (a training goes through its spool instead). ``fold``: a fold
    model (grid key ``.../seed0/fold1``); ``parent_run_id``: the run it nests under; ``code``: the
    training code's fingerprint, which must match for a resume."""
    mlflow_client = make_client()
    request = training_run_request(run, resolved, config_hash, experiment, resume, fold, code)
    return TrackedRun(open_training_run(mlflow_client, request, parent_run_id), mlflow_client)
