"""Cross-validation protocols through the stages: one model per fold, concatenated vs separated."""

from __future__ import annotations

import copy

import numpy as np
import pytest

from dmlbench import paths
from dmlbench.data.stage import download_stage, prepare_stage
from dmlbench.evaluate.combine import concatenated_metrics, separated_metrics
from dmlbench.evaluate.embed import embed_stage
from dmlbench.evaluate.stage import evaluate_stage
from dmlbench.grid import Combo
from dmlbench.io import read_json
from dmlbench.params.load import parse_params
from dmlbench.tracking.store import client
from dmlbench.train.stage import train_member, train_stage


@pytest.fixture
def cv_params(small_raw_params):
    raw = copy.deepcopy(small_raw_params)
    raw["datasets"]["glyphs"]["split"] = {"scheme": "rc_cv", "seed": 0}  # 20 training classes, 4 folds
    raw["losses"] = {"contrastive": raw["losses"]["contrastive"]}
    raw["dims"], raw["seeds"] = [32], [0, 1]
    raw["protocols"][raw["protocol"]].update(epochs=1)
    raw["evaluate"]["clustering"] = False
    return parse_params(raw)


def test_cross_validation_runs_train_each_fold_and_report_concatenated_and_separated(
    in_project, mlflow_store, cv_params
):
    download_stage("glyphs", cv_params.datasets["glyphs"])
    prepare_stage("glyphs", cv_params.datasets["glyphs"])
    combo = Combo("glyphs", "tiny_cnn", "contrastive", 32)
    first, second = combo.with_seed(0), combo.with_seed(1)

    # An interrupted stage keeps its finished folds: fold 0 of seed 1 was trained before a kill.
    import torch

    from dmlbench.data.cache import PreparedDataset
    from dmlbench.params.run import run_config

    data = PreparedDataset.load(paths.prepared_dir("glyphs"))
    config = run_config(cv_params, second)
    early = train_member(config, cv_params.tracking.experiment, data, 0, torch.device("cpu"))
    for run in (first, second):
        train_stage(cv_params, run, device=torch.device("cpu"))
        embed_stage(cv_params, run, device="cpu")

    assert paths.folds_in(paths.model_dir(first)) == [0, 1, 2, 3]
    for fold in range(4):
        info = read_json(paths.model_dir(first, fold) / "run.json")
        assert info["fold"] == fold and info["selection"]["split"] == "val"
        val = data.split("val", fold=fold)
        meta = read_json(paths.embedding_dir(first, fold) / "meta.json")
        assert meta["fold"] == fold and meta["splits"]["val"] == len(val)  # each fold's own validation classes
    assert "mlflow_run_id" not in read_json(paths.model_dir(second, 0) / "run.json")  # in the run log only
    assert read_json(paths.runlog_file(second, 0))["mlflow_run_id"] == early["mlflow_run_id"]
    assert not any(paths.checkpoint_dir(first).rglob("final"))  # staging cleared once assembled

    runs = client().search_runs([client().get_experiment_by_name("dmlbench").experiment_id], "tags.kind = 'train'")
    assert len(runs) == 10  # 2 seeds x (the seed's run + 4 fold models), fold 0 of seed 1 not trained twice
    assert {r.data.tags["grid_key"] for r in runs} == {
        f"glyphs/tiny_cnn/contrastive/32/seed{s}{f}"
        for s in (0, 1)
        for f in ["", "/fold0", "/fold1", "/fold2", "/fold3"]
    }
    # Nesting: cell run > seed run > fold models (fold 0 of seed 1, trained first, adopted by its seed's run).
    by_key = {r.data.tags["grid_key"]: r for r in runs}
    (cell,) = client().search_runs([runs[0].info.experiment_id], "tags.kind = 'summary'")
    for s in (0, 1):
        seed_run = by_key[f"glyphs/tiny_cnn/contrastive/32/seed{s}"]
        assert seed_run.data.tags["mlflow.parentRunId"] == cell.info.run_id and seed_run.info.status == "FINISHED"
        for f in range(4):
            fold_run = by_key[f"glyphs/tiny_cnn/contrastive/32/seed{s}/fold{f}"]
            assert fold_run.data.tags["mlflow.parentRunId"] == seed_run.info.run_id
            assert fold_run.info.run_name == f"contrastive d32 s{s} f{f}"

    summary = evaluate_stage(cv_params, combo)
    assert summary["cross_validation"] == {"folds": 4, "test": "concatenated", "test_separated": "mean over folds"}
    assert summary["n_runs"] == 2 and summary["test"]["map_at_r"]["interval"] in ("t", "t-clipped")
    entry = read_json(paths.evaluation_dir(combo) / "runs.json")["runs"]["seed0"]
    folds = [np.load(paths.embedding_dir(first, f) / "embeddings.npz") for f in range(4)]
    embeddings = [f["test_embeddings"] for f in folds]
    labels = folds[0]["test_labels"]
    expected = concatenated_metrics(embeddings, labels, recall_ks=(1, 2, 4, 8))
    separated = separated_metrics(embeddings, labels, recall_ks=(1, 2, 4, 8))
    for name in ("precision_at_1", "r_precision", "map_at_r", "recall_at_4"):
        assert entry["metrics"][name] == pytest.approx(expected[name])
        assert entry["metrics_separated"][name] == pytest.approx(separated["mean"][name])
    assert entry["grid_key"] == first.grid_key and "mlflow_run_ids" not in entry
    # Each fold model's MLflow run got its own test metrics, each seed's run the concatenated embedding's.
    for run in runs:
        assert "test/map_at_r" in client().get_run(run.info.run_id).data.metrics
    seed_metrics = client().get_run(by_key[first.grid_key].info.run_id).data.metrics
    assert seed_metrics["test/map_at_r"] == pytest.approx(expected["map_at_r"])


def test_report_reads_fold_models_and_says_how_runs_are_scored(in_project, mlflow_store, cv_params):
    import torch

    from dmlbench.analysis.collect import collect_results
    from dmlbench.analysis.report import report_stage

    download_stage("glyphs", cv_params.datasets["glyphs"])
    prepare_stage("glyphs", cv_params.datasets["glyphs"])
    combo = Combo("glyphs", "tiny_cnn", "contrastive", 32)
    for seed in cv_params.seeds:
        train_stage(cv_params, combo.with_seed(seed), device=torch.device("cpu"))
        embed_stage(cv_params, combo.with_seed(seed), device="cpu")
    evaluate_stage(cv_params, combo)
    results = collect_results(cv_params)
    assert sorted(results.selections["fold"].unique()) == [0, 1, 2, 3]
    assert len(results.selections) == 8 and set(results.history["fold"]) == {0, 1, 2, 3}
    text = report_stage(cv_params).read_text()
    assert "Cross-validation (`glyphs` 4 folds)" in text and "**concatenated**" in text
