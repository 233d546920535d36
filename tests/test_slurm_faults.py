"""Faults of a multi-day run on Slurm, injected into the stand-in Slurm (:mod:`helpers.fake_slurm`), each
asserting that nothing is lost and nothing runs twice.

The grid: ``prep``, trainings ``train@<item>`` that checkpoint every epoch into a persistent output
and note each start (``start <epoch>``) in a scratch file, and ``join`` after them. A training
started over from epoch 0 notes ``start 0`` twice; a job submitted twice shows in ``sbatch.jsonl``."""

from __future__ import annotations

import re
import signal
import subprocess
import sys
import threading
import time
from collections import Counter
from pathlib import Path

import pytest
import yaml
from helpers.fake_slurm import inject, started, submitted
from helpers.project import dvc_project, run_checked
from test_cluster_pipeline import slurm  # noqa: F401 (the local Slurm's fixture)

from dmlbench.params.cluster import ClusterConfig
from dmlbench.pipeline.slurm_endings import ending_hint, never_hint
from dmlbench.pipeline.slurm_queries import site_max_jobs

TRAIN = """\
import os, sys, time
name, epochs, seconds = sys.argv[1], int(sys.argv[2]), float(sys.argv[3])
seconds *= 1 + sum(map(ord, name)) % 3  # trainings of different lengths
state = os.path.join("ckpt", name, "epoch")
os.makedirs(os.path.dirname(state), exist_ok=True)
done = int(open(state).read()) if os.path.exists(state) else 0
with open(f"starts-{name}.txt", "a") as starts:
    starts.write(f"start {done}\\n")
for epoch in range(done + 1, epochs + 1):
    time.sleep(seconds)
    while epoch > 1 and os.path.exists(f"hold-{name}"):  # held by the test after its first epoch
        time.sleep(0.1)
    with open(state + ".tmp", "w") as out:
        out.write(str(epoch))
    os.replace(state + ".tmp", state)
open(f"model-{name}", "w").write(f"{name} {epochs}")
"""


EPOCHS = 5


def _grid(items: list[str], epochs: int = EPOCHS, seconds: float = 0.4) -> dict:
    return {"stages": {
        "prep": {"cmd": "python -c \"open('prepared', 'w').write('p')\"", "outs": ["prepared"]},
        "train": {"foreach": items, "do": {
            "cmd": f"python train.py ${{item}} {epochs} {seconds}", "deps": ["prepared", "train.py"],
            "outs": ["model-${item}", {"ckpt/${item}": {"persist": True, "cache": False}}]}},
        "join": {"cmd": f"cat {' '.join(f'model-{i}' for i in items)} > joined",
                 "deps": [f"model-{i}" for i in items], "outs": ["joined"]},
    }}  # fmt: skip


def _project(tmp_path: Path, raw: dict, items: list[str], **cluster) -> tuple[Path, dict[str, str], Path]:
    from helpers.fake_slurm import install

    root = tmp_path / "repo"
    settings = {"poll_seconds": [0.2, 0.5], "default": {"cpus": 1, "mem": "1G", "time": "10"}, **cluster}
    env = dvc_project(root, {**raw, "cluster": settings}, mlflow_db=tmp_path / "store" / "mlflow.db")
    (root / "train.py").write_text(TRAIN)
    (root / "dvc.yaml").write_text(yaml.safe_dump(_grid(items)))
    state = tmp_path / "slurm"
    env.update(install(tmp_path / "bin", state), PYTHONUNBUFFERED="1")
    return root, env, state


def _start(root: Path, env: dict[str, str], *args: str) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "dmlbench.pipeline", "--executor", "slurm", *args], cwd=root,
                            env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)  # fmt: skip


def _pipeline(root: Path, env: dict[str, str], *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "dmlbench.pipeline", "--executor", "slurm", *args], cwd=root,
                          env=env, capture_output=True, text=True, timeout=300, check=False)  # fmt: skip


def _until(runner: subprocess.Popen, pattern: str, seen: list[str]) -> str:
    """Read the runner's output until a line matches ``pattern``; that line."""
    assert runner.stdout is not None
    for line in runner.stdout:
        seen.append(line)
        if re.search(pattern, line):
            return line
    raise AssertionError(f"the run ended ({runner.wait()}) before /{pattern}/:\n{''.join(seen)}")


def _names(state: Path) -> Counter:
    return Counter(next(a for a in call["args"] if a.startswith("--job-name=")).split("=", 1)[1]
                   for call in submitted(state))  # fmt: skip


def _job_states(state: Path) -> dict[str, str]:
    jobs = state / "jobs"
    return {p.name: p.read_text().strip() for p in jobs.iterdir() if p.name.isdigit()}


def _starts(root: Path, item: str) -> list[int]:
    return [int(line.split()[1]) for line in (root / f"starts-{item}.txt").read_text().splitlines()]


def _assert_whole(root: Path, env: dict[str, str], items: list[str]) -> None:
    """Every training ran to its end from epoch 0 once; DVC has every stage; no run state is left."""
    for item in items:
        assert _starts(root, item).count(0) == 1, f"train@{item} started from epoch 0 {_starts(root, item)}"
    assert (root / "joined").read_text() == "".join(f"{i} {EPOCHS}" for i in items)
    assert "up to date" in run_checked([sys.executable, "-m", "dvc", "status"], root, env).stdout
    assert not (root / "artifacts" / "logs" / "slurm-run.json").exists()


@pytest.mark.slow
def test_a_submitter_killed_then_terminated_mid_grid_loses_and_repeats_nothing(tmp_path, small_raw_params):
    items = [f"{loss}{seed}" for loss in ("c", "t", "m") for seed in (0, 1)]  # 3 losses x 2 seeds
    root, env, state = _project(tmp_path, small_raw_params, items, max_jobs=3)
    from dmlbench.pipeline.plan import make_plan

    held = next(stage for stage in make_plan(root).order if stage.startswith("train@"))  # submitted first
    hold = root / f"hold-{held.split('@')[1]}"  # it waits after its first epoch while this exists
    hold.touch()
    seen: list[str] = []
    # 1. SIGKILL once a training job completed: its jobs go on in Slurm
    first = _start(root, env)
    _until(first, r"^done +train@", seen)
    first.kill()
    first.wait()
    running = [job for job, s in _job_states(state).items() if s in ("RUNNING", "PENDING")]
    deadline = time.monotonic() + 120
    while sum(_job_states(state)[job] == "COMPLETED" for job in running) < 1 and time.monotonic() < deadline:
        time.sleep(0.1)  # one of them completes while nobody watches (the held one does not)
    # 2. started again: takes the jobs over; SIGTERM once it recorded a training: it detaches
    second = _start(root, env)
    wanted = [rf"^adopted +{held} \(job \d+, running\)", r"completed while nobody watched; recorded now"]
    while not all(re.search(p, "".join(seen), re.MULTILINE) for p in wanted):
        _until(second, "|".join(wanted), seen)
    hold.unlink()
    _until(second, rf"^done +{held} \(job \d+\)", seen)
    second.send_signal(signal.SIGTERM)
    rest = second.communicate(timeout=60)[0]
    assert second.returncode == 0 and "detached:" in rest and "--attach" in rest, rest
    assert "CANCELLED" not in _job_states(state).values()  # the jobs went on
    # 3. --detach: records what completed meanwhile, submits what it can, returns
    detached = _pipeline(root, env, "--detach")
    assert detached.returncode == 0 and "detached:" in detached.stderr, detached.stdout + detached.stderr
    # 4. --attach: to the end
    attached = _pipeline(root, env, "--attach")
    assert attached.returncode == 0, attached.stdout + attached.stderr
    twice = {name: count for name, count in _names(state).items() if count > 1}
    assert not twice, f"submitted more than once: {twice}"
    assert set(_names(state)) == {"prep", "join", *(f"train@{i}" for i in items)}
    _assert_whole(root, env, items)
    assert "Data and pipelines are up to date" in attached.stdout
    again = _pipeline(root, env, "--attach")  # nothing left to attach to: one line
    assert again.returncode == 2 and "--attach: no job of an earlier run" in again.stderr


@pytest.mark.slow
def test_preemption_node_failure_requeue_refusals_and_a_hold_are_survived(tmp_path, small_raw_params):
    items = ["a", "b", "c"]
    root, env, state = _project(tmp_path, small_raw_params, items)
    inject(state, {"refuse": 3, "message": "Job violates accounting/QOS policy (job submit limit)"},
           {"name": "train@a", "state": "PREEMPTED", "when": "ckpt/a/epoch"},
           {"name": "train@b", "state": "NODE_FAIL", "when": "ckpt/b/epoch"},
           {"name": "train@c", "state": "REQUEUED", "when": "ckpt/c/epoch"},
           {"name": "join", "reason": "JobHeldUser", "seconds": 1.5})  # fmt: skip
    result = _pipeline(root, env)
    out = result.stdout + result.stderr
    assert result.returncode == 0, out
    assert len((state / "refused.jsonl").read_text().splitlines()) == 3
    assert "sbatch refused prep 3 times: Job violates accounting/QOS policy (job submit limit)" in out
    assert re.search(r"PREEMPTED +train@a \(job \d+\): submitted again \(attempt 2 of at most 4\)", out), out
    assert re.search(r"NODE_FAIL +train@b \(job \d+\): submitted again", out), out
    assert re.search(r"cannot start: JobHeldUser; held by you: scontrol release \d+", out), out
    names = _names(state)  # a, b submitted again; c requeued under its id; join (cancelled with a's job) again
    assert {name: names[name] for name in ("prep", "train@a", "train@b", "train@c")} == {
        "prep": 1, "train@a": 2, "train@b": 2, "train@c": 1}  # fmt: skip
    ran = Counter(start["name"] for start in started(state))
    assert ran == Counter({"prep": 1, "train@a": 2, "train@b": 2, "train@c": 2, "join": 1})
    for item in items:  # each went on from its checkpoint
        starts = _starts(root, item)
        assert len(starts) == 2 and starts[0] == 0 and starts[1] >= 1, (item, starts)
    _assert_whole(root, env, items)


@pytest.mark.slow
def test_timeout_and_out_of_memory_end_with_the_setting_to_raise(tmp_path, small_raw_params):
    items = ["a", "b"]
    root, env, state = _project(tmp_path, small_raw_params, items, stages={"train": {"mem": "1500M"}})
    inject(state, {"name": "train@a", "state": "TIMEOUT", "after": 0.8},
           {"name": "train@b", "state": "OUT_OF_MEMORY", "after": 0.8})  # fmt: skip
    result = _pipeline(root, env)
    out = result.stdout + result.stderr
    assert result.returncode == 1, out
    assert "train@a reached its time limit, cluster.stages.train.time = 10: raise it in params.yaml" in out
    assert "train@b ran out of memory, cluster.stages.train.mem = 1500M: raise it in params.yaml" in out
    assert _names(state) == Counter({"prep": 1, "train@a": 1, "train@b": 1, "join": 1})  # none submitted again
    assert Counter(start["name"] for start in started(state)) == Counter({"prep": 1, "train@a": 1, "train@b": 1})
    assert not (root / "artifacts" / "logs" / "slurm-run.json").exists()


def test_a_retryable_ending_stops_being_retried_at_max_retries_or_without_progress(tmp_path, monkeypatch):
    from dmlbench.pipeline import slurm_submission
    from dmlbench.pipeline.slurm_queries import JobState
    from dmlbench.pipeline.slurm_submission import Job, Submission

    config = ClusterConfig.model_validate({"max_retries": 2})
    order = ["s", "after"]
    submission = Submission(order, {"after": {"s"}}, config, tmp_path, tmp_path / "logs")
    monkeypatch.setattr(slurm_submission, "cancel", lambda ids: None)
    fingerprint = iter(["1", "1", "2", "2"])
    monkeypatch.setattr(slurm_submission, "progress", lambda spec: next(fingerprint))
    submission.pending = []
    states = []
    for attempt, job_id in enumerate(["10", "11", "12"], start=1):
        submission.jobs = {"s": Job("s", job_id, tmp_path / "s.log"), "after": Job("after", "99", tmp_path / "a.log")}
        submission.attempts["s"], submission.progress_at["s"] = attempt, "1"
        gone = {job_id: JobState("PREEMPTED")}
        submission.record(gone)  # seen once: Slurm may still requeue it
        submission.record(gone)
        states.append((list(submission.pending), dict(submission.final)))
        submission.pending, submission.final = [], {}
    # attempt 1: retried (with what waits for it); attempt 2: its checkpoint did not move ("1" again)
    assert states[0] == (["s", "after"], {})
    assert states[1][1]["s"] == "PREEMPTED" and states[1][0] == []
    # attempt 3 > max_retries: not retried whatever the progress
    assert states[2][1]["s"] == "PREEMPTED"


def test_one_line_hints_and_the_site_submit_limit(tmp_path, monkeypatch):
    from helpers.fake_slurm import install

    config = ClusterConfig.model_validate({"stages": {"train": {"time": "2-00:00:00", "mem": "64G"}}})
    assert ending_hint("train@x", "TIMEOUT", config).endswith(
        "cluster.stages.train.time = 2-00:00:00: raise it in params.yaml and run again (a training resumes from "
        "its checkpoint)")  # fmt: skip
    assert "cluster.stages.train.mem = 64G" in ending_hint("train@x", "OUT_OF_MEMORY", config)
    assert ending_hint("train@x", "FAILED", config) == ""
    line = never_hint("train@x", "7", "PartitionTimeLimit", config)
    assert line is not None and "time limit cluster.stages.train.time = 2-00:00:00 is above" in line
    assert never_hint("train@x", "7", "Priority", config) is None and never_hint("x", "7", "Resources", config) is None
    for key, value in install(tmp_path / "bin", tmp_path / "slurm").items():
        monkeypatch.setenv(key, value)
    assert site_max_jobs() is None  # sacctmgr does not answer
    (tmp_path / "slurm" / "sacctmgr.txt").write_text("40|normal\n")
    assert site_max_jobs() == 40  # (no job of this user queued)


def test_a_gpu_share_is_asked_in_the_sites_units(monkeypatch):
    from subprocess import CompletedProcess

    from dmlbench.launch import resource_args
    from dmlbench.pipeline import slurm_queries

    said = "gpu:a100:4(S:0-1),shard:a100:32(S:0-1)\ngpu:2,shard:8\n(null)\n"
    monkeypatch.setattr(slurm_queries, "_run", lambda argv, timeout=60.0: CompletedProcess(argv, 0, said, ""))
    assert slurm_queries.gres_per_gpu("shard") == 4  # 32/4 = 8 and 8/2 = 4 on the nodes: the fewer
    assert slurm_queries.gres_per_gpu("mps") is None
    shard = ClusterConfig.model_validate({"default": {"gpus": 1}, "gpu_slots": 4, "shares_per_gpu": 8})
    assert "--gres=shard:2" in resource_args(shard, shard.resources("train@x"))  # 8 shards per GPU / 4 slots
    mps = ClusterConfig.model_validate({"default": {"gpus": 1}, "gpu_slots": 3, "shared_gres": "mps",
                                        "shares_per_gpu": 1000})  # fmt: skip
    assert "--gres=mps:333" in resource_args(mps, mps.resources("train@x"))


def test_a_worker_array_on_anything_but_postgresql_is_refused_in_one_line():
    from dmlbench.errors import DmlbenchError
    from dmlbench.params.tuning import TuningConfig
    from dmlbench.pipeline.cluster_checks import require_array_storage

    with pytest.raises(DmlbenchError, match=r"tuning.storage is sqlite, and tuning.workers: 4 runs the workers as a"):
        require_array_storage(TuningConfig(workers=4, storage="sqlite:///optuna.db"))
    require_array_storage(TuningConfig(workers=4, storage="postgresql://u@db/optuna"))
    require_array_storage(TuningConfig(workers=4))  # a journal: the workers run in the tune job
    require_array_storage(TuningConfig(workers=1, storage="sqlite:///optuna.db"))  # no array


def test_a_local_run_refuses_while_slurm_holds_stages_of_an_earlier_run(tmp_path, monkeypatch, capsys):
    from dmlbench.pipeline.__main__ import main
    from dmlbench.pipeline.slurm_state import STATE_FILE, RunState

    root = Path(__file__).resolve().parents[1]
    monkeypatch.chdir(tmp_path)
    (tmp_path / "params.yaml").write_text((root / "params.yaml").read_text())
    state = RunState(tmp_path / "artifacts" / "logs" / STATE_FILE)
    state.submitting("train@x", {}, 1, None)
    state.submitted("train@x", "17")
    assert main(["--jobs", "2"]) == 2
    assert "1 stage(s) of an earlier run are in Slurm's hands" in capsys.readouterr().err


@pytest.mark.cluster
def test_on_the_local_slurm_a_killed_submitter_is_taken_over(tmp_path, small_raw_params, slurm):  # noqa: F811
    """The same take-over on a real Slurm (``make cluster-up``): its ``squeue``/``sacct`` formats,
    reasons and ``--name`` lookups. SIGKILL while a training runs (held after its first epoch); a
    hold on ``join``; the submitter started again adopts the jobs, names the hold in one line,
    and once both are released runs to the end with every stage in one job."""
    items = ["a", "b"]
    root = tmp_path / "repo"
    settings = {"poll_seconds": [0.5, 2.0], "default": {"cpus": 1, "mem": "200M", "time": "10"}}
    env = dvc_project(root, {**small_raw_params, "cluster": settings}, mlflow_db=tmp_path / "store" / "mlflow.db")
    env.update(slurm, PYTHONUNBUFFERED="1")
    (root / "train.py").write_text(TRAIN)
    (root / "dvc.yaml").write_text(yaml.safe_dump(_grid(items)))
    (root / "hold-a").touch()
    seen: list[str] = []
    first = _start(root, env)
    _until(first, r"submitted to Slurm", seen)
    deadline = time.monotonic() + 300
    while not (root / "ckpt" / "a" / "epoch").exists():
        assert time.monotonic() < deadline and first.poll() is None, "".join(seen)
        time.sleep(0.2)
    first.kill()
    first.wait()
    queued = run_checked(["squeue", "--me", "--noheader", "--name=join", "--format=%i|%Z"], root, env).stdout
    join = [line.split("|")[0] for line in queued.splitlines() if line.endswith(f"|{root}")]
    assert len(join) == 1, queued
    run_checked(["scontrol", "hold", join[0]], root, env)
    second = _start(root, env)
    threading.Timer(600, second.kill).start()  # (a regression that waits forever fails)
    _until(second, rf"job {join[0]} \(join\) cannot start: JobHeld(User|Admin)", seen)  # (root's hold: an admin's)
    assert re.search(r"^adopted +train@a \(job \d+, running\)", "".join(seen), re.MULTILINE), "".join(seen)
    run_checked(["scontrol", "release", join[0]], root, env)
    (root / "hold-a").unlink()
    out = second.communicate(timeout=600)[0]
    assert second.returncode == 0, "".join(seen) + out
    listed = run_checked(["sacct", "-X", "-n", "-P", "--starttime=now-1hours", "--format=JobName%100,WorkDir%300"],
                         root, env).stdout  # fmt: skip
    names = Counter(line.split("|")[0] for line in listed.splitlines() if line.endswith(f"|{root}"))
    assert names == Counter({"prep": 1, "train@a": 1, "train@b": 1, "join": 1}), listed
    _assert_whole(root, env, items)


def test_a_tune_job_started_again_waits_for_its_array_and_a_stopped_one_cancels_it(tmp_path, monkeypatch):
    from subprocess import CompletedProcess

    from dmlbench import launch
    from dmlbench.errors import DmlbenchError

    monkeypatch.chdir(tmp_path)
    calls: list[list[str]] = []
    queued = {"left": 2}  # the earlier array is listed twice more, then gone

    def run(argv, **kwargs):
        calls.append(argv)
        if argv[0] == "squeue" and "--me" in argv:
            return CompletedProcess(argv, 0, f"41|{tmp_path}\n41|/elsewhere\n", "")
        if argv[0] == "squeue":
            queued["left"] -= 1
            return CompletedProcess(argv, 0, "41_1\n" if queued["left"] > 0 else "", "")
        if argv[0] == "sacct":
            return CompletedProcess(argv, 0, "41_0|COMPLETED\n41_1|COMPLETED\n", "")
        raise AssertionError(f"not expected: {argv}")

    monkeypatch.setattr(launch.subprocess, "run", run)
    monkeypatch.setattr(launch.time, "sleep", lambda seconds: None)
    config = ClusterConfig()
    launch.run_array(config, 2, ["python", "w", "{worker}"], tmp_path / "t-%a.log", "tune-s")
    assert not [argv for argv in calls if argv[0] == "sbatch"]  # no second array

    def interrupted(argv, **kwargs):
        calls.append(argv)
        if argv[0] == "squeue":
            return CompletedProcess(argv, 0, "", "")
        if argv[0] == "sbatch":
            raise KeyboardInterrupt  # the tune job stopped while its array runs
        return CompletedProcess(argv, 0, "", "")

    monkeypatch.setattr(launch.subprocess, "run", interrupted)
    with pytest.raises(KeyboardInterrupt):
        launch.run_array(config, 2, ["python", "w", "{worker}"], tmp_path / "t-%a.log", "tune-s")
    assert calls[-1] == ["scancel", "--me", "--name=tune-s"]
    monkeypatch.setattr(launch.subprocess, "run", lambda argv, **kwargs: CompletedProcess(argv, 1, "", "boom"))
    with pytest.raises(DmlbenchError, match="tune-s: the worker array"):
        launch.run_array(config, 2, ["python", "w", "{worker}"], tmp_path / "t-%a.log", "tune-s")
