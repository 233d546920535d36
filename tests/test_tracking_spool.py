"""Tracking that never stops a training: every record goes through a local spool, sent by a thread of
its own, replayed once each after an outage (:mod:`dmlbench.tracking.spool`).

* a replay after a lost answer (the server took records the process never noted) sends nothing twice;
* a training whose store never answers finishes; its records wait and are replayed later, in full;
* a real ``mlflow server`` (SQLite, 127.0.0.1) stopped mid-training and restarted: the training
  never stops, every epoch is logged exactly once. The outage here lasts seconds (and MLflow's
  client retries nothing, so the pre-spool code stopped the training at once); the mechanism has no
  clock: the sender retries a record until the store takes it, however long the outage.
"""

from __future__ import annotations

import copy
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.request
from pathlib import Path

import pytest
import torch

from dmlbench import paths
from dmlbench.grid import RunSpec
from dmlbench.io import read_json, write_json
from dmlbench.params.load import parse_params
from dmlbench.tracking import spool as spool_module
from dmlbench.tracking.spool import RECORDS, STATE, replay
from dmlbench.tracking.spooled import StageTracking

RESOLVED = {"protocol": {"name": "demo", "lr": 0.001}, "loss": {"name": "contrastive", "neg_margin": 0.5}, "seed": 0}
RUN = RunSpec("glyphs", "tiny_cnn", "contrastive", 32, 0)


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def _training_runs(experiment: str = "dmlbench") -> list:
    from dmlbench.tracking.store import client

    store = client()
    return store.search_runs([store.get_experiment_by_name(experiment).experiment_id], "tags.kind = 'train'")


def _steps(run_id: str, key: str = "train/loss") -> list[int]:
    from dmlbench.tracking.store import client

    return sorted(m.step for m in client().get_metric_history(run_id, key))


def test_a_replay_after_a_lost_answer_sends_nothing_twice(mlflow_store, tmp_path):
    directory = tmp_path / "spool"
    with StageTracking(directory, wait_seconds=60) as tracking:
        cell = tracking.cell_run("exp", RUN.combo, RESOLVED)
        run = tracking.training_run("run", RUN, RESOLVED, "hash1", "exp", resume=False, parent=cell, code="c")
        for epoch in (1, 2, 3):
            run.log_metrics({"train/loss": 1.0 / epoch, "train/lr": 0.1}, step=epoch)
        run.set_tags({"note": "x"})
        run.finish()
        assert tracking.flush()
        records = (directory / RECORDS).read_text()
        cell_id, run_id = tracking.spool.runs["cell"], tracking.spool.runs["run"]
    assert not (directory / RECORDS).exists()  # all sent: the spool is emptied
    # the process died after the store took every record but before it noted more than the first one,
    # the last line torn by the kill
    (directory / RECORDS).write_text(records + '{"seq": 99, "op": "met')
    write_json(directory / STATE, {"acked": 1, "runs": {"cell": cell_id}})
    assert replay(directory, timeout=60) == 0
    (found,) = _training_runs("exp")  # the run opened by the lost answer is found by its key, not created again
    assert found.info.run_id == run_id and found.info.status == "FINISHED"
    assert found.data.tags["mlflow.parentRunId"] == cell_id and found.data.tags["note"] == "x"
    assert _steps(run_id) == [1, 2, 3] and _steps(run_id, "train/lr") == [1, 2, 3]
    assert not (directory / RECORDS).exists() and read_json(directory / STATE)["acked"] == len(records.splitlines())


def _params(small_raw_params, epochs: int):
    raw = copy.deepcopy(small_raw_params)
    raw["protocols"][raw["protocol"]].update(epochs=epochs)
    return parse_params(raw)


def _glyphs(in_project: Path, prepared_glyphs) -> None:
    root, _ = prepared_glyphs
    (in_project / "artifacts" / "prepared").mkdir(parents=True)
    (in_project / "artifacts" / "prepared" / "glyphs").symlink_to(root / "prepared")


def test_a_training_whose_store_never_answers_finishes_and_its_records_are_replayed_later(
    small_raw_params, prepared_glyphs, in_project, tmp_path, monkeypatch, capsys
):
    from dmlbench.tracking import replay as replay_command
    from dmlbench.train.stage import train_stage

    _glyphs(in_project, prepared_glyphs)
    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"http://127.0.0.1:{_free_port()}")  # nothing listens there
    monkeypatch.setenv("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "0")
    monkeypatch.setenv("DMLBENCH_TRACKING_FLUSH_SECONDS", "1")
    monkeypatch.setattr(spool_module, "RETRY_SECONDS", (0.2, 0.5))
    run = RunSpec("glyphs", "tiny_cnn", "contrastive", 32, 0)
    info = train_stage(_params(small_raw_params, epochs=3), run, device=torch.device("cpu"))
    assert info["epochs_trained"] == 3 and (paths.model_dir(run) / "model.pt").is_file()
    assert info["mlflow_run_id"] is None  # never opened: the store never answered
    err = capsys.readouterr().err
    assert "the tracking store does not answer" in err and "python -m dmlbench.tracking.replay" in err
    waiting = [json.loads(line) for line in (paths.spool_dir(run) / RECORDS).read_text().splitlines()]
    assert [r["step"] for r in waiting if r["op"] == "metrics" and "train/loss" in r["metrics"]] == [1, 2, 3]
    # a replay while the store still does not answer keeps every record
    assert replay_command.main(["--timeout", "1"]) == 1
    assert "record(s) still wait" in capsys.readouterr().err
    assert [json.loads(line) for line in (paths.spool_dir(run) / RECORDS).read_text().splitlines()] == waiting
    # the store answers again (here: another one); the command sends everything, once
    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"sqlite:///{tmp_path / 'mlflow.db'}")
    assert replay_command.main([]) == 0
    assert "records of 1 training(s) sent" in capsys.readouterr().err
    (found,) = _training_runs()
    assert found.info.status == "FINISHED" and _steps(found.info.run_id) == [1, 2, 3]
    assert found.data.params["protocol.epochs"] == "3" and found.data.tags["grid_key"] == run.grid_key
    assert found.data.tags["artifact.model.md5"] and found.data.metrics["selected_epoch"] >= 1
    from dmlbench.tracking.store import client

    assert {a.path for a in client().list_artifacts(found.info.run_id)} == {"config.yaml", "history.json"}
    assert client().get_run(found.info.run_id).inputs.dataset_inputs[0].dataset.name == "glyphs"
    assert replay_command.main([]) == 0  # nothing left: a second replay sends nothing
    assert _steps(found.info.run_id) == [1, 2, 3]


class MlflowServer:
    """``mlflow server`` on 127.0.0.1 with a SQLite store, in a session of its own (stopped as a group)."""

    def __init__(self, directory: Path, port: int):
        self.directory, self.port = directory, port
        self.url = f"http://127.0.0.1:{port}"
        self.process: subprocess.Popen | None = None
        directory.mkdir(parents=True, exist_ok=True)

    def start(self, timeout: float = 300) -> None:
        env = {**os.environ, "MLFLOW_DISABLE_TELEMETRY": "true", "MLFLOW_SERVER_ENABLE_JOB_EXECUTION": "false"}
        env.pop("MLFLOW_TRACKING_URI", None)
        command = [
            str(Path(sys.executable).parent / "mlflow"), "server", "--host", "127.0.0.1", "--port", str(self.port),
            "--workers", "1", "--backend-store-uri", f"sqlite:///{self.directory / 'mlflow.db'}",
            "--default-artifact-root", str(self.directory / "artifacts"),
        ]  # fmt: skip
        with open(self.directory / "server.log", "a") as log:
            self.process = subprocess.Popen(command, env=env, stdout=log, stderr=subprocess.STDOUT,
                                            start_new_session=True)  # fmt: skip
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            assert self.process.poll() is None, (self.directory / "server.log").read_text()[-2000:]
            try:
                with urllib.request.urlopen(f"{self.url}/health", timeout=2) as answer:
                    if answer.status == 200:
                        return
            except OSError:
                time.sleep(0.2)
        raise AssertionError(f"mlflow server did not answer within {timeout} s")

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            os.killpg(self.process.pid, signal.SIGTERM)
            self.process.wait(timeout=60)


@pytest.fixture
def mlflow_server(tmp_path):
    server = MlflowServer(tmp_path / "server", _free_port())
    server.start()
    yield server
    server.stop()


def test_a_tracking_server_stopped_mid_training_and_restarted_loses_no_epoch_and_logs_none_twice(
    small_raw_params, prepared_glyphs, in_project, mlflow_server, monkeypatch, capsys
):
    from dmlbench.tracking.record import TrainingRecord
    from dmlbench.train.stage import train_stage

    _glyphs(in_project, prepared_glyphs)
    monkeypatch.setenv("MLFLOW_TRACKING_URI", mlflow_server.url)
    monkeypatch.setenv("NO_PROXY", "127.0.0.1")
    monkeypatch.setenv("no_proxy", "127.0.0.1")
    # short client timeouts: MLflow itself retries nothing (with these, the synchronous logging of the
    # pre-spool code raised into the training at the first epoch the server missed)
    monkeypatch.setenv("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "0")
    monkeypatch.setenv("MLFLOW_HTTP_REQUEST_TIMEOUT", "5")
    monkeypatch.setenv("DMLBENCH_TRACKING_FLUSH_SECONDS", "300")  # the restart may take a while on a busy machine
    monkeypatch.setattr(spool_module, "RETRY_SECONDS", (0.2, 1.0))
    real_log_epoch = TrainingRecord.log_epoch
    down: dict[int, bool] = {}
    restart = threading.Thread(target=mlflow_server.start)

    def log_epoch(self, epoch, metrics):
        real_log_epoch(self, epoch, metrics)
        down[epoch] = mlflow_server.process.poll() is not None
        if epoch == 2:  # epochs 1-2 on the server, then it stops
            assert self.tracking.flush()
            mlflow_server.stop()
        if epoch == 4:  # it comes back while the training goes on
            restart.start()

    monkeypatch.setattr(TrainingRecord, "log_epoch", log_epoch)
    run = RunSpec("glyphs", "tiny_cnn", "contrastive", 32, 0)
    info = train_stage(_params(small_raw_params, epochs=6), run, device=torch.device("cpu"))
    restart.join()
    assert info["epochs_trained"] == 6 and (paths.model_dir(run) / "model.pt").is_file()
    assert not down[1] and not down[2] and down[3] and down[4]  # epochs 3 and 4 trained while it was down
    assert "the tracking store does not answer" in capsys.readouterr().err
    assert replay(paths.spool_dir(run), timeout=120) == 0  # (a flush that outwaited the restart left nothing)
    (found,) = _training_runs()
    assert found.info.run_id == info["mlflow_run_id"] and found.info.status == "FINISHED"
    for key in ("train/loss", "train/lr", "train/epoch_seconds"):
        assert _steps(found.info.run_id, key) == [1, 2, 3, 4, 5, 6], key
