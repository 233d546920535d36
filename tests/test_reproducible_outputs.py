"""Two clones that run the same training, embedding and evaluation write byte-identical
outputs (no MLflow run id, no wall-clock timing in them): the timings, device, host and run id
go to the run log outside DVC's outputs and to MLflow, where runs are found by their identity."""

from __future__ import annotations

import copy

import pytest
import torch

from dmlbench import paths
from dmlbench.grid import Combo
from dmlbench.io import md5_file, read_json
from dmlbench.params.load import parse_params
from dmlbench.tracking.runlog import TIMING_KEYS

COMBO = Combo("glyphs", "tiny_cnn", "contrastive", 32)
RUN = COMBO.with_seed(0)
OUTPUTS = [
    paths.model_dir(RUN) / "run.json",
    paths.model_dir(RUN) / "history.json",
    paths.model_dir(RUN) / "model.pt",
    paths.checkpoint_dir(RUN) / "status.json",
    paths.embedding_dir(RUN) / "meta.json",
    paths.embedding_dir(RUN) / "embeddings.npz",
    paths.evaluation_dir(COMBO) / "runs.json",
    paths.evaluation_dir(COMBO) / "per_query.npz",
    paths.metrics_file(COMBO),
]


@pytest.fixture
def one_run_params(small_raw_params):
    raw = copy.deepcopy(small_raw_params)
    raw["losses"] = {"contrastive": raw["losses"]["contrastive"]}
    raw["dims"], raw["seeds"] = [32], [0]
    raw["evaluate"] = {**raw.get("evaluate", {}), "bootstrap": {"resamples": 100}}
    return parse_params(raw)


def _run_pipeline(root, params, prepared_glyphs, monkeypatch) -> None:
    """train, embed and evaluate the one run in project ``root`` with its own MLflow store."""
    from dmlbench.evaluate.embed import embed_stage
    from dmlbench.evaluate.stage import evaluate_stage
    from dmlbench.train.stage import train_stage

    (root / "artifacts" / "prepared").mkdir(parents=True)
    (root / "artifacts" / "prepared" / "glyphs").symlink_to(prepared_glyphs[0] / "prepared")
    monkeypatch.chdir(root)
    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"sqlite:///{root / 'mlflow.db'}")
    train_stage(params, RUN, device=torch.device("cpu"))
    embed_stage(params, RUN, device="cpu")
    evaluate_stage(params, COMBO)


def test_two_clones_write_identical_outputs_and_keep_timings_in_the_run_log(
    tmp_path, one_run_params, prepared_glyphs, monkeypatch
):
    monkeypatch.delenv("DVC_ROOT", raising=False)
    clones = [tmp_path / "clone_a", tmp_path / "clone_b"]
    for root in clones:
        _run_pipeline(root, one_run_params, prepared_glyphs, monkeypatch)
    for output in OUTPUTS:
        first, second = (root / output for root in clones)
        assert first.read_bytes() == second.read_bytes(), output

    # clone_b is the working directory now; what differs lives in the run log, outside the outputs
    for name in ("run.json", "history.json"):
        assert "mlflow_run_id" not in (paths.model_dir(RUN) / name).read_text()
    history = read_json(paths.model_dir(RUN) / "history.json")
    assert [h["epoch"] for h in history] == [1, 2] and not set(TIMING_KEYS) & {k for h in history for k in h}
    status = read_json(paths.checkpoint_dir(RUN) / "status.json")  # what a re-run finds to return at once
    assert status["state"] == "complete" and status["model_md5"] == md5_file(paths.model_dir(RUN) / "model.pt")
    logs = [read_json(root / paths.runlog_file(RUN)) for root in clones]
    assert logs[0]["mlflow_run_id"] != logs[1]["mlflow_run_id"]  # two stores, two runs
    log = logs[1]
    assert log["grid_key"] == RUN.grid_key and log["device"] == "cpu" and log["state"] == "complete"
    assert [e["epoch"] for e in log["epochs"]] == [1, 2] and all(e["train/epoch_seconds"] > 0 for e in log["epochs"])
    assert log["started"] <= log["ended"] and log["resumed_from_epoch"] == 0 and log["host"]
    # each clone's run log names its own workspace: the run is "trained here" in clone_b only by its own log
    from dmlbench.tracking.workspace import TRAINED_HERE, provenance, workspace_id

    assert log["workspace"] == workspace_id() != logs[0]["workspace"] == workspace_id(clones[0])
    info = read_json(paths.model_dir(RUN) / "run.json")
    assert provenance(log, info["config_hash"], workspace_id()) == TRAINED_HERE
    assert provenance(logs[0], info["config_hash"], workspace_id()) != TRAINED_HERE

    from dmlbench.tracking.store import client

    store = client()
    run = store.get_run(log["mlflow_run_id"])
    assert [m.step for m in store.get_metric_history(run.info.run_id, "train/epoch_seconds")] == [1, 2]
    assert "test/map_at_r" in run.data.metrics  # the evaluate stage found the run by its identity
    (dataset,) = run.inputs.dataset_inputs
    assert dataset.dataset.name == "glyphs" and '"train"' in dataset.dataset.profile
    assert dataset.tags[0].value == "train"
    cell = store.get_run(run.data.tags["mlflow.parentRunId"])
    assert cell.info.run_name == "contrastive d32 (cell)" and cell.data.tags["combo_key"] == COMBO.key
    assert cell.data.metrics["n_runs"] == 1 and cell.data.params["loss.name"] == "contrastive"
    assert "seed" not in cell.data.params and run.data.params["seed"] == "0"
    artifacts = {a.path for a in store.list_artifacts(cell.info.run_id)}
    assert artifacts == {f"{COMBO.key}.json", "learning_curves.png"}


def test_report_data_has_timings_only_when_every_run_log_is_there(
    tmp_path, one_run_params, prepared_glyphs, monkeypatch
):
    from dmlbench.analysis.collect import collect_results

    monkeypatch.delenv("DVC_ROOT", raising=False)
    _run_pipeline(tmp_path, one_run_params, prepared_glyphs, monkeypatch)
    results = collect_results(one_run_params)
    log = read_json(paths.runlog_file(RUN))
    assert results.timings and list(results.history["train/epoch_seconds"]) == [
        e["train/epoch_seconds"] for e in log["epochs"]
    ]
    assert list(results.history["train/loss"]) == [
        h["train/loss"] for h in read_json(paths.model_dir(RUN) / "history.json")
    ]
    paths.runlog_file(RUN).unlink()  # outputs restored from a DVC cache: no run log
    results = collect_results(one_run_params)
    assert not results.timings and not set(TIMING_KEYS) & set(results.history.columns)
    assert len(results.history) == 2 and results.selections["device"].tolist() == ["cpu"]
