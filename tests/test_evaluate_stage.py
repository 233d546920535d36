"""The evaluate and pretrained-baseline stages: the files the report reads, MLflow runs, settings per dataset."""

from __future__ import annotations

import copy
import math
import shutil

import numpy as np
import pytest

from dmlbench import paths
from dmlbench.data import DATASETS
from dmlbench.errors import ConfigError, DataError
from dmlbench.evaluate.embed import EMBEDDINGS, META, embed_pretrained_stage
from dmlbench.evaluate.intervals import bounded_t_interval, t_interval
from dmlbench.evaluate.metrics import retrieval_metrics
from dmlbench.evaluate.stage import evaluate_arrays, evaluate_pretrained_stage, evaluate_stage
from dmlbench.grid import Combo
from dmlbench.io import read_json, write_json
from dmlbench.params.load import parse_params
from dmlbench.params.run import run_config

COMBO = Combo("glyphs", "tiny_cnn", "contrastive", 32)


def _params(raw: dict, **evaluate):
    raw = copy.deepcopy(raw)
    raw["evaluate"] = {**raw.get("evaluate", {}), "bootstrap": {"resamples": 200}, **evaluate}
    return parse_params(raw)


def _fake_embeddings(seed: int, n: int = 120, classes: int = 12, dim: int = 32):
    rng = np.random.default_rng(seed)
    labels = np.repeat(np.arange(classes), n // classes)
    centres = rng.normal(size=(classes, dim))
    x = centres[labels] + rng.normal(scale=1.0 + 0.5 * seed, size=(n, dim))
    return (x / np.linalg.norm(x, axis=1, keepdims=True)).astype(np.float32), labels


def _write_run(params, seed: int, chash: str | None):
    """Embeddings of one seed; ``chash``: the config hash of its training (its MLflow identity)."""
    run = COMBO.with_seed(seed)
    directory = paths.embedding_dir(run)
    directory.mkdir(parents=True, exist_ok=True)
    test, test_labels = _fake_embeddings(seed)
    np.savez(directory / EMBEDDINGS, test_embeddings=test, test_labels=test_labels)
    meta = {"run": run.key, "grid_key": run.grid_key, "config_hash": chash, "dim": 32, "splits": {"test": 120}}
    write_json(directory / META, meta)
    return test, test_labels


def _training_runs(params):
    from helpers.tracking import start_training_run

    ids = {}
    for seed in params.seeds:
        run = COMBO.with_seed(seed)
        tracked = start_training_run(run, run_config(params, run).resolved, f"hash{seed}", params.tracking.experiment)
        tracked.finish()
        ids[seed] = tracked.run_id
    return ids


def _active_runs(params, kind):
    from mlflow.entities import ViewType

    from dmlbench.tracking.store import client, ensure_experiment

    experiment = ensure_experiment(params.tracking.experiment)
    return client().search_runs([experiment], filter_string=f"tags.kind = '{kind}'", run_view_type=ViewType.ACTIVE_ONLY)


def test_evaluate_stage_writes_contract_files_and_logs_mlflow(in_project, mlflow_store, small_raw_params):
    params = _params(small_raw_params, clustering=True)
    ids = _training_runs(params)
    data = {seed: _write_run(params, seed, f"hash{seed}") for seed in params.seeds}

    summary = evaluate_stage(params, COMBO)

    runs = read_json(paths.evaluation_dir(COMBO) / "runs.json")
    assert runs["combo"] == COMBO.key and set(runs["runs"]) == {f"seed{s}" for s in params.seeds}
    for seed in params.seeds:
        info = runs["runs"][f"seed{seed}"]
        expected = retrieval_metrics(*data[seed])
        assert {k: v for k, v in info["metrics"].items() if k not in {"nmi", "ami", "f1"}} == pytest.approx(expected)
        assert 0 <= info["metrics"]["nmi"] <= 1 and 0 <= info["metrics"]["f1"] <= 1
        assert info["num_queries"] == 120 and info["mode"] == "test" and "mlflow_run_id" not in info
        assert info["grid_key"] == COMBO.with_seed(seed).grid_key and info["config_hash"] == f"hash{seed}"
        assert len(info["embeddings_md5"]) == 32 and info["recall_at"] == [1, 2, 4, 8]
        boot = info["bootstrap"]["map_at_r"]
        classes = len(np.unique(data[seed][1]))  # the bootstrap resamples the test classes
        assert boot["low"] <= info["metrics"]["map_at_r"] <= boot["high"] and (boot["n"], boot["queries"]) == (
            classes,
            120,
        )
        assert boot["interval"] == "class-bootstrap-percentile" and classes < 120
    with np.load(paths.evaluation_dir(COMBO) / "per_query.npz") as per_query:
        assert per_query["seed0/map_at_r"].mean() == pytest.approx(runs["runs"]["seed0"]["metrics"]["map_at_r"])
        labels = data[0][1]
        assert np.array_equal(per_query["seed0/query_label"], labels[per_query["seed0/query_index"]])

    on_disk = read_json(paths.metrics_file(COMBO))
    assert on_disk == summary and on_disk["n_runs"] == 3 and on_disk["confidence"] == 0.95
    entry = on_disk["test"]["map_at_r"]
    values = [runs["runs"][f"seed{s}"]["metrics"]["map_at_r"] for s in params.seeds]
    plain = t_interval(values)  # clipped where it leaves [0, 1], and labelled so
    clipped = plain.low < 0 or plain.high > 1
    assert entry["mean"] == pytest.approx(np.mean(values)) and entry["n"] == 3
    assert entry["interval"] == ("t-clipped" if clipped else "t")
    expected = bounded_t_interval(values, 0.95, 0.0, 1.0)  # a score stays in [0, 1]
    assert (entry["low"], entry["high"]) == pytest.approx((expected.low, expected.high))
    assert 0 <= entry["low"] < entry["mean"] < entry["high"] <= 1
    ami = t_interval([runs["runs"][f"seed{s}"]["metrics"]["ami"] for s in params.seeds])
    assert on_disk["test"]["ami"]["low"] == pytest.approx(ami.low)  # AMI can be negative: never cut below
    assert set(on_disk["test"]) == {"precision_at_1", "r_precision", "map_at_r", "nmi", "ami", "f1"} | {
        f"recall_at_{k}" for k in (1, 2, 4, 8)
    }

    from dmlbench.tracking.store import client

    trained = client().get_run(ids[0]).data.metrics
    assert trained["test/map_at_r"] == pytest.approx(runs["runs"]["seed0"]["metrics"]["map_at_r"])
    assert trained["test/map_at_r/ci_low"] <= trained["test/map_at_r"] <= trained["test/map_at_r/ci_high"]
    (summary_run,) = _active_runs(params, "summary")
    assert summary_run.data.tags["combo_key"] == COMBO.key and summary_run.data.tags["loss"] == "contrastive"
    assert summary_run.data.metrics["test/map_at_r"] == pytest.approx(entry["mean"])
    assert summary_run.data.metrics["test/map_at_r/ci_high"] == pytest.approx(entry["high"])
    assert summary_run.data.metrics["n_runs"] == 3

    assert summary_run.info.run_name == "contrastive d32 (cell)"
    artifacts = {a.path for a in client().list_artifacts(summary_run.info.run_id)}
    assert artifacts == {f"{COMBO.key}.json"}  # the metrics file; no curves: these training runs logged no epochs
    # Re-running on the same embeddings changes nothing in MLflow; new embeddings update the same
    # cell run (its seeds' runs stay nested under it).
    evaluate_stage(params, COMBO)
    assert [r.info.run_id for r in _active_runs(params, "summary")] == [summary_run.info.run_id]
    _write_run(params, 0, "hash0")
    np.savez(paths.embedding_dir(COMBO.with_seed(0)) / EMBEDDINGS, test_embeddings=data[1][0], test_labels=data[1][1])
    changed = evaluate_stage(params, COMBO)
    (updated,) = _active_runs(params, "summary")
    assert updated.info.run_id == summary_run.info.run_id
    assert updated.data.metrics["test/map_at_r"] == pytest.approx(changed["test"]["map_at_r"]["mean"])
    assert changed["test"]["map_at_r"]["mean"] != pytest.approx(entry["mean"])
    assert len(_active_runs(params, "train")) == 3


def test_per_dataset_recall_at_and_clustering_switch(in_project, mlflow_store, small_raw_params):
    params = _params(small_raw_params, per_dataset={"glyphs": {"recall_at": [10, 1, 3], "clustering": False}})
    for seed in params.seeds:
        _write_run(params, seed, None)  # no MLflow training run: warned about, not fatal
    summary = evaluate_stage(params, COMBO)
    assert set(summary["test"]) == {
        "precision_at_1",
        "r_precision",
        "map_at_r",
        "recall_at_1",
        "recall_at_3",
        "recall_at_10",
    }


def test_missing_embeddings_fail_before_any_work(in_project, mlflow_store, small_params):
    with pytest.raises(DataError, match=r"embeddings\.npz: missing \(run the train@glyphs-tiny_cnn-contrastive-32-0"):
        evaluate_stage(small_params, COMBO)
    assert not paths.metrics_file(COMBO).exists()


def test_query_gallery_arrays_are_evaluated_query_against_gallery(small_params):
    gallery, gallery_labels = _fake_embeddings(0)
    queries, query_labels = _fake_embeddings(1, n=36)
    arrays = {
        "query_embeddings": queries,
        "query_labels": query_labels,
        "gallery_embeddings": gallery,
        "gallery_labels": gallery_labels,
    }
    metrics, values, mode = evaluate_arrays(arrays, "glyphs", small_params.evaluate)
    assert mode == "query->gallery" and len(values.r) == 36
    assert set(values.r) == {10}  # all 10 gallery images of the class, nothing excluded
    expected = retrieval_metrics(queries, query_labels, gallery, gallery_labels)
    assert {k: metrics[k] for k in expected} == pytest.approx(expected)
    with pytest.raises(DataError, match="no query and gallery splits"):
        evaluate_arrays(
            {"test_embeddings": gallery, "test_labels": gallery_labels}, "glyphs", small_params.evaluate, True
        )


def test_pretrained_baseline_embeds_untrained_trunk_and_reports_bootstrap(
    in_project, mlflow_store, small_raw_params, prepared_glyphs, auto_cpu_path
):
    # Run with `auto` forced to each CPU path (bf16 screened / fp32 faiss): the untrained trunk's
    # similarities crowd near 0.97, so most bf16 certificates fail here and the fp32 fallback runs.
    root, prepared = prepared_glyphs
    shutil.copytree(root / "prepared", paths.prepared_dir("glyphs"))
    params = _params(small_raw_params)
    meta = embed_pretrained_stage(params, "glyphs", "tiny_cnn", device="cpu")
    directory = paths.pretrained_embedding_dir("glyphs", "tiny_cnn")
    with np.load(directory / EMBEDDINGS) as arrays:
        test = arrays["test_embeddings"]
        assert test.shape == (len(prepared.split("test")), 128)  # tiny_cnn width 16 -> 128 pooled channels
        assert np.allclose(np.linalg.norm(test, axis=1), 1.0, atol=1e-5)
        assert np.array_equal(arrays["test_labels"], prepared.split("test").labels)
        assert arrays["val_embeddings"].shape[0] == len(prepared.split("val"))
    assert meta["dim"] == 128 and "mlflow_run_id" not in meta and "random initialisation" in meta["weights"]
    first = (directory / EMBEDDINGS).read_bytes()
    embed_pretrained_stage(params, "glyphs", "tiny_cnn", device="cpu")
    assert (directory / EMBEDDINGS).read_bytes() == first  # seeded initialisation: reproducible

    summary = evaluate_pretrained_stage(params, "glyphs", "tiny_cnn")
    from helpers.evaluation import CpuEvaluationPaths

    CpuEvaluationPaths.assert_took(auto_cpu_path[1], auto_cpu_path[0])
    assert summary["n_runs"] == 1 and summary["mode"] == "test"
    entry = summary["test"]["map_at_r"]
    assert entry["interval"] == "class-bootstrap-percentile" and entry["queries"] == summary["num_queries"] > 100
    with np.load(paths.pretrained_embedding_dir("glyphs", "tiny_cnn") / EMBEDDINGS) as stored:
        classes = len(np.unique(stored["test_labels"]))
    assert entry["n"] == classes < entry["queries"]  # n counts the test classes the bootstrap resamples
    assert entry["low"] < entry["mean"] < entry["high"]
    assert summary["test"]["nmi"]["interval"] == "none" and summary["test"]["nmi"]["low"] is None
    assert read_json(paths.pretrained_metrics_file("glyphs", "tiny_cnn")) == summary
    runs = read_json(paths.pretrained_evaluation_dir("glyphs", "tiny_cnn") / "runs.json")
    assert set(runs["runs"]) == {"pretrained"}
    (summary_run,) = _active_runs(params, "summary")
    assert summary_run.data.tags["loss"] == "pretrained" and summary_run.data.tags["dim"] == "128"
    assert not math.isnan(summary_run.data.metrics["test/map_at_r/ci_low"])
    # like every trained cell's run, the untrained trunk's carries its params (what was embedded)
    assert summary_run.data.params == {
        "dataset": "glyphs", "backbone": "tiny_cnn", "weights": meta["weights"], "pooling": meta["pooling"],
        "dim": "128", "model_md5": meta["model_md5"],
    }  # fmt: skip

    with pytest.raises(ConfigError, match="backbones: 'resnet50' is not in params.yaml"):
        embed_pretrained_stage(params, "glyphs", "resnet50")


def test_evaluate_config_is_validated_per_dataset(small_raw_params):
    params = _params(small_raw_params, recall_at=[8, 1, 2], per_dataset={"glyphs": {"recall_at": [1, 10]}})
    assert params.evaluate.recall_at == [1, 2, 8]
    assert params.evaluate.recall_ks("glyphs") == (1, 10) and params.evaluate.recall_ks("other") == (1, 2, 8)
    assert params.evaluate.clustering_for("glyphs") is True
    for evaluate, message in [
        (
            {"per_dataset": {"sopp": {"recall_at": [1]}}},
            f"evaluate.per_dataset.sopp: unknown dataset 'sopp'; valid: {', '.join(sorted(DATASETS))}",
        ),
        ({"per_dataset": {"glyphs": {"recal_at": [1]}}}, "evaluate.per_dataset.glyphs.recal_at: unknown key"),
        ({"recall_at": [1, 1]}, "evaluate.recall_at: recall_at has repeated values"),
        ({"recall_at": [0]}, "evaluate.recall_at.0: Input should be greater than 0"),
        ({"bootstrap": {"method": "bca"}}, "evaluate.bootstrap.method: Input should be 'percentile', 'basic' or 'BCa'"),
    ]:
        raw = copy.deepcopy(small_raw_params)
        raw["evaluate"] = evaluate
        with pytest.raises(ConfigError, match=message.replace("(", r"\(").replace("[", r"\[")):
            parse_params(raw)


# --------------------------------------------------------------------------- both CPU evaluation paths


def _smallest_deciding_gap(queries, query_labels, references, reference_labels, self_retrieval: bool, k_max: int):
    """Smallest (float64) similarity gap between two references of different relevance that are
    adjacent in a query's ranking, within the first max(R, k_max) + 1 places (all that P@1,
    R-Precision, MAP@R and Recall@K read)."""
    q, r = (x.astype(np.float64) / np.linalg.norm(x, axis=1, keepdims=True) for x in (queries, references))
    sims = q @ r.T
    smallest = np.inf
    for i, row in enumerate(sims):
        keep = np.arange(len(r)) != i if self_retrieval else np.ones(len(r), dtype=bool)
        order = np.argsort(-row[keep])
        values, relevant = row[keep][order], (reference_labels[keep] == query_labels[i])[order]
        read = max(int(relevant.sum()), k_max) + 2
        flips = relevant[: read - 1] != relevant[1:read]
        if flips.any():
            smallest = min(smallest, float((values[: read - 1] - values[1:read])[flips].min()))
    return smallest


def test_both_cpu_evaluation_paths_give_identical_metrics(small_raw_params, cpu_evaluation_paths):
    """`auto` ranks (and clusters) with the certified bf16 `screened` path on CPUs with native bf16
    (AVX512-BF16 / AMX) and with faiss (fp32) on others, so one machine alone tests only one of
    them. Both run here, on every machine, through the evaluate stage's own function (retrieval
    on a test split and query -> gallery, k-means NMI/AMI/F1), and must agree exactly: the
    screened ranking is certified and re-scored in fp32, its k-means redoes faiss's steps.
    The explicit switch (`evaluate.backend`) selects the ranking path the same way."""
    from helpers.evaluation import CPU_EVALUATION_PATHS, CpuEvaluationPaths

    settings = _params(small_raw_params, clustering=True).evaluate
    gallery, gallery_labels = _fake_embeddings(0)
    queries, query_labels = _fake_embeddings(1, n=36)
    cases = {
        f"test seed {seed}": dict(zip(("test_embeddings", "test_labels"), _fake_embeddings(seed), strict=True))
        for seed in (1, 2)
    }
    cases["query->gallery"] = {
        "query_embeddings": queries,
        "query_labels": query_labels,
        "gallery_embeddings": gallery,
        "gallery_labels": gallery_labels,
    }
    # Exact agreement of two correct fp32 computations (any BLAS, SIMD width, thread count) is
    # certain where no two neighbours of different relevance are closer than their fp32 rounding,
    # <= d 2^-24 / (1 - d 2^-24) each for unit rows: checked here with a 10x margin (these data:
    # gaps >= 3.9e-5 against 1.9e-6 for d = 32). Their k-means assignments are as clear: best and
    # second centroid >= 2.9e-4 apart in squared distance at every iteration (measured with faiss).
    bound = 32 * 2.0**-24 / (1 - 32 * 2.0**-24)
    for case in cases.values():
        if "test_embeddings" in case:
            x, labels = case["test_embeddings"], case["test_labels"]
            gap = _smallest_deciding_gap(x, labels, x, labels, True, 8)
        else:
            gap = _smallest_deciding_gap(queries, query_labels, gallery, gallery_labels, False, 8)
        assert gap > 10 * bound

    def evaluate_all(evaluate_settings):
        return {name: evaluate_arrays(case, "glyphs", evaluate_settings) for name, case in cases.items()}

    results = {}
    for path in CPU_EVALUATION_PATHS:
        with cpu_evaluation_paths.force(path) as ran:
            results[path] = evaluate_all(settings)
        CpuEvaluationPaths.assert_took(ran, path)
    # The switch overrides auto's choice of ranking (here against what auto would take); k-means
    # does not read it (evaluate_arrays leaves clustering_metrics on auto).
    for backend, auto_would_take in (("screened", "faiss"), ("faiss", "screened")):
        with cpu_evaluation_paths.force(auto_would_take) as ran:
            explicit = _params(small_raw_params, clustering=True, backend=backend).evaluate
            results[f"backend={backend}"] = evaluate_all(explicit)
        CpuEvaluationPaths.assert_took(ran, backend, kmeans=False)

    reference = results["faiss"]
    for name, (metrics, values, mode) in reference.items():
        assert {"nmi", "ami", "precision_at_1", "map_at_r", "recall_at_8"} <= set(metrics)
        assert 0 < metrics["map_at_r"] < 1 and 0 < metrics["nmi"] < 1  # neither trivial nor perfect
        for other, found in results.items():
            other_metrics, other_values, other_mode = found[name]
            assert other_mode == mode and other_metrics == metrics, (name, other)  # exactly equal
            other_arrays, arrays = other_values.arrays(), values.arrays()
            assert other_arrays.keys() == arrays.keys()
            assert all(np.array_equal(other_arrays[key], arrays[key]) for key in arrays), (name, other)
