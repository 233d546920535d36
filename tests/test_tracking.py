"""MLflow: one store created safely, one run per training, resumed instead of duplicated."""

from __future__ import annotations

import subprocess
import sys

from dmlbench.config import RunSpec
from dmlbench.tracking import ensure_experiment, start_training_run
from dmlbench.tracking.store import client, sqlite_path

RESOLVED = {"protocol": {"name": "demo", "lr": 0.001}, "loss": {"name": "contrastive", "neg_margin": 0.5}, "seed": 0}
RUN = RunSpec("glyphs", "tiny_cnn", "contrastive", 32, 0)


def test_concurrent_processes_share_one_fresh_store(tmp_path, mlflow_store):
    code = "from dmlbench.tracking import ensure_experiment; print(ensure_experiment('race'))"
    procs = [
        subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        for _ in range(4)
    ]
    outputs = [p.communicate(timeout=120) for p in procs]
    assert all(p.returncode == 0 for p in procs), [err[-500:] for _, err in outputs]
    ids = {out.strip().splitlines()[-1] for out, _ in outputs}
    assert len(ids) == 1
    experiments = [e for e in client().search_experiments() if e.name == "race"]
    assert len(experiments) == 1 and experiments[0].experiment_id in ids
    assert sqlite_path(mlflow_store) == tmp_path / "mlflow.db"


def test_training_run_logs_identity_params_and_tags(mlflow_store, monkeypatch):
    monkeypatch.setenv("DVC_STAGE", "train@glyphs-tiny_cnn-contrastive-32-0")
    tracked = start_training_run(RUN, RESOLVED, "hash1", "exp")
    tracked.log_metrics({"train/loss": 0.5, "val/map_at_r": 0.1}, step=1)
    tracked.log_metrics({"train/loss": 0.4, "val/map_at_r": 0.2}, step=2)
    tracked.finish()
    run = client().get_run(tracked.run_id)
    assert run.info.status == "FINISHED"
    assert run.data.params["protocol.lr"] == "0.001" and run.data.params["loss.neg_margin"] == "0.5"
    tags = run.data.tags
    assert tags["dvc_stage"] == "train@glyphs-tiny_cnn-contrastive-32-0"
    assert (tags["dataset"], tags["backbone"], tags["loss"], tags["dim"], tags["seed"]) == (
        "glyphs",
        "tiny_cnn",
        "contrastive",
        "32",
        "0",
    )
    assert tags["grid_key"] == "glyphs/tiny_cnn/contrastive/32/seed0" and "git_commit" in tags
    history = client().get_metric_history(tracked.run_id, "val/map_at_r")
    assert [(m.step, m.value) for m in history] == [(1, 0.1), (2, 0.2)]


def test_rerun_supersedes_and_resume_reuses(mlflow_store):
    experiment = ensure_experiment("exp")
    first = start_training_run(RUN, RESOLVED, "hash1", "exp")
    first.finish()
    # DVC re-executed the same training (code changed): the old run goes to the trash.
    second = start_training_run(RUN, RESOLVED, "hash1", "exp")
    active = client().search_runs([experiment])
    assert [r.info.run_id for r in active] == [second.run_id]
    assert client().get_run(first.run_id).data.tags["superseded_by"] == second.run_id
    # An interrupted run is resumed: same id, status RUNNING again, no new run.
    second.finish("KILLED")
    resumed = start_training_run(RUN, RESOLVED, "hash1", "exp", resume_run_id=second.run_id)
    assert resumed.run_id == second.run_id and resumed.status == "RUNNING"
    assert len(client().search_runs([experiment])) == 1
    # Other hyperparameters are another training: both runs stay.
    other = start_training_run(RUN, {**RESOLVED, "seed": 1}, "hash2", "exp")
    assert {r.info.run_id for r in client().search_runs([experiment])} == {second.run_id, other.run_id}


def test_system_metrics_are_logged_to_the_training_run(mlflow_store, monkeypatch):
    """MLflow's SystemMetricsMonitor samples CPU/memory into the run while it trains."""
    import time

    monkeypatch.setenv("MLFLOW_SYSTEM_METRICS_SAMPLING_INTERVAL", "0.2")
    monkeypatch.setenv("MLFLOW_SYSTEM_METRICS_SAMPLES_BEFORE_LOGGING", "1")
    tracked = start_training_run(RUN, RESOLVED, "hash1", "exp")
    monitor = tracked.start_system_metrics()
    time.sleep(1.5)  # several sampling intervals
    monitor.finish()
    tracked.finish()
    metrics = client().get_run(tracked.run_id).data.metrics
    assert any(k.startswith("system/cpu_utilization") for k in metrics)
    assert any(k.startswith("system/system_memory_usage") for k in metrics)
