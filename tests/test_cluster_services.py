"""The local cluster of ``make cluster-up`` / ``make server`` (docs/cluster.md), used for real:
a Slurm job ends COMPLETED in ``sacct``; the team MLflow server keeps an authenticated client's run
in PostgreSQL and its artifact in the artifact store, refuses writes without credentials and never
shows the password; an Optuna study lives in the cluster's PostgreSQL.

Marked ``cluster``. Each test is skipped, with the reason, when the part of the cluster it needs is
not running (``make cluster-up server`` starts it); when it runs, a failure is a failure.
"""

from __future__ import annotations

import base64
import os
import subprocess
import time
import uuid
from pathlib import Path

import pytest
from helpers.project import ROOT

pytestmark = pytest.mark.cluster

CLUSTER = Path(os.environ.get("DMLBENCH_CLUSTER_DIR", ROOT / ".cluster"))
PROXY_VARIABLES = ("http_proxy", "https_proxy", "HTTP_PROXY", "HTTPS_PROXY", "all_proxy", "ALL_PROXY")


def _alive(name: str) -> bool:
    """Whether the process of ``.cluster/run/<name>.pid`` runs."""
    try:
        os.kill(int((CLUSTER / "run" / f"{name}.pid").read_text().split()[0]), 0)
    except (OSError, ValueError, IndexError):
        return False
    return True


def _cluster_env() -> dict[str, str]:
    """The environment ``source .cluster/env`` gives (SLURM_CONF, PGPASSFILE, MLFLOW_TRACKING_*, ...)."""
    shown = subprocess.run(
        ["bash", "-c", f'source "{CLUSTER / "env"}" && env -0'], capture_output=True, text=True, check=True
    ).stdout
    return dict(item.split("=", 1) for item in shown.split("\0") if "=" in item)


@pytest.fixture(scope="module")
def slurm_env() -> dict[str, str]:
    if not (CLUSTER / "env").is_file() or not _alive("slurmctld") or not _alive("slurmd"):
        pytest.skip("the local Slurm is not running (start it with `make cluster-up`, as root)")
    return _cluster_env()


@pytest.fixture(scope="module")
def postgres_env() -> dict[str, str]:
    if not (CLUSTER / "env").is_file() or not _alive("postgres"):
        pytest.skip("the local PostgreSQL is not running (start it with `make cluster-up`, as root)")
    return _cluster_env()


@pytest.fixture
def server_env(monkeypatch) -> dict[str, str]:
    """The running ``make server``'s environment, with its credentials set for MLflow's client."""
    if not (CLUSTER / "env").is_file() or not _alive("postgres") or not _alive("mlflow"):
        pytest.skip("the team MLflow server is not running (start it with `make cluster-up server`)")
    env = _cluster_env()
    assert env.get("MLFLOW_TRACKING_PASSWORD"), "no MLflow password: set MLFLOW_TRACKING_PASSWORD (see docs/cluster.md)"
    for name in PROXY_VARIABLES:
        monkeypatch.delenv(name, raising=False)
    for name in ("MLFLOW_TRACKING_URI", "MLFLOW_TRACKING_USERNAME", "MLFLOW_TRACKING_PASSWORD"):
        monkeypatch.setenv(name, env[name])
    return env


def _psql(env: dict[str, str], database: str, query: str) -> str:
    """One query's rows (``|``-separated) as the cluster's role, its password from PGPASSFILE."""
    result = subprocess.run(
        ["psql", "--no-psqlrc", "--tuples-only", "--no-align", "--host=127.0.0.1", f"--port={env['DMLBENCH_PG_PORT']}",
         "--username=dmlbench", f"--dbname={database}", "--command", query],
        env={**os.environ, "PGPASSFILE": env["PGPASSFILE"]}, capture_output=True, text=True, check=False,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    return result.stdout.strip()


def test_an_sbatch_job_is_completed_in_sacct(slurm_env, tmp_path):
    out = tmp_path / "job.out"
    submitted = subprocess.run(
        ["sbatch", "--parsable", "--job-name=dmlbench-cluster-check", f"--output={out}", "--time=2",
         "--wrap=echo job $SLURM_JOB_ID on $SLURMD_NODENAME"],
        env=slurm_env, capture_output=True, text=True, check=False,
    )  # fmt: skip
    assert submitted.returncode == 0, submitted.stderr
    job = submitted.stdout.strip().split(";")[0]
    # plain sacct reads slurmdbd; with DMLBENCH_SLURM_ACCOUNTING=jobcomp only the completion log
    completion = ["--completion"] if slurm_env["DMLBENCH_SLURM_ACCOUNTING"] == "jobcomp" else ["--allocations"]
    state, deadline = "", time.monotonic() + 60
    while time.monotonic() < deadline:
        shown = subprocess.run(
            ["sacct", "--noheader", "--parsable2", *completion, "--format=JobID,State", f"--jobs={job}"],
            env=slurm_env, capture_output=True, text=True, check=False,
        )  # fmt: skip
        assert shown.returncode == 0, shown.stderr
        states = dict(line.split("|")[:2] for line in shown.stdout.splitlines() if "|" in line)
        state = states.get(job, "")
        if state and state not in ("PENDING", "RUNNING", "COMPLETING"):
            break
        time.sleep(0.5)
    assert state == "COMPLETED", f"job {job}: sacct says {state or 'nothing'}"
    assert out.read_text().startswith(f"job {job} on ")
    if slurm_env["DMLBENCH_SLURM_ACCOUNTING"] == "slurmdbd":
        # the --executor slurm watcher reads the same state (squeue, then sacct)
        from dmlbench.pipeline.slurm import states as slurm_states

        os.environ.setdefault("SLURM_CONF", slurm_env["SLURM_CONF"])
        assert slurm_states([job]) == {job: "COMPLETED"}


def test_the_tracking_server_keeps_runs_in_postgres_and_refuses_anonymous_writes(server_env, tmp_path):
    import requests
    from mlflow.tracking import MlflowClient

    from dmlbench.tracking import store

    uri = server_env["MLFLOW_TRACKING_URI"]
    user, password = server_env["MLFLOW_TRACKING_USERNAME"], server_env["MLFLOW_TRACKING_PASSWORD"]
    name = f"cluster-check-{uuid.uuid4().hex[:8]}"

    # no credentials (or wrong ones): refused, nothing created
    anonymous = requests.post(f"{uri}/api/2.0/mlflow/experiments/create", json={"name": name}, timeout=30)
    assert anonymous.status_code == 401
    wrong = requests.post(
        f"{uri}/api/2.0/mlflow/experiments/create", json={"name": name}, auth=(user, "not-it"), timeout=30
    )
    assert wrong.status_code == 401
    assert requests.get(f"{uri}/api/2.0/mlflow/experiments/search?max_results=1", timeout=30).status_code == 401

    # the project's tracking layer on the server (credentials from the environment only)
    assert store.tracking_uri() == uri
    experiment_id = store.ensure_experiment(name, store.client())
    client = MlflowClient(tracking_uri=uri)
    run = client.create_run(experiment_id, run_name="cluster-check", tags={"dmlbench.check": "cluster"})
    run_id = run.info.run_id
    client.log_param(run_id, "loss", "triplet")
    client.log_metric(run_id, "precision_at_1", 0.625, step=3)
    note = tmp_path / "note.txt"
    note.write_text("an artifact through the server\n")
    client.log_artifact(run_id, str(note))
    client.set_terminated(run_id)

    # the run, its param and its metric are rows of PostgreSQL's mlflow database
    where = f"WHERE run_uuid = '{run_id}'"
    assert _psql(server_env, "mlflow", f"SELECT status FROM runs {where}") == "FINISHED"
    assert _psql(server_env, "mlflow", f"SELECT value FROM params {where} AND key = 'loss'") == "triplet"
    metric = _psql(server_env, "mlflow", f"SELECT value FROM latest_metrics {where} AND key = 'precision_at_1'")
    assert metric == "0.625"
    assert client.get_run(run_id).info.artifact_uri.startswith("mlflow-artifacts:/")

    # the artifact went through the server into its artifact store
    assert [f.path for f in client.list_artifacts(run_id)] == ["note.txt"]
    destination = server_env["DMLBENCH_MLFLOW_ARTIFACTS"]
    if "://" not in destination:
        stored = Path(destination) / experiment_id / run_id / "artifacts" / "note.txt"
        assert stored.read_text() == note.read_text()

    # the password is nowhere: run record, server log, server command lines, the users' store
    record = client.get_run(run_id).data
    shown = repr(record.params) + repr(record.tags) + repr(record.metrics)
    basic = base64.b64encode(f"{user}:{password}".encode()).decode()
    assert password not in shown and basic not in shown
    log = Path(server_env["DMLBENCH_MLFLOW_LOG"]).read_text(errors="replace")
    assert password not in log and basic not in log
    pid = (CLUSTER / "run" / "mlflow.pid").read_text().split()[0]
    group = subprocess.run(["ps", "-o", "pid=", "-g", pid], capture_output=True, text=True, check=False).stdout.split()
    for member in group:
        with open(f"/proc/{member}/cmdline", "rb") as cmdline:
            assert password.encode() not in cmdline.read()
    hashed = _psql(server_env, "mlflow_auth", f"SELECT password_hash FROM users WHERE username = '{user}'")
    assert hashed and password not in hashed
    client.delete_experiment(experiment_id)


def test_an_optuna_study_lives_in_the_clusters_postgres(postgres_env, monkeypatch):
    pytest.importorskip("psycopg", reason="needs the cluster extra (psycopg): `make server` installs it")
    import optuna

    monkeypatch.setenv("PGPASSFILE", postgres_env["PGPASSFILE"])
    url = postgres_env["DMLBENCH_OPTUNA_STORAGE"]
    assert "@" in url and ":" not in url.split("://", 1)[1].split("@", 1)[0]  # no password in the URL
    name = f"cluster-check-{uuid.uuid4().hex[:8]}"
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    study = optuna.create_study(storage=url, study_name=name)
    study.optimize(lambda trial: (trial.suggest_float("x", -1, 1) - 0.5) ** 2, n_trials=3)
    again = optuna.load_study(study_name=name, storage=url)
    assert len(again.trials) == 3
    query = f"SELECT count(*) FROM trials JOIN studies USING (study_id) WHERE study_name = '{name}'"
    assert _psql(postgres_env, "optuna", query) == "3"
    optuna.delete_study(study_name=name, storage=url)
