"""The MLflow UI opens on the grid's runs: the model-training runs table with metric columns,
cells with their seeds' runs nested under them, a cell's params, a training run's parent and
dataset (headless Chromium over a small store written by the tracking code itself)."""

from __future__ import annotations

import importlib.util
import json
import sys
import urllib.parse
from pathlib import Path

import pytest
from helpers.tracking import start_training_run

from dmlbench.grid import Combo
from dmlbench.tracking.cells import cell_config, cell_run_name, cell_tags, ensure_cell_run
from dmlbench.tracking.store import EXPERIMENT_KIND, EXPERIMENT_KIND_TAG, client
from dmlbench.tracking.summary import log_summary_run
from dmlbench.tracking.ui import SHARED_VIEW_TAG, metric_columns, runs_url

_spec = importlib.util.spec_from_file_location(
    "mlflow_screenshot", Path(__file__).resolve().parents[1] / "tools" / "mlflow_screenshot.py"
)
assert _spec is not None and _spec.loader is not None
screenshot = sys.modules["mlflow_screenshot"] = importlib.util.module_from_spec(_spec)  # its dataclasses look it up
_spec.loader.exec_module(screenshot)
check_ui, find_browser = screenshot.check_ui, screenshot.find_browser

EXPERIMENT = "ui-test"
LOSSES = {"contrastive": 0.30, "proxy_anchor": 0.40}  # test/map_at_r of each cell


def _small_store() -> dict[str, str]:
    """Two cells x two seeds, as the train and evaluate stages log them; returns {loss: cell run id}."""
    cells = {}
    for loss, score in LOSSES.items():
        combo = Combo("glyphs", "tiny_cnn", loss, 32)
        resolved = {
            "dataset": {"name": "glyphs"},
            "loss": {"name": loss, "margin": 0.5},
            "dim": 32,
            "seed": 0,
            "protocol": {"name": "demo", "epochs": 3},
        }
        name = cell_run_name(loss, 32)
        cell = ensure_cell_run(client(), EXPERIMENT, combo.key, cell_tags(combo), name, params=cell_config(resolved))
        children = []
        for seed in (0, 1):
            tracked = start_training_run(
                combo.with_seed(seed), {**resolved, "seed": seed}, f"{loss}{seed}", EXPERIMENT, parent_run_id=cell
            )
            for epoch in (1, 2, 3):
                tracked.log_metrics({"train/loss": 1 / epoch, "val/map_at_r": score * epoch / 3}, step=epoch)
            tracked.log_metrics({"selected/val_map_at_r": score, "test/map_at_r": score + 0.01 * seed})
            tracked.set_tags({"selection": "val:map_at_r"})
            tracked.log_dataset("glyphs", "0123abcd", "artifacts/prepared/glyphs", {"train": {"images": 48}}, "train")
            tracked.finish()
            children.append(client().get_run(tracked.run_id))
        interval = {"mean": score, "low": score - 0.02, "high": score + 0.02, "n": 2}
        summary = {"n_runs": 2, "confidence": 0.95, "test": {"map_at_r": interval}}
        log_summary_run(EXPERIMENT, "demo", combo.key, cell_tags(combo), summary, "evaluate@t", name, children)
        cells[loss] = cell
    return cells


def test_runs_url_selects_the_training_view_with_metric_columns(mlflow_store):
    cells = _small_store()
    url = runs_url("http://127.0.0.1:5000", EXPERIMENT)
    experiment = client().get_experiment_by_name(EXPERIMENT)
    path, _, query = url.partition("?")
    assert path == f"http://127.0.0.1:5000/#/experiments/{experiment.experiment_id}/runs"
    params = dict(urllib.parse.parse_qsl(query))
    assert params["workflowType"] == "machine_learning" and params["compareRunsMode"] == "TABLE"
    assert experiment.tags[EXPERIMENT_KIND_TAG] == EXPERIMENT_KIND  # not the GenAI layout
    state = json.loads(experiment.tags[SHARED_VIEW_TAG + params["viewStateShareKey"]])
    assert state["orderByKey"] == "attributes.start_time"  # the table nests child runs only in this order
    assert state["selectedColumns"][:2] == ["metrics.`test/map_at_r`", "metrics.`selected/val_map_at_r`"]
    assert metric_columns(["train/loss", "n_runs"]) == []
    cell = client().get_run(cells["proxy_anchor"])
    assert cell.info.run_name == "proxy_anchor d32 (cell)" and cell.data.metrics["test/map_at_r"] == 0.40
    assert [a.path for a in client().list_artifacts(cell.info.run_id)] == ["learning_curves.png"]


@pytest.mark.skipif(find_browser() is None, reason="needs Chromium (apt-get install chromium)")
def test_headless_chromium_sees_runs_table_nested_runs_and_cell_params(mlflow_store, tmp_path):
    _small_store()
    outcome = check_ui(tmp_path / "ui", EXPERIMENT, find_browser())
    assert outcome.failures == []
    assert [p.name for p in outcome.screenshots] == ["runs.png", "cell_run.png", "training_run.png"]
    for path in outcome.screenshots:
        assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and path.stat().st_size > 20_000
