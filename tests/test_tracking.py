"""MLflow: one store created safely, one run per training, resumed instead of duplicated."""

from __future__ import annotations

import subprocess
import sys

from helpers.tracking import start_training_run

from dmlbench.grid import RunSpec
from dmlbench.tracking.store import client, ensure_experiment, sqlite_path

RESOLVED = {"protocol": {"name": "demo", "lr": 0.001}, "loss": {"name": "contrastive", "neg_margin": 0.5}, "seed": 0}
RUN = RunSpec("glyphs", "tiny_cnn", "contrastive", 32, 0)


def test_concurrent_processes_share_one_fresh_store(tmp_path, mlflow_store):
    code = "from dmlbench.tracking.store import ensure_experiment; print(ensure_experiment('race'))"
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


# A process killed while MLflow builds a new store's tables: it stops one migration short of the
# head, the state a slow machine's killed `dvc repro` once left ("out-of-date database schema").
HALF_BUILT = """
import os
from alembic import command
real_upgrade = command.upgrade
def killed_midway(config, revision, **kwargs):
    real_upgrade(config, "75868b020152")
    os._exit(9)
command.upgrade = killed_midway
from dmlbench.tracking.store import client
client()
"""


def test_a_process_killed_while_creating_the_store_leaves_none_behind(tmp_path, mlflow_store):
    killed = subprocess.run(
        [sys.executable, "-c", HALF_BUILT], check=False, capture_output=True, text=True, timeout=120
    )
    assert killed.returncode == 9, killed.stderr[-800:]
    assert not (tmp_path / "mlflow.db").exists()  # the half-built tables stayed in the temporary file
    assert ensure_experiment("after-a-kill")  # the next process builds the store whole and uses it
    assert [p.name for p in tmp_path.iterdir() if p.name.endswith(".partial")] == []


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
    # An interrupted run is found by its identity and resumed: same id, status RUNNING again, no new run.
    second.finish("KILLED")
    resumed = start_training_run(RUN, RESOLVED, "hash1", "exp", resume=True)
    assert resumed.run_id == second.run_id and resumed.status == "RUNNING"
    assert len(client().search_runs([experiment])) == 1
    # A finished run is not resumed, nor one of other code: a new run supersedes it.
    resumed.finish()
    third = start_training_run(RUN, RESOLVED, "hash1", "exp", resume=True)
    assert third.run_id != second.run_id
    third.finish("FAILED")
    fourth = start_training_run(RUN, RESOLVED, "hash1", "exp", resume=True, code="other code")
    assert fourth.run_id != third.run_id
    assert [r.info.run_id for r in client().search_runs([experiment])] == [fourth.run_id]
    # Other hyperparameters are another training: both runs stay.
    other = start_training_run(RUN, {**RESOLVED, "seed": 1}, "hash2", "exp")
    assert {r.info.run_id for r in client().search_runs([experiment])} == {fourth.run_id, other.run_id}


def test_cell_run_is_created_once_and_parents_the_seed_runs(mlflow_store):
    """Parallel train stages of one cell find one cell run (created under the store lock), with
    the cell's params; new hyperparameters make a new cell run and trash the old one."""
    from dmlbench.tracking.cells import cell_config, cell_run_name, cell_tags, ensure_cell_run
    from dmlbench.tracking.runs import PARENT_TAG, find_training_run

    code = (
        "from dmlbench.tracking.cells import ensure_cell_run; from dmlbench.tracking.store import client; "
        "print(ensure_cell_run(client(), 'exp', 'k', {'loss': 'contrastive'}, 'contrastive d32 (cell)', "
        "params={'dim': 32, 'loss': {'name': 'contrastive'}}))"
    )
    procs = [
        subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        for _ in range(3)
    ]
    outputs = [p.communicate(timeout=120) for p in procs]
    assert all(p.returncode == 0 for p in procs), [err[-500:] for _, err in outputs]
    assert len({out.strip().splitlines()[-1] for out, _ in outputs}) == 1

    params = cell_config(RESOLVED)
    assert "seed" not in params and params["protocol"] == RESOLVED["protocol"]
    name = cell_run_name("contrastive", 32)
    cell = ensure_cell_run(client(), "exp", RUN.combo.key, cell_tags(RUN.combo), name, params=params)
    assert ensure_cell_run(client(), "exp", RUN.combo.key, cell_tags(RUN.combo), name, params=params) == cell
    assert ensure_cell_run(client(), "exp", RUN.combo.key, {}, name) == cell  # the evaluate stage's look-up
    seed_run = start_training_run(RUN, RESOLVED, "hash1", "exp", parent_run_id=cell)
    found = find_training_run(RUN.grid_key, "hash1", "exp")
    assert found.info.run_id == seed_run.run_id and found.data.tags[PARENT_TAG] == cell
    assert found.info.run_name == "contrastive d32 s0"
    run = client().get_run(cell)
    assert run.info.run_name == "contrastive d32 (cell)" and run.data.tags["kind"] == "summary"
    assert run.data.params["protocol.lr"] == "0.001" and "seed" not in run.data.params
    changed = {**params, "dim": 64}
    replacement = ensure_cell_run(client(), "exp", RUN.combo.key, cell_tags(RUN.combo), name, params=changed)
    assert replacement != cell and client().get_run(cell).data.tags["superseded_by"] == replacement


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


def test_a_dataset_input_is_logged_under_the_store_lock(mlflow_store, monkeypatch):
    """MLflow gets-or-creates a dataset row without a lock: two trainings logging one dataset for
    the first time at once collided (UNIQUE constraint on experiment, name, digest) in a parallel
    `make repro`. The row is written while holding the project's store lock."""
    from filelock import FileLock

    tracked = start_training_run(RUN, RESOLVED, "hash1", "exp")
    lock_file = sqlite_path(mlflow_store).with_suffix(".db.lock")
    held = []
    original = tracked.client.log_inputs

    def log_inputs(*args, **kwargs):
        probe = FileLock(str(lock_file), timeout=0)
        try:
            probe.acquire()
            probe.release()
            held.append(False)
        except Exception:  # noqa: BLE001 - Timeout: another holder (this process's own lock)
            held.append(True)
        return original(*args, **kwargs)

    monkeypatch.setattr(tracked.client, "log_inputs", log_inputs)
    tracked.log_dataset("glyphs", "abc", "artifacts/prepared/glyphs", {"train": {"images": 3}}, context="train")
    assert held == [True]
    inputs = client().get_run(tracked.run_id).inputs.dataset_inputs
    assert [d.dataset.name for d in inputs] == ["glyphs"]
