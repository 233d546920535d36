"""The Slurm executor without a cluster: the ``cluster:`` settings, the sbatch command lines, the
job wrapper's signal handling (with a stand-in ``scontrol`` on PATH) and the failure report."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml
from helpers.project import ROOT, dvc_project, run_checked

from dmlbench.errors import ConfigError
from dmlbench.params.cluster import STAGE_KINDS, ClusterConfig
from dmlbench.params.complete import parse_complete as parse_params
from dmlbench.pipeline.job import spec_path
from dmlbench.pipeline.record import StageBook
from dmlbench.pipeline.slurm import Job, Submission, failure_report, sbatch_command


def test_stage_kinds_are_the_stages_of_dvc_yaml():
    stages = yaml.safe_load((ROOT / "dvc.yaml").read_text())["stages"]
    assert set(STAGE_KINDS) == set(stages)


@pytest.mark.parametrize(
    ("cluster", "message"),
    [
        (
            {"default": {"mem": "16 GB"}},
            "cluster.default.mem: expected a number with an optional K, M, G or T suffix (sbatch --mem), e.g. "
            "16G (got '16 GB')",
        ),
        (
            {"stages": {"train": {"time": "2h"}}},
            "cluster.stages.train.time: expected minutes, H:MM:SS or D-HH:MM:SS (sbatch --time) (got '2h')",
        ),
        (
            {"stages": {"training": {"gpus": 1}}},
            "stages.training: not a stage kind of dvc.yaml; kinds: validate, download",
        ),
        (
            {"extra_args": ["--dependency=afterany:1"]},
            "extra_args '--dependency=afterany:1': each entry is one long sbatch option",
        ),
        ({"extra_args": ["-p gpu"]}, "extra_args '-p gpu': each entry is one long sbatch option"),
        ({"default": {"cpus": 0}}, "cluster.default.cpus: Input should be greater than 0"),
    ],
)
def test_bad_cluster_settings_fail_in_one_line(default_raw_params, cluster, message):
    with pytest.raises(ConfigError) as error:
        parse_params({**default_raw_params, "cluster": cluster})
    assert message in str(error.value) and "\n" not in str(error.value)


def test_sbatch_command_carries_resources_dependencies_and_the_warning_signal():
    config = ClusterConfig.model_validate({
        "partition": "gpu", "account": "dml", "qos": "long", "signal_seconds": 300, "extra_args": ["--mail-type=FAIL"],
        "default": {"cpus": 4, "mem": "32G", "time": "8:00:00"},
        "stages": {"train": {"gpus": 1, "time": "1-00:00:00"}, "report": {"cpus": 1}},
    })  # fmt: skip
    train = sbatch_command(
        "train@cub200-resnet50-triplet-512-0", config, ["11", "12"], Path("/s/log"), Path("/s"), "/v/python"
    )
    assert "--gres=gpu:1" in train and "--time=1-00:00:00" in train and "--cpus-per-task=4" in train
    assert "--mem=32G" in train and "--partition=gpu" in train and "--account=dml" in train and "--qos=long" in train
    assert "--mail-type=FAIL" in train
    assert "--dependency=afterok:11:12" in train and "--kill-on-invalid-dep=yes" in train
    assert "--signal=B:USR1@300" in train and "--requeue" in train and "--open-mode=append" in train
    assert train[-1].startswith("--wrap=export PATH=")  # the job sets its own PATH (tests/test_slurm_site.py)
    assert train[-1].endswith("; exec /v/python -m dmlbench.pipeline.job train@cub200-resnet50-triplet-512-0")
    report = sbatch_command("report", config, [], Path("/s/log"), Path("/s"), "python")
    assert "--cpus-per-task=1" in report and not any(a.startswith(("--gres", "--dependency")) for a in report)


def test_a_tune_job_that_only_waits_for_its_worker_array_asks_for_little():
    from dmlbench.launch import array_command, tunes_as_array

    config = ClusterConfig.model_validate(
        {"stages": {"tune": {"gpus": 1, "cpus": 8, "mem": "64G", "time": "2-00:00:00"}}}
    )
    stage = "tune@cub200-resnet50-triplet"
    waiting = sbatch_command(stage, config, [], Path("/s/log"), Path("/s"), "python", waits_for_array=True)
    assert "--cpus-per-task=1" in waiting and "--mem=2G" in waiting and "--time=2-00:00:00" in waiting
    assert not any(a.startswith("--gres") for a in waiting)  # no GPU held while the array waits for GPUs
    alone = sbatch_command(stage, config, [], Path("/s/log"), Path("/s"), "python")
    assert "--gres=gpu:1" in alone and "--cpus-per-task=8" in alone
    tasks = array_command(config, 4, ["python", "-m", "w", "{worker}"], Path("/s/t-%a.log"), "tune-s")
    assert "--gres=gpu:1" in tasks and "--cpus-per-task=8" in tasks
    assert tunes_as_array(4, "postgresql://u@h/optuna") and not tunes_as_array(1, "postgresql://u@h/optuna")
    assert not tunes_as_array(4, None)  # a journal file: the workers are processes inside the tune job


def test_failure_report_names_the_failed_stage_its_log_and_the_cancelled(tmp_path):
    log = tmp_path / "train.log"
    log.write_text("epoch 1\nTraceback (most recent call last):\nRuntimeError: diverged\n")
    jobs = [
        Job("train@a", "7", log),
        Job("evaluate@a", "8", tmp_path / "e.log"),
        Job("report", "9", tmp_path / "r.log"),
    ]
    text = failure_report(jobs, {"train@a": "FAILED", "evaluate@a": "CANCELLED", "report": "CANCELLED"})
    assert text.startswith(f"stage train@a FAILED (job 7); log: {log}\n") and "RuntimeError: diverged" in text
    assert text.endswith("cancelled as their dependencies failed (by Slurm, or never submitted): evaluate@a, report")


STAGE = """\
import signal, sys, time
from pathlib import Path
Path("started").write_text("yes")
try:
    for epoch in range(3000):  # 5 min unless interrupted
        Path("epoch").write_text(str(epoch))
        time.sleep(0.1)
except KeyboardInterrupt:
    Path("stopped").write_text("KeyboardInterrupt")
    sys.exit(130)
"""


def test_job_wrapper_stops_the_stage_cleanly_on_slurms_warning_and_requeues(tmp_path, small_raw_params):
    """USR1 to the wrapper reaches the stage as an interrupt (the stage sees KeyboardInterrupt) and
    the job asks Slurm to requeue it (scontrol, a recording stand-in here); nothing is recorded."""
    root = tmp_path / "repo"
    env = dvc_project(root, small_raw_params, mlflow_db=tmp_path / "mlflow.db")
    (root / "slow.py").write_text(STAGE)
    (root / "dvc.yaml").write_text(
        yaml.safe_dump(
            {"stages": {"slow": {"cmd": f"{sys.executable} slow.py", "deps": ["slow.py"], "outs": ["epoch"]}}}
        )
    )
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "scontrol").write_text(f'#!/bin/sh\necho "$@" > {tmp_path / "scontrol.args"}\n')
    (bin_dir / "scontrol").chmod(0o755)
    env = {**env, "PATH": f"{bin_dir}{os.pathsep}{env['PATH']}", "SLURM_JOB_ID": "4242"}
    with StageBook(root) as book:  # what the executor writes at submission
        spec_path("slow", root).parent.mkdir(parents=True, exist_ok=True)
        spec_path("slow", root).write_text(json.dumps(book.job_spec("slow")))
    job = subprocess.Popen([sys.executable, "-m", "dmlbench.pipeline.job", "slow"], cwd=root, env=env,
                           stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)  # fmt: skip
    deadline = time.time() + 60
    while not (root / "epoch").exists():
        assert time.time() < deadline and job.poll() is None, (
            job.stdout.read() if job.poll() is not None else "no start"
        )
        time.sleep(0.1)
    job.send_signal(signal.SIGUSR1)
    try:
        output = job.communicate(timeout=120)[0]
    except subprocess.TimeoutExpired:
        job.kill()
        pytest.fail(f"the stage did not stop within 120 s of USR1: {job.communicate()[0]}")
    assert job.returncode == 0, output  # requeued: not a failure of the job
    assert (root / "stopped").read_text() == "KeyboardInterrupt"
    assert (tmp_path / "scontrol.args").read_text().split() == ["requeue", "4242"]
    assert "requeueing job 4242" in output
    # not recorded (the executor records a job only once Slurm says COMPLETED); it runs again at once
    assert not (root / "dvc.lock").exists()
    (root / "slow.py").write_text(STAGE.replace("range(3000)", "range(2)"))
    again = run_checked([sys.executable, "-m", "dvc", "--wait-for-lock", "repro", "--single-item", "slow"], root, env)
    assert "Running stage 'slow'" in again.stdout


def test_tune_workers_go_as_one_array_with_the_tune_resources():
    from dmlbench.launch import array_command

    config = ClusterConfig.model_validate({"stages": {"tune": {"gpus": 1, "cpus": 6}}, "partition": "gpu"})
    command = ["python", "-m", "dmlbench.tune.worker", "--study", "s 1", "--worker", "{worker}"]
    args = array_command(config, 3, command, Path("/s/artifacts/logs/tune@s-%a.log"), "tune-s")
    assert "--array=0-2" in args and "--wait" in args and "--gres=gpu:1" in args and "--cpus-per-task=6" in args
    assert "--partition=gpu" in args and "--signal=B:USR1@120" in args
    assert args[-1].endswith("; exec python -m dmlbench.tune.worker --study 's 1' --worker \"$SLURM_ARRAY_TASK_ID\"")
    limited = array_command(config.model_copy(update={"max_jobs": 2}), 3, command, Path("/s/t-%a.log"), "tune-s")
    assert "--array=0-2%2" in limited


def test_a_password_in_the_tracking_uri_is_refused(monkeypatch):
    from dmlbench.tracking.store import tracking_uri

    monkeypatch.setenv("MLFLOW_TRACKING_URI", "http://alice:s3cret@mlflow.example:5001")
    with pytest.raises(ConfigError) as error:
        tracking_uri()
    assert "s3cret" not in str(error.value) and "MLFLOW_TRACKING_USERNAME and MLFLOW_TRACKING_PASSWORD" in str(
        error.value
    )
    monkeypatch.setenv("MLFLOW_TRACKING_URI", "http://mlflow.example:5001")
    assert tracking_uri() == "http://mlflow.example:5001"


def test_a_jobs_identity_says_where_it_runs_and_only_slurm_jobs_are_watched_or_cancelled(tmp_path, monkeypatch):
    """Slurm jobs, stages run here and stages never submitted are told apart by :class:`Where`, not by
    job-id strings; a state file as the executor writes it (version 1) is taken over as it is."""
    import json

    from dmlbench.params.cluster import ClusterConfig
    from dmlbench.pipeline import slurm_submission
    from dmlbench.pipeline.slurm_command import Where
    from dmlbench.pipeline.slurm_queries import JobState
    from dmlbench.pipeline.slurm_state import RunState

    state_file = tmp_path / "slurm-run.json"
    state_file.write_text(json.dumps({"version": 1, "jobs": {
        "train@a": {"stage": "train@a", "job": "12", "snapshot": {}, "submitted": 1.0, "attempts": 1,
                    "progress": None, "weight": 1}}}))  # fmt: skip
    cancelled: list[list[str]] = []
    monkeypatch.setattr(slurm_submission, "cancel", cancelled.append)
    monkeypatch.setattr(slurm_submission, "poll", lambda ids: {i: JobState("RUNNING", queued=True) for i in ids})
    order = ["prep", "tune@a", "train@a", "after", "record@a"]
    waits = {"train@a": {"prep", "tune@a"}, "after": {"train@a"}, "record@a": {"train@a"}}
    submission = Submission(order, waits, ClusterConfig.model_validate({}), tmp_path, tmp_path,
                            state=RunState(state_file))  # fmt: skip
    assert submission.adopt() == ["train@a"]
    assert submission.jobs["train@a"] == Job("train@a", "12", submission._log("train@a"))
    submission.jobs["prep"] = Job.nowhere("prep", tmp_path / "p.log")
    submission.jobs["tune@a"] = Job.here("tune@a", tmp_path / "t.log")
    submission.final["prep"] = "CANCELLED"
    assert [job.stage for job in submission.in_flight()] == ["train@a"]  # tune@a runs here: no job to watch
    assert [job.where for job in submission.jobs.values()] == [Where.SLURM, Where.NOWHERE, Where.HERE]
    assert [job.describe() for job in submission.jobs.values()] == ["job 12", "not submitted", "run here"]
    submission.jobs["after"], submission.attempts["train@a"] = Job("after", "13", tmp_path / "x.log"), 1
    submission.jobs["record@a"] = Job.here("record@a", tmp_path / "r.log")
    submission.final.clear()
    submission.pending = []
    submission._retry(submission.jobs["train@a"], "PREEMPTED")
    assert cancelled == [["13"]]  # what waits for it, in Slurm; never a stage run here
