"""benchmarks/dinov2_zoo_check.py (frozen DINOv2 Recall@1 against OML's zoo; runs on a GPU with the
archives and weights): without them it stops in one line naming each missing input, before any
work; its Recall@1 is the leave-one-out Recall@1 dmlbench's metrics compute (cosine) and a
brute-force Euclidean one."""

from __future__ import annotations

import importlib.util

import numpy as np
import pytest
import torch
from helpers.project import ROOT

from dmlbench.evaluate.metrics import retrieval_metrics


def zoo_check():
    spec = importlib.util.spec_from_file_location("dinov2_zoo_check", ROOT / "benchmarks" / "dinov2_zoo_check.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_without_archives_or_weights_it_stops_in_one_line(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("DMLBENCH_OFFLINE", "1")  # as on a GPU box without the internet
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hf-cache"))
    monkeypatch.setenv("DMLBENCH_WEIGHTS_LOCK", str(tmp_path / "weights.lock"))
    data, work, out = tmp_path / "data", tmp_path / "work", tmp_path / "out"
    data.mkdir()
    code = zoo_check().main([str(out), "--data", str(data), "--work", str(work), "--device", "cpu"])
    err = capsys.readouterr().err
    assert code == 2 and err.count("\n") == 1 and err.startswith("error: the DINOv2 zoo check needs ")
    for name in ("CUB_200_2011.tgz", "cars196", "dinov2_vits14", "dinov2_vitb14", "make fetch"):
        assert name in err, name
    assert not work.exists() and not out.exists() and not (tmp_path / "weights.lock").exists()


def test_its_recall_at_1_is_the_leave_one_out_recall():
    module = zoo_check()
    rng = np.random.default_rng(0)
    labels = rng.integers(0, 12, size=300)
    embeddings = rng.normal(size=(300, 16)) + 1.5 * np.eye(16)[labels % 16] * rng.uniform(0.5, 3, (300, 1))
    embeddings = embeddings.astype(np.float32)
    cosine = module.recall_at_1(embeddings, labels, torch.device("cpu"), "cosine")
    assert cosine == pytest.approx(retrieval_metrics(embeddings, labels, recall_ks=(1,))["recall_at_1"])
    distances = ((embeddings[:, None] - embeddings[None]) ** 2).sum(-1)
    np.fill_diagonal(distances, np.inf)
    euclidean = float((labels[distances.argmin(1)] == labels).mean())
    assert module.recall_at_1(embeddings, labels, torch.device("cpu"), "euclidean") == pytest.approx(euclidean)
    assert euclidean != cosine  # unnormalised features: the two rankings differ here, as they can for OML's
    assert set(module.REFERENCE) == {(b, d) for b in module.BACKBONES_CHECKED for d in module.DATASETS_CHECKED}
