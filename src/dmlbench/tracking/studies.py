"""MLflow runs of a tuning study: one parent run per study, a nested child run per trial.

Parent (``kind=study``): settings and space as params, then the best objective, counts and figures.
Child (``kind=trial``): values, ``val_fold<f>/<objective>``, the objective and ``trial_state``
(a diverged trial is FAILED with :func:`dmlbench.tracking.runs.failure_tags`; KILLED awaits its re-run).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from dmlbench.params.model import flatten
from dmlbench.tracking.runs import PARENT_TAG, TrackedRun, failure_tags, find_runs
from dmlbench.tracking.store import client as make_client
from dmlbench.tracking.store import ensure_experiment, git_state, store_lock

STUDY_KIND = "study"
TRIAL_KIND = "trial"


def study_run(experiment: str, study: str, name: str, tags: Mapping[str, str], params: Mapping[str, Any]) -> TrackedRun:
    """The study's parent run, created on the study's first start and found again on a resume."""
    from mlflow.entities import Param

    mlflow_client = make_client()
    experiment_id = ensure_experiment(experiment, mlflow_client)
    with store_lock():
        found = find_runs(mlflow_client, experiment_id, {"kind": STUDY_KIND, "study": study})
        if found:
            run_id = found[0].info.run_id
            mlflow_client.update_run(run_id, status="RUNNING")
            return TrackedRun(run_id, mlflow_client)
        commit, dirty = git_state()
        all_tags = {"kind": STUDY_KIND, "study": study, "git_commit": commit, "git_dirty": str(dirty).lower(), **tags}
        run_id = mlflow_client.create_run(experiment_id, run_name=name, tags=all_tags).info.run_id
        mlflow_client.log_batch(run_id, params=[Param(k, str(v)) for k, v in flatten(params).items()])
    return TrackedRun(run_id, mlflow_client)


def trial_run(experiment: str, parent: TrackedRun, study: str, number: int) -> TrackedRun:
    """A new child run for trial ``number``; its values are logged when the trial ends."""
    mlflow_client = make_client()
    experiment_id = ensure_experiment(experiment, mlflow_client)
    tags = {"kind": TRIAL_KIND, "study": study, "trial": str(number), PARENT_TAG: parent.run_id}
    run_id = mlflow_client.create_run(experiment_id, run_name=f"trial {number}", tags=tags).info.run_id
    return TrackedRun(run_id, mlflow_client)


def mark_interrupted(experiment: str, study: str, numbers: list[int]) -> None:
    """Child runs of trials a killed worker left running: KILLED (their re-runs are new trials)."""
    if not numbers:
        return
    mlflow_client = make_client()
    experiment_id = ensure_experiment(experiment, mlflow_client)
    for run in find_runs(mlflow_client, experiment_id, {"kind": TRIAL_KIND, "study": study}):
        if int(run.data.tags.get("trial", -1)) in numbers and run.info.status == "RUNNING":
            TrackedRun(run.info.run_id, mlflow_client).set_tags({"trial_state": "interrupted"})
            TrackedRun(run.info.run_id, mlflow_client).finish("KILLED")


def end_trial(
    child: TrackedRun,
    values: Mapping[str, Any],
    state: str,
    value: float | None,
    seconds: float,
    error: BaseException | None,
    objective: str,
) -> None:
    """End a trial's run: its ``values`` as params, its time and objective, ``trial_state`` (and
    the failure tags of an error); FAILED when it diverged or failed, else FINISHED."""
    from mlflow.entities import Param

    if values:
        child.client.log_batch(child.run_id, params=[Param(k, repr(v)) for k, v in values.items()])
    metrics = {"trial/seconds": seconds}
    if value is not None:
        metrics[f"objective/{objective}"] = value
    child.log_metrics(metrics)
    child.set_tags({"trial_state": state, **(failure_tags(error) if error is not None else {})})
    child.finish("FAILED" if state in ("failed", "diverged") else "FINISHED")
