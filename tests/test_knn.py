"""Exact neighbour ranking: faiss and torch agree (ties, k near n, chunking); GPU code paths."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from dmlbench.evaluate import knn as knn_module
from dmlbench.evaluate.knn import knn, normalize_rows, rank_neighbours, resolve_backend
from dmlbench.evaluate.ranking import RankingTask, positive_index_matrix


def _case(seed: int, n: int = 300, dim: int = 8, classes: int = 20, duplicates: bool = True):
    rng = np.random.default_rng(seed)
    labels = rng.integers(0, classes, size=n)
    x = rng.normal(size=(n, dim)).astype(np.float32)
    if duplicates:  # exact ties within and across classes
        x[5:15] = x[5]
        x[n - 3 :] = x[n - 2]
    return normalize_rows(x), labels


def _rank(x, labels, k, first_limit, backend, chunk=None, refs=None, ref_labels=None):
    same = refs is None
    return rank_neighbours(
        RankingTask(
            queries=x,
            query_labels=labels,
            references=x if same else refs,
            reference_labels=labels if same else ref_labels,
            k=k,
            first_limit=first_limit,
            self_index=np.arange(len(x)) if same else None,
            backend=backend,
            device="cpu",
            chunk_size=chunk,
        )
    )


@pytest.mark.parametrize("seed", [0, 1, 2])
@pytest.mark.parametrize("chunk", [None, 7, 64])
def test_backends_agree_with_ties_and_chunks(seed, chunk):
    x, labels = _case(seed)
    a = _rank(x, labels, 12, 50, "faiss", chunk)
    for backend in ("torch", "screened"):
        b = _rank(x, labels, 12, 50, backend, chunk)
        assert np.array_equal(a.hits, b.hits), backend
        assert np.array_equal(a.first_positive, b.first_positive), backend


@pytest.mark.parametrize("backend", ["faiss", "torch", "screened"])
def test_k_equal_to_all_references(backend):
    x, labels = _case(3, n=40, classes=3)
    ranking = _rank(x, labels, 39, 39, backend)  # every other row is in the list
    assert ranking.hits.shape == (40, 39)
    # Each row's list holds every same-class reference exactly once.
    assert np.array_equal(ranking.hits.sum(axis=1), np.bincount(labels)[labels] - 1)
    first = np.where(ranking.hits.any(axis=1), ranking.hits.argmax(axis=1), 39)
    assert np.array_equal(ranking.first_positive, first)


def test_first_positive_rank_counts_other_class_items_ahead():
    # Query at angle 0; references at increasing angles; the first same-class one is the 4th.
    angles = np.array([0.1, 0.2, 0.3, 0.4, 0.5])
    refs = np.stack([np.cos(angles), np.sin(angles)], axis=1).astype(np.float32)
    ref_labels = np.array([1, 1, 1, 0, 0])
    query = np.array([[1.0, 0.0]], dtype=np.float32)
    task = dict(queries=query, query_labels=np.array([0]), references=refs, reference_labels=ref_labels, k=2)
    for backend in ("faiss", "torch", "screened"):
        ranking = rank_neighbours(RankingTask(**task, first_limit=5, backend=backend))
        assert ranking.first_positive.tolist() == [3]
        assert ranking.hits.tolist() == [[False, False]]
        capped = rank_neighbours(RankingTask(**task, first_limit=2, backend=backend))
        assert capped.first_positive.tolist() == [2]  # "not within the limit"


@pytest.mark.parametrize(
    ("option", "message"),
    [
        ({"k": 0}, r"k must be in \[1, 10\], got 0"),
        ({"k": 10, "self_index": np.arange(10)}, r"k must be in \[1, 9\], got 10"),  # self excluded
        ({"first_limit": 0}, "first_limit must be >= 1"),
        ({"chunk_size": -1}, "chunk_size must be >= 1 or None, got -1"),  # else the chunk loop would skip every query
        ({"backend": "annoy"}, "backend must be one of auto, faiss, torch, screened; got 'annoy'"),
        ({"device": "gpu"}, "device must be a torch device such as cpu, cuda or cuda:1; got 'gpu'"),
    ],
)
def test_ranking_task_refuses_a_bad_option_in_one_line(option, message):
    x, labels = _case(0, n=10)
    task = {"queries": x, "query_labels": labels, "references": x, "reference_labels": labels, "k": 3, "first_limit": 5}
    with pytest.raises(ValueError, match=message) as refused:
        RankingTask(**(task | option))
    assert "\n" not in str(refused.value)


def test_positive_index_matrix_excludes_self_and_pads():
    labels = np.array([2, 0, 2, 1, 2])
    pos = positive_index_matrix(labels, labels, np.arange(5), width=2)
    assert pos.tolist() == [[2, 4], [-1, -1], [0, 4], [-1, -1], [0, 2]]


def test_faiss_gpu_path_is_used_when_faiss_sees_gpus(monkeypatch):
    import faiss

    moved = []

    def to_gpus(index):
        moved.append(index)
        return index  # stands in for the GPU copy: same API, same results

    monkeypatch.setattr(knn_module, "faiss_gpus", lambda: 1)
    monkeypatch.setattr(faiss, "index_cpu_to_all_gpus", to_gpus, raising=False)
    assert resolve_backend("auto", "cpu") == ("faiss", "cpu")
    x, labels = _case(4)
    on_gpu = _rank(x, labels, 12, 50, "faiss")
    assert len(moved) == 1
    monkeypatch.setattr(knn_module, "faiss_gpus", lambda: 0)
    assert np.array_equal(on_gpu.hits, _rank(x, labels, 12, 50, "faiss").hits)
    # Beyond the GPU's k limit the CPU index is used, as PML does.
    monkeypatch.setattr(knn_module, "faiss_gpus", lambda: 1)
    big, big_labels = _case(5, n=2100, dim=4, classes=30, duplicates=False)
    _rank(big, big_labels, 100, 2099, "faiss")
    assert len(moved) == 1


def test_auto_backend_choice(monkeypatch):
    monkeypatch.setattr(knn_module, "fast_bf16_matmul", lambda: True)
    assert resolve_backend("auto", "cpu") == ("screened", "cpu")  # native bf16: the bf16 screen
    assert resolve_backend("screened", "cuda") == ("torch", "cuda")
    monkeypatch.setattr(knn_module, "fast_bf16_matmul", lambda: False)
    assert resolve_backend("auto", "cpu") == ("faiss", "cpu")  # faiss-cpu: faster than fp32 torch at SOP scale
    assert resolve_backend("auto", "cuda") == ("torch", "cuda")  # a GPU but faiss-cpu: torch on CUDA
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    assert resolve_backend("auto") == ("torch", "cuda")  # no device named: CUDA when torch sees one
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert resolve_backend("auto") == ("faiss", "cpu")
    monkeypatch.setattr(knn_module, "faiss_gpus", lambda: 1)
    assert resolve_backend("auto", "cuda") == ("faiss", "cuda")  # faiss-gpu: faiss everywhere
    assert resolve_backend("auto", "cpu") == ("faiss", "cpu")
    monkeypatch.setattr(knn_module, "faiss_gpus", lambda: 0)
    monkeypatch.setattr(knn_module, "faiss_available", lambda: False)
    assert resolve_backend("auto", "cpu") == ("torch", "cpu")
    with pytest.raises(ValueError, match="needs the faiss package"):
        resolve_backend("faiss", "cpu")
    with pytest.raises(ValueError, match="backend must be one of"):
        resolve_backend("annoy", "cpu")


@pytest.mark.parametrize("backend", ["faiss", "torch"])
def test_plain_knn_excludes_self_even_among_duplicates(backend):
    embeddings = np.array([[1.0, 0.0], [1.0, 0.0], [1.0, 0.0], [0.0, 1.0]], dtype=np.float32)
    neighbours = knn(embeddings, embeddings, 2, exclude_self=True, backend=backend)
    for row, found in enumerate(neighbours):
        assert row not in found and len(found) == 2
    with pytest.raises(ValueError, match="k must be in"):
        knn(embeddings, embeddings, 4, exclude_self=True, backend=backend)
