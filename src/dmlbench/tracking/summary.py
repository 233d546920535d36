"""Summary runs in MLflow: each cell's run gets its seed-mean test metrics, intervals, metrics file and
learning curves (from the evaluate stages)."""

from __future__ import annotations

import hashlib
import json
import shutil
import tempfile
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from dmlbench.tracking.cells import ensure_cell_run
from dmlbench.tracking.runs import PARENT_TAG
from dmlbench.tracking.store import client as make_client
from dmlbench.tracking.store import git_state

CURVE_FIGURE = "learning_curves.png"


def log_summary_run(
    experiment: str,
    protocol: str,
    key: str,
    cell: dict[str, str],
    summary: dict,
    stage: str,
    name: str,
    children: Sequence[Any] = (),
    metrics_file: Path | None = None,
    params: Mapping[str, Any] | None = None,
) -> str:
    """Fill the cell's run (the ``children``'s parent, else found or created by ``combo_key``) with
    ``test/<metric>`` (seed mean), its ``ci_low|ci_high``, ``n_runs``, ``metrics_file`` and the
    children's learning curves; its id. ``params``: where no training created the run. Idempotent
    by the ``summary_md5`` tag; new results go into the same run."""
    from mlflow.entities import Metric, RunTag

    digest = hashlib.md5(json.dumps(summary, sort_keys=True).encode()).hexdigest()
    mlflow_client = make_client()
    parents = {child.data.tags.get(PARENT_TAG) for child in children} - {None}
    run_id = None
    if len(parents) == 1:
        parent = mlflow_client.get_run(parents.pop())
        if parent.info.lifecycle_stage == "active":
            run_id = parent.info.run_id
    if run_id is None:
        run_id = ensure_cell_run(mlflow_client, experiment, key, cell, name, params=params)
    run = mlflow_client.get_run(run_id)
    if run.data.tags.get("summary_md5") == digest and run.info.status == "FINISHED":
        return run_id
    commit, dirty = git_state()
    tags = {
        "n_runs": str(summary["n_runs"]),
        "interval": f"{summary['confidence']:.0%} "
        + ("t over seeds" if summary["n_runs"] > 1 else "class-cluster bootstrap"),
        "interval_n": str(_interval_n(summary)),
        "summary_md5": digest,
        "dvc_stage": stage,
        "git_commit": commit,
        "git_dirty": str(dirty).lower(),
        "protocol": protocol,
    }
    timestamp = int(time.time() * 1000)
    metrics = [Metric("n_runs", float(summary["n_runs"]), timestamp, 0)]
    for metric, entry in summary["test"].items():
        metrics.append(Metric(f"test/{metric}", float(entry["mean"]), timestamp, 0))
        for bound in ("low", "high"):
            if entry[bound] is not None:
                metrics.append(Metric(f"test/{metric}/ci_{bound}", float(entry[bound]), timestamp, 0))
    mlflow_client.log_batch(run_id, metrics=metrics, tags=[RunTag(k, v) for k, v in tags.items()])
    with tempfile.TemporaryDirectory() as tmp:
        if metrics_file is not None and Path(metrics_file).exists():  # named after the cell, not "32.json"
            named = Path(tmp) / f"{key}.json"
            shutil.copyfile(metrics_file, named)
            mlflow_client.log_artifact(run_id, str(named))
        figure = learning_curves(mlflow_client, children, Path(tmp) / CURVE_FIGURE)
        if figure is not None:
            mlflow_client.log_artifact(run_id, str(figure))
    mlflow_client.set_terminated(run_id, status="FINISHED")
    return run_id


def learning_curves(mlflow_client: Any, runs: Sequence[Any], path: Path) -> Path | None:
    """Training loss and validation score (tag ``selection``) per epoch, one line per run, from the
    MLflow histories; None when no run has one."""
    curves = []
    for run in runs:
        selection = run.data.tags.get("selection", "")
        val_key = f"val/{selection.split(':', 1)[1]}" if selection.startswith("val:") else None
        loss = sorted((m.step, m.value) for m in mlflow_client.get_metric_history(run.info.run_id, "train/loss"))
        val = (
            sorted((m.step, m.value) for m in mlflow_client.get_metric_history(run.info.run_id, val_key))
            if val_key
            else []
        )
        if loss:
            curves.append((run.data.tags.get("mlflow.runName", run.info.run_id[:8]), loss, val, val_key))
    if not curves:
        return None
    from matplotlib.figure import Figure  # no pyplot: no GUI backend, no global state

    has_val = any(val for _, _, val, _ in curves)
    figure = Figure(figsize=(8 if has_val else 4.5, 3.2), dpi=100)
    axes = figure.subplots(1, 2 if has_val else 1, squeeze=False)[0]
    for label, loss, val, _ in curves:
        axes[0].plot(*zip(*loss, strict=True), marker=".", label=label)
        if val:
            axes[1].plot(*zip(*val, strict=True), marker=".", label=label)
    axes[0].set(xlabel="epoch", ylabel="training loss")
    if has_val:
        axes[1].set(xlabel="epoch", ylabel=next(key for _, _, val, key in curves if val))
    axes[-1].legend(fontsize="small")
    figure.tight_layout()
    figure.savefig(path)
    return path


def _interval_n(summary: dict) -> int:
    return int(next(iter(summary["test"].values()))["n"])
