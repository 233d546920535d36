"""The local runner killed right after a training finished, then started again at once: nothing
runs twice, nothing is trained again from epoch 0, MLflow holds one FINISHED run per training and
DVC ends up to date.

Two kills on one small glyphs grid (two trainings, side by side): ``kill -9`` of the runner
alone (its stages, in sessions of their own, run on as orphans), then ``kill -9`` of a second
runner with every process under it. A sampler counts the stage processes of this project
throughout; the MLflow store counts runs, deleted ones included (a training started over from
epoch 0 creates a new run and moves the old one to the trash)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from collections import Counter
from pathlib import Path

import pytest
import yaml
from helpers.project import dvc_project, run_checked, small_params_dict

LOSSES = ("contrastive", "triplet")
EPOCH = "train/loss"  # logged once per epoch


def _stage_processes(root: Path) -> Counter:
    """The Python stage processes running in ``root`` now, by command line (a process forked by
    one, e.g. a worker pool's, counted with its parent)."""
    commands, parents = {}, {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            argv = (entry / "cmdline").read_bytes().split(b"\0")
            if len(argv) < 2 or not argv[1].startswith(b"stages/") or os.readlink(entry / "cwd") != str(root):
                continue
            parents[entry.name] = (entry / "stat").read_text().rsplit(")", 1)[1].split()[1]
        except OSError:
            continue
        commands[entry.name] = b" ".join(argv[1:]).decode()
    return Counter(command for pid, command in commands.items() if commands.get(parents[pid]) != command)


class Sampler(threading.Thread):
    """The most copies of one stage command seen at once, sampled every 20 ms."""

    def __init__(self, root: Path):
        super().__init__(daemon=True)
        self.root, self.most, self.stop = root, Counter(), threading.Event()

    def run(self) -> None:
        while not self.stop.wait(0.02):
            for command, count in _stage_processes(self.root).items():
                self.most[command] = max(self.most[command], count)


def _descendants(pid: int) -> list[int]:
    children = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                parent = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue
            children.setdefault(parent, []).append(int(entry.name))
    found, todo = [], [pid]
    while todo:
        for child in children.get(todo.pop(), []):
            found.append(child)
            todo.append(child)
    return found


def _run_until_a_training_is_done(root: Path, env: dict[str, str], skip: set[str]) -> tuple[subprocess.Popen, str]:
    """Start the runner; return it once it says a training not in ``skip`` is done (0.5 s later)."""
    runner = subprocess.Popen([sys.executable, "-m", "dmlbench.pipeline", "--jobs", "2"], cwd=root, env=env,
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)  # fmt: skip
    assert runner.stdout is not None
    for line in runner.stdout:
        if line.startswith("done") and "train@" in line:
            stage = line.split()[1]
            if stage not in skip:
                time.sleep(0.5)
                return runner, stage
    raise AssertionError(f"the runner ended ({runner.wait()}) before a training was done")


def _training_runs(tracking_uri: str) -> dict[str, list]:
    """Every training run, deleted ones included, by grid key."""
    from mlflow.entities import ViewType
    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri)
    experiments = [e.experiment_id for e in client.search_experiments(view_type=ViewType.ALL)]
    runs = client.search_runs(experiments, "tags.kind = 'train'", run_view_type=ViewType.ALL, max_results=1000)
    by_key: dict[str, list] = {}
    for run in runs:
        by_key.setdefault(run.data.tags["grid_key"], []).append(run)
    return by_key


RUNNER = """
import sys
from pathlib import Path
from dmlbench.pipeline.local import run_parallel
from dmlbench.pipeline.plan import make_plan
sys.exit(1 if run_parallel(make_plan(Path(".")), 2, [], record_every=3600, progress=False) else 0)
"""


def test_an_orphaned_stage_is_waited_for_and_recorded_and_a_finished_one_is_not_run_again(tmp_path):
    """kill -9 of the runner alone while train@1 runs (held by the test) and train@0 has finished
    but is not in dvc.lock yet (batches every hour): a runner started at once waits for the orphaned
    train@1 instead of starting it beside itself, records both from their notes without running
    them, and DVC ends up to date."""
    from test_record import PIPELINE, WORK, dvc_status, env

    root = tmp_path / "repo"
    root.mkdir()
    (root / "dvc.yaml").write_text(yaml.safe_dump(PIPELINE, sort_keys=False))
    (root / "params.yaml").write_text("size: 3\nseeds: [0, 1]\n")
    (root / "work.py").write_text("import sys\nopen('starts.log', 'a').write(sys.argv[1] + '\\n')\n" + WORK)
    (root / "input.txt").write_text("input\n")
    for command in (["git", "init", "-q"], [sys.executable, "-m", "dvc", "init", "-q"]):
        subprocess.run(command, cwd=root, check=True, env=env())
    (root / "slow").write_text("")
    first = subprocess.Popen([sys.executable, "-c", RUNNER], cwd=root, env=env(), stdout=subprocess.DEVNULL)
    deadline = time.monotonic() + 120
    while not ((root / "started/train-1").exists() and (root / "out/train-0/part").exists()):
        assert first.poll() is None and time.monotonic() < deadline, "the run ended or stalled"
        time.sleep(0.05)
    note, deadline = root / "artifacts/logs/stages/train@0.json", time.monotonic() + 10
    while not (note.exists() and "completed" in note.read_text()) and time.monotonic() < deadline:
        time.sleep(0.05)  # its wrapper notes it completed (at once), the runner queues its lock entry
    time.sleep(0.5)
    first.kill()
    first.wait()
    orphan = int((root / "started/train-1").read_text())
    os.kill(orphan, 0)  # still running: its own session
    second = subprocess.Popen([sys.executable, "-c", RUNNER], cwd=root, env=env(), stdout=subprocess.PIPE, text=True)
    assert second.stdout is not None
    release = threading.Timer(30, (root / "release").write_text, ("",))  # whatever happens, the orphan ends
    release.start()
    lines = []
    for line in second.stdout:
        lines.append(line)
        if line.startswith("wait   train@1"):
            (root / "release").write_text("")  # let the orphan finish
    assert second.wait() == 0, "".join(lines)
    release.cancel()
    said = "".join(lines)
    assert "done   train@0 (completed in an earlier run; recorded now)" in said
    assert "done   train@1 (completed in an earlier run; recorded now)" in said
    assert "done   prep (completed in an earlier run; recorded now)" in said
    assert sorted((root / "starts.log").read_text().split()) == ["prep", "report", "train-0", "train-1"]  # once each
    assert "up to date" in dvc_status(root)
    assert not list((root / "artifacts/logs/stages").glob("*.json"))  # every note served and went


@pytest.mark.slow
def test_a_runner_killed_after_a_training_finished_loses_nothing_and_runs_nothing_twice(tmp_path, default_raw_params):
    raw = small_params_dict(default_raw_params)
    raw["losses"] = {loss: raw["losses"][loss] for loss in LOSSES}
    raw["dims"], raw["seeds"] = [32], [0]
    raw["protocols"][raw["protocol"]]["epochs"] = 3
    root = tmp_path / "repo"
    env = dvc_project(root, raw, mlflow_db=tmp_path / "store" / "mlflow.db")
    env["PYTHONUNBUFFERED"] = "1"
    sampler = Sampler(root.resolve())
    sampler.start()

    # 1. kill -9 of the runner alone, 0.5 s after a training finished: its other stages run on
    first, done_first = _run_until_a_training_is_done(root, env, set())
    first.kill()
    first.wait()
    # 2. at once a new runner; kill -9 of it and everything under it after the next training finished
    second, done_second = _run_until_a_training_is_done(root, env, {done_first})
    tree = _descendants(second.pid)
    second.kill()
    for pid in tree:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    second.wait()
    # 3. at once again, to the end
    third = run_checked([sys.executable, "-m", "dmlbench.pipeline", "--jobs", "2"], root, env)
    sampler.stop.set()
    sampler.join()

    from mlflow.tracking import MlflowClient

    client = MlflowClient(env["MLFLOW_TRACKING_URI"])
    runs = _training_runs(env["MLFLOW_TRACKING_URI"])
    found = {
        "twice": {command: count for command, count in sampler.most.items() if count > 1},
        "runs": {key: sorted(run.info.status for run in group) for key, group in runs.items()},
        "epochs": {
            key: sorted(m.step for run in group for m in client.get_metric_history(run.info.run_id, EPOCH))
            for key, group in runs.items()
        },  # fmt: skip
        "status": run_checked([sys.executable, "-m", "dvc", "status"], root, env).stdout.strip(),
    }
    print({"killed after": [done_first, done_second], **found})
    assert not found["twice"], f"stage processes ran beside a copy of themselves: {found['twice']}"
    assert len(runs) == len(LOSSES)
    for key, statuses in found["runs"].items():
        assert statuses == ["FINISHED"], f"{key}: runs {statuses} (deleted ones included): trained again from epoch 0"
        assert found["epochs"][key] == [1, 2, 3], f"{key}: epochs logged {found['epochs'][key]}"
    assert "Data and pipelines are up to date" in third.stdout
    assert "up to date" in found["status"], found["status"]


def test_a_training_whose_finished_model_is_there_returns_at_once_with_its_one_run(
    tmp_path, small_raw_params, prepared_glyphs, monkeypatch, capsys
):
    """The stage's command cut after the model was written (while embedding): run again, the training
    returns its model at once and keeps its one FINISHED MLflow run; a model that is not the one
    trained (edited) is trained again."""
    import torch
    from mlflow.entities import ViewType
    from mlflow.tracking import MlflowClient

    from dmlbench import paths
    from dmlbench.grid import RunSpec
    from dmlbench.params.load import parse_params
    from dmlbench.train.stage import train_stage

    raw = {**small_raw_params, "losses": {"contrastive": small_raw_params["losses"]["contrastive"]}}
    params, run = parse_params({**raw, "dims": [32], "seeds": [0]}), RunSpec("glyphs", "tiny_cnn", "contrastive", 32, 0)
    (tmp_path / "artifacts" / "prepared").mkdir(parents=True)
    (tmp_path / "artifacts" / "prepared" / "glyphs").symlink_to(prepared_glyphs[0] / "prepared")
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("DVC_ROOT", raising=False)
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    monkeypatch.setenv("MLFLOW_TRACKING_URI", uri)
    first = train_stage(params, run, device=torch.device("cpu"))
    capsys.readouterr()
    again = train_stage(params, run, device=torch.device("cpu"))
    assert "already trained for this config, code and data" in capsys.readouterr().out
    assert again["mlflow_run_id"] == first["mlflow_run_id"]
    client = MlflowClient(uri)
    experiments = [e.experiment_id for e in client.search_experiments(view_type=ViewType.ALL)]

    def statuses() -> list[str]:
        found = client.search_runs(experiments, "tags.kind = 'train'", run_view_type=ViewType.ALL)
        return sorted(r.info.status for r in found)

    assert statuses() == ["FINISHED"]
    model = paths.model_dir(run) / "model.pt"
    model.write_bytes(model.read_bytes() + b"edited")
    third = train_stage(params, run, device=torch.device("cpu"))
    assert third["mlflow_run_id"] != first["mlflow_run_id"] and statuses() == ["FINISHED", "FINISHED"]
