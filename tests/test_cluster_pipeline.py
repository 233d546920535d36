"""The pipeline on the local Slurm (``make cluster-up``): one job per stage with ``afterok``
dependencies, DVC's bookkeeping intact with jobs finishing together, a failure cancelling its
dependents, only stale stages re-submitted, a ``scancel``led training resumed, and the demo-shaped
grid giving the same metrics as a local run.

Marked ``cluster``; skipped, with the reason, where the local Slurm is not running."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest
import yaml
from helpers.project import ROOT, dvc_project, run_checked

pytestmark = pytest.mark.cluster

CLUSTER = Path(os.environ.get("DMLBENCH_CLUSTER_DIR", ROOT / ".cluster"))
FAST = {"default": {"cpus": 1, "mem": "500M", "time": "20"}}


def _running(name: str) -> bool:
    try:
        os.kill(int((CLUSTER / "run" / f"{name}.pid").read_text().split()[0]), 0)
    except (OSError, ValueError, IndexError):
        return False
    return True


def _cluster_env(*keys: str) -> dict[str, str]:
    """These variables of ``source .cluster/env`` (SLURM_CONF, PGPASSFILE, MLFLOW_TRACKING_*, ...)."""
    shown = subprocess.run(
        ["bash", "-c", f'source "{CLUSTER / "env"}" && env -0'], capture_output=True, text=True, check=True
    )
    env = dict(item.split("=", 1) for item in shown.stdout.split("\0") if "=" in item)
    return {key: env[key] for key in keys if key in env}


@pytest.fixture(scope="module")
def slurm() -> dict[str, str]:
    """``source .cluster/env``'s variables (SLURM_CONF, ...), or a skip saying how to start Slurm."""
    if not (CLUSTER / "env").is_file() or not (_running("slurmctld") and _running("slurmd")):
        pytest.skip("the local Slurm is not running (start it with `make cluster-up`, as root)")
    return _cluster_env("SLURM_CONF")


@pytest.fixture(scope="module")
def server() -> dict[str, str]:
    """The team MLflow server's address and credentials (``make server``), or a skip."""
    if not (CLUSTER / "env").is_file() or not (_running("mlflow") and _running("postgres")):
        pytest.skip("the team MLflow server is not running (start it with `make cluster-up server`)")
    credentials = _cluster_env("MLFLOW_TRACKING_URI", "MLFLOW_TRACKING_USERNAME", "MLFLOW_TRACKING_PASSWORD")
    return credentials | {"NO_PROXY": "127.0.0.1,localhost", "no_proxy": "127.0.0.1,localhost"}


def _project(tmp_path: Path, raw: dict, slurm: dict[str, str], cluster: dict = FAST) -> tuple[Path, dict[str, str]]:
    root = tmp_path / "repo"
    env = dvc_project(root, {**raw, "cluster": cluster}, mlflow_db=tmp_path / "store" / "mlflow.db")
    return root, {**env, **slurm}


def _pipeline(root: Path, env: dict[str, str], *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "dmlbench.pipeline", "--executor", "slurm", *args], cwd=root, env=env,
                          capture_output=True, text=True, timeout=1200, check=False)  # fmt: skip


def _job_ids(output: str) -> list[str]:
    """The Slurm job of each stage one pipeline run reported ended (``done      <stage> (job N)``,
    then the ETA where the grid has one: `` [k/N ended; ETA ...]``)."""
    return re.findall(r"^\S+ +\S+ \(job (\d+)\)(?: \[[^\]]*\])?$", output, flags=re.MULTILINE)


def _jobs(env: dict[str, str], output: str, field: str = "State") -> list[tuple[str, str]]:
    """(job name, ``field``) of each job one pipeline run submitted and saw end (:func:`_job_ids`),
    from Slurm's accounting (sacct); a state without its suffix ("CANCELLED by 0" -> CANCELLED)."""
    ids = ",".join(_job_ids(output))
    shown = run_checked(["sacct", "-X", "-n", "-P", f"--jobs={ids}", f"--format=JobName%200,{field}"], Path("."), env)
    return [
        (name, value.split()[0]) for name, value in (line.split("|")[:2] for line in shown.stdout.splitlines() if line)
    ]


def _fan_out(stages: int) -> dict:
    """``stages`` independent stages, each sleeping a second and writing a file, and one joining them."""
    write = "import sys, time; time.sleep(1); open(sys.argv[1], 'w').write(sys.argv[1])"
    dvc = {f"s{i}": {"cmd": f'python -c "{write}" out{i}', "outs": [f"out{i}"]} for i in range(stages)}
    dvc["join"] = {
        "cmd": f"cat {' '.join(f'out{i}' for i in range(stages))} > joined",
        "deps": [f"out{i}" for i in range(stages)],
        "outs": ["joined"],
    }
    return {"stages": dvc}


def test_every_stage_is_one_slurm_job_and_dvc_keeps_every_lock_entry(tmp_path, small_raw_params, slurm):
    root, env = _project(tmp_path, small_raw_params, slurm)
    (root / "dvc.yaml").write_text(yaml.safe_dump(_fan_out(12)))
    first = _pipeline(root, env)
    assert first.returncode == 0, first.stdout + first.stderr
    assert "13 stage(s) submitted to Slurm" in first.stdout
    lock = yaml.safe_load((root / "dvc.lock").read_text())["stages"]
    assert set(lock) == {f"s{i}" for i in range(12)} | {"join"}  # no entry lost to a concurrent write
    assert (root / "joined").read_text() == "".join(f"out{i}" for i in range(12))
    status = run_checked([sys.executable, "-m", "dvc", "status"], root, env)
    assert "up to date" in status.stdout
    jobs = _jobs(env, first.stdout)
    assert sorted(name for name, _ in jobs) == sorted(lock) and {state for _, state in jobs} == {"COMPLETED"}
    # a changed stage goes to Slurm again; what follows it only if its output changed (as dvc repro)
    (root / "dvc.yaml").write_text(yaml.safe_dump(_fan_out(12)).replace("time.sleep(1)", "time.sleep(0)", 1))
    again = _pipeline(root, env)
    assert again.returncode == 0 and len(_job_ids(again.stdout)) == 1, again.stdout + again.stderr
    assert "same      join (its inputs came out the same: not run)" in again.stdout
    changed = _fan_out(12)
    s0 = changed["stages"]["s0"]
    s0["cmd"] = s0["cmd"].replace("time.sleep(1)", "time.sleep(0)").replace(".write(sys.argv[1])", ".write('zero')")
    (root / "dvc.yaml").write_text(yaml.safe_dump(changed))  # s0 now writes "zero" into out0
    third = _pipeline(root, env)
    assert third.returncode == 0 and len(_job_ids(third.stdout)) == 2, third.stdout + third.stderr
    assert (root / "joined").read_text() == "zero" + "".join(f"out{i}" for i in range(1, 12))


def test_a_failed_job_cancels_its_dependents_and_names_its_log(tmp_path, small_raw_params, slurm):
    root, env = _project(tmp_path, small_raw_params, slurm)
    pipeline = _fan_out(2)
    pipeline["stages"]["s1"]["cmd"] = "python -c \"raise SystemExit('disk on fire')\""
    (root / "dvc.yaml").write_text(yaml.safe_dump(pipeline))
    result = _pipeline(root, env)
    assert result.returncode == 1
    log = root / "artifacts" / "logs" / "s1.log"
    assert "stage s1 FAILED" in result.stderr and f"log: {log}" in result.stderr and "disk on fire" in result.stderr
    assert "cancelled as their dependencies failed (by Slurm, or never submitted): join" in result.stderr
    assert not (root / "joined").exists()


def _small_grid(raw: dict) -> dict:
    raw = {**raw, "losses": {"contrastive": {}}, "dims": [32], "seeds": [0, 1]}
    raw["tuning"] = {**raw["tuning"], "baselines": []}
    return raw


def test_a_scancelled_training_resumes_from_its_checkpoint(tmp_path, small_raw_params, slurm):
    raw = _small_grid(small_raw_params)
    raw["seeds"] = [0]
    raw["protocols"] = {**raw["protocols"], raw["protocol"]: {**raw["protocols"][raw["protocol"]], "epochs": 30}}
    root, env = _project(tmp_path, raw, slurm)
    run = subprocess.Popen([sys.executable, "-m", "dmlbench.pipeline", "--executor", "slurm"], cwd=root, env=env,
                           stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)  # fmt: skip
    stage = "train@glyphs-tiny_cnn-contrastive-32-0"
    log = root / "artifacts" / "logs" / f"{stage}.log"
    deadline = time.time() + 600
    while "epoch 3/30" not in (log.read_text() if log.exists() else ""):
        assert time.time() < deadline and run.poll() is None, run.communicate()
        time.sleep(1)
    run_checked(["scancel", f"--name={stage}"], root, env)
    out, err = run.communicate(timeout=300)
    assert run.returncode == 1 and f"stage {stage} CANCELLED" in err, out + err
    again = _pipeline(root, env)
    assert again.returncode == 0, again.stdout + again.stderr
    assert "resuming after epoch" in log.read_text()


def test_a_training_at_its_time_limit_checkpoints_requeues_and_resumes(tmp_path, small_raw_params, slurm):
    """Slurm's own warning, not a signal the test sends: a 2-minute limit with
    ``--signal=B:USR1@50`` (slurmctld sends it on a periodic pass, up to 60 s early; here about
    50 s in), during a training of about 80 s (400 epochs of the small grid)."""
    raw = _small_grid(small_raw_params)
    raw["seeds"] = [0]
    raw["protocols"] = {**raw["protocols"], raw["protocol"]: {**raw["protocols"][raw["protocol"]], "epochs": 400}}
    cluster = {**FAST, "signal_seconds": 50, "stages": {"train": {"time": "2"}}}
    root, env = _project(tmp_path, raw, slurm, cluster)
    run = subprocess.Popen([sys.executable, "-m", "dmlbench.pipeline", "--executor", "slurm"], cwd=root, env=env,
                           stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)  # fmt: skip
    stage = "train@glyphs-tiny_cnn-contrastive-32-0"
    log = root / "artifacts" / "logs" / f"{stage}.log"
    deadline = time.time() + 600
    while "requeueing job" not in (text := log.read_text() if log.exists() else ""):
        assert time.time() < deadline and run.poll() is None, (text, run.communicate())
        time.sleep(1)
    job_id = text.split("requeueing job ", 1)[1].split()[0]
    # the requeued job may now finish (one warning is what this test is about), and start at once
    # rather than after Slurm's delay for requeued jobs (about 3 minutes here)
    run_checked(["scontrol", "update", f"JobId={job_id}", "TimeLimit=20", "StartTime=now"], root, env)
    out, err = run.communicate(timeout=900)
    assert run.returncode == 0, out + err
    text = log.read_text()
    resumed = int(text.split("resuming after epoch ", 1)[1].split()[0])
    assert 0 < resumed < 400 and "epoch 400/400" in text, text
    # Slurm's records: the same job ran twice (the first run ended REQUEUED), the second COMPLETED
    runs = run_checked(
        ["sacct", "-n", "-P", "-X", "--duplicates", f"--jobs={job_id}", "--format=JobID,State"], root, env
    )
    states = [line.split("|")[1].split()[0] for line in runs.stdout.splitlines() if line]
    assert states[-1] == "COMPLETED" and "REQUEUED" in states[:-1], states


def test_the_grid_on_slurm_gives_the_local_metrics_and_the_server_every_run(tmp_path, small_raw_params, slurm, server):
    raw = _small_grid(small_raw_params)
    local_root = tmp_path / "local"
    local_env = dvc_project(local_root / "repo", raw, mlflow_db=local_root / "mlflow.db")
    run_checked([sys.executable, "-m", "dmlbench.pipeline", "--jobs", "2"], local_root / "repo", local_env)
    experiment = f"ci-{uuid.uuid4().hex[:8]}"  # its own experiment on the team server
    root, env = _project(tmp_path, {**raw, "tracking": {**raw.get("tracking", {}), "experiment": experiment}}, slurm)
    env.update(server)
    result = _pipeline(root, env)
    assert result.returncode == 0, result.stdout + result.stderr
    metrics = Path("artifacts/metrics/glyphs/tiny_cnn/contrastive/32.json")
    assert json.loads((root / metrics).read_text()) == json.loads((local_root / "repo" / metrics).read_text())
    stages = set(yaml.safe_load((root / "dvc.lock").read_text())["stages"])
    jobs = _jobs(env, result.stdout)
    # one Slurm job per stage but validate, which ran on the submitting node first (it writes the inputs
    # manifests that decide which stages are stale) and was recorded there, and the tune@ record of
    # this protocol, which trains published values (run there too: no job)
    assert "validate" in stages and "done   validate" in result.stdout
    tune = "tune@glyphs-tiny_cnn-contrastive"
    assert tune in stages and f"done      {tune} (run here: no job)" in result.stdout
    assert sorted(name for name, _ in jobs) == sorted(stages - {"validate", tune})
    assert {state for _, state in jobs} == {"COMPLETED"}
    # the team server holds every run and artifact: 2 trainings, the cell, the baseline row, the report
    from mlflow.tracking import MlflowClient

    for key, value in server.items():
        os.environ[key] = value  # the client's credentials, for this check only
    try:
        client = MlflowClient(server["MLFLOW_TRACKING_URI"])
        runs = client.search_runs([client.get_experiment_by_name(experiment).experiment_id])
        kinds = sorted(run.data.tags.get("kind", "") for run in runs)
        assert kinds.count("train") == 2 and kinds.count("summary") == 2 and kinds.count("report") == 1, kinds
        report = next(run for run in runs if run.data.tags.get("kind") == "report")
        assert "report/report.md" in {a.path for a in client.list_artifacts(report.info.run_id, "report")}
        password = server["MLFLOW_TRACKING_PASSWORD"]
        assert all(password not in json.dumps([run.data.params, run.data.tags]) for run in runs)
        assert password not in (root / "reports" / "report.md").read_text()
    finally:
        for key in server:
            os.environ.pop(key, None)


@pytest.fixture(scope="module")
def postgres() -> dict[str, str]:
    """The cluster's PostgreSQL for Optuna (``DMLBENCH_OPTUNA_STORAGE``, ``PGPASSFILE``), or a skip."""
    if not (CLUSTER / "env").is_file() or not _running("postgres"):
        pytest.skip("the local PostgreSQL is not running (start it with `make cluster-up`, as root)")
    return _cluster_env("PGPASSFILE", "DMLBENCH_OPTUNA_STORAGE")


def test_two_slurm_workers_share_one_postgresql_study(tmp_path, small_raw_params, slurm, postgres):
    import optuna

    raw = _small_grid(small_raw_params)
    raw["seeds"] = [0]
    raw["protocols"] = {
        **raw["protocols"],
        raw["protocol"]: {**raw["protocols"][raw["protocol"]], "hyperparameters": "tuned"},
    }
    space = {"contrastive": {"pos_margin": {"low": 0.0, "high": 0.4}, "neg_margin": {"low": 0.5, "high": 1.5}}}
    seed = int(time.time()) % 100_000  # a new study in the shared database on every run
    raw["tuning"] = {**raw["tuning"], "sampler": "random", "trials": 6, "pruner": "none", "workers": 2,
                     "storage": postgres["DMLBENCH_OPTUNA_STORAGE"], "seed": seed, "space": space}  # fmt: skip
    root, env = _project(tmp_path, raw, slurm, {**FAST, "stages": {"tune": {"cpus": 2}}})
    env["PGPASSFILE"] = postgres["PGPASSFILE"]
    result = _pipeline(root, env)
    assert result.returncode == 0, result.stdout + result.stderr
    best = yaml.safe_load((root / "artifacts/tuning/glyphs/tiny_cnn/contrastive/best.yaml").read_text())
    os.environ["PGPASSFILE"] = postgres["PGPASSFILE"]
    try:
        study = optuna.load_study(study_name=best["study"], storage=postgres["DMLBENCH_OPTUNA_STORAGE"])
        trials = study.get_trials(states=[optuna.trial.TrialState.COMPLETE])
    finally:
        os.environ.pop("PGPASSFILE")
    assert len(trials) >= 6 and {t.user_attrs["worker"] for t in trials} == {0, 1}  # both tasks trained trials
    assert len({tuple(sorted(t.params.items())) for t in trials}) == len(trials)  # no point drawn twice
    tasks = run_checked(
        # by name, sacct looks from 00:00 today unless told: a run across midnight would find nothing
        [
            "sacct",
            "-n",
            "-P",
            "-X",
            "--starttime=now-1days",
            f"--name=tune-{best['study']}",
            "--format=JobID,State,AllocCPUS",
        ],
        root,
        env,  # fmt: skip
    )
    rows = [line.split("|") for line in tasks.stdout.splitlines() if line]
    assert (
        len(rows) == 2 and all(state == "COMPLETED" for _, state, _ in rows) and all("_" in job for job, _, _ in rows)
    )
    assert {cpus for _, _, cpus in rows} == {"2"}  # each task: the tune kind's resources
    allocated = dict(_jobs(env, result.stdout, "AllocCPUS"))
    assert allocated["tune@glyphs-tiny_cnn-contrastive"] == "1"  # the tune job itself only waits for its array
