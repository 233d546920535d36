"""A `dvc repro` killed with SIGKILL during training resumes from its checkpoint when re-run, and
ends with the same history and weights as an uninterrupted run (CPU, same seed), in one MLflow run
whose epochs are each logged once."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from helpers.project import dvc_project, run_checked, small_params_dict

pytestmark = pytest.mark.slow

STAGE = "train@glyphs-tiny_cnn-proxy_anchor-32-0"
RUN_DIR = Path("glyphs/tiny_cnn/proxy_anchor/32/seed0")


def test_killed_dvc_repro_resumes_to_the_same_result(tmp_path, default_raw_params):
    root = tmp_path / "repo"
    raw = small_params_dict(default_raw_params)
    raw["losses"] = {"proxy_anchor": raw["losses"]["proxy_anchor"]}  # a second optimiser, a sampler
    raw["dims"], raw["seeds"] = [32], [0]
    raw["protocols"][raw["protocol"]].update(epochs=6)
    env = dvc_project(root, raw, mlflow_db=tmp_path / "mlflow.db")
    run_checked([sys.executable, "-m", "dvc", "repro", "-q", "prepare@glyphs"], root, env)

    checkpoint = root / "artifacts" / "checkpoints" / RUN_DIR / "last.pt"
    repro = subprocess.Popen(
        [sys.executable, "-m", "dvc", "repro", STAGE],
        cwd=root,
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    deadline = time.monotonic() + 300
    while not checkpoint.exists() and repro.poll() is None and time.monotonic() < deadline:
        time.sleep(0.02)
    os.killpg(repro.pid, signal.SIGKILL)  # dvc and the training process it started
    repro.wait()
    assert checkpoint.exists(), "training never wrote its first checkpoint"
    killed_at = torch.load(checkpoint, weights_only=True)["epoch"]
    assert 1 <= killed_at < 6, "the kill must land mid-training"
    assert not (root / "artifacts" / "models" / RUN_DIR / "model.pt").exists()

    again = run_checked([sys.executable, "-m", "dvc", "repro", STAGE], root, env)
    assert f"resuming after epoch {killed_at}" in again.stdout + again.stderr
    info = json.loads((root / "artifacts" / "models" / RUN_DIR / "run.json").read_text())
    runlog = json.loads((root / "artifacts" / "runlog" / RUN_DIR.with_suffix(".json")).read_text())
    assert runlog["resumed_from_epoch"] >= killed_at and "resumed_from_epoch" not in info
    resumed = json.loads((root / "artifacts" / "models" / RUN_DIR / "history.json").read_text())
    assert not checkpoint.exists()  # cleared once the run is complete

    # The same training, uninterrupted, in this process on the same prepared data.
    from dmlbench.data.cache import PreparedDataset
    from dmlbench.grid import RunSpec
    from dmlbench.params.load import parse_params
    from dmlbench.params.run import run_config
    from dmlbench.train.loop import train

    params = parse_params(raw)
    data = PreparedDataset.load(root / "artifacts" / "prepared" / "glyphs")
    reference = train(
        run_config(params, RunSpec("glyphs", "tiny_cnn", "proxy_anchor", 32, 0)), data, device=torch.device("cpu")
    )
    assert [h["epoch"] for h in resumed] == [1, 2, 3, 4, 5, 6]
    for ours, theirs in zip(resumed, reference.history, strict=True):
        for key in ("train/loss", "val/map_at_r", "val/precision_at_1", "test_feedback/precision_at_1"):
            assert ours[key] == pytest.approx(theirs[key], rel=1e-5, abs=1e-7), (ours["epoch"], key)
    saved = torch.load(root / "artifacts" / "models" / RUN_DIR / "model.pt", weights_only=True)
    assert saved["selection"] == reference.selection
    for key, value in reference.model_state.items():
        torch.testing.assert_close(saved["state_dict"][key], value, rtol=1e-5, atol=1e-6)

    import mlflow

    store = mlflow.MlflowClient(env["MLFLOW_TRACKING_URI"])
    runs = store.search_runs([store.get_experiment_by_name("dmlbench").experiment_id], "tags.kind = 'train'")
    assert [r.info.run_id for r in runs] == [runlog["mlflow_run_id"]] and runs[0].info.status == "FINISHED"
    steps = sorted(m.step for m in store.get_metric_history(runlog["mlflow_run_id"], "train/loss"))
    assert steps == [1, 2, 3, 4, 5, 6]  # no duplicate, no missing epoch
    assert runs[0].data.tags.get("resumed") == "true"
