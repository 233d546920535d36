"""Self-retrieval from half the products: the same ranking as the row-by-row backends (fp32 and
certified bf16), with ties, lone queries, first-positive ranks beyond the list, failed
certificates and candidate explosions."""

from __future__ import annotations

import numpy as np
import pytest

from dmlbench.evaluate import symmetric
from dmlbench.evaluate.knn import normalize_rows, rank_neighbours, ranking_schedule
from dmlbench.evaluate.ranking import RankingTask


def _clustered(seed: int, n: int, dim: int, classes: int, noise: float):
    rng = np.random.default_rng(seed)
    labels = rng.integers(0, classes, size=n)
    centres = rng.normal(size=(classes, dim)).astype(np.float32)
    return normalize_rows(centres[labels] + noise * rng.normal(size=(n, dim)).astype(np.float32)), labels


def _rank(x, labels, rows, k, first_limit, backend, schedule, monkeypatch, block=None):
    monkeypatch.setattr(symmetric, "MIN_REFERENCES", 0 if schedule == "symmetric" else 10**9)
    expected = "rows" if schedule == "rows" else ("symmetric bf16" if backend == "screened" else "symmetric fp32")
    assert ranking_schedule(backend, "cpu", True, len(x))[2] == expected
    return rank_neighbours(_task(x, labels, rows, k, first_limit, backend=backend, chunk_size=block))


def _task(x, labels, rows, k, first_limit, **options):
    return RankingTask(
        queries=x[rows],
        query_labels=labels[rows],
        references=x,
        reference_labels=labels,
        k=k,
        first_limit=first_limit,
        self_index=rows,
        **options,
    )


def _assert_same(a, b):
    assert np.array_equal(a.hits, b.hits)
    assert np.array_equal(a.first_positive, b.first_positive)


@pytest.mark.parametrize("backend", ["torch", "screened"])
@pytest.mark.parametrize("first_limit", [1, 300])
def test_symmetric_equals_row_by_row(monkeypatch, backend, first_limit):
    x, labels = _clustered(0, 1200, 48, 150, noise=1.5)
    x[10:20] = x[10]  # exact duplicates across classes: ties inside and at the end of lists
    x[40:43] = x[40]
    labels[7] = 10_000  # a lone image: a reference, never a query
    rows = np.flatnonzero(np.bincount(labels)[labels] > 1)
    k = int(np.bincount(labels).max()) - 1
    expected = _rank(x, labels, rows, k, first_limit, backend, "rows", monkeypatch)
    # blocks of 64 rows: the later rows collect their pairs from many earlier blocks
    ranking = _rank(x, labels, rows, k, first_limit, backend, "symmetric", monkeypatch, block=64)
    _assert_same(ranking, expected)
    assert 0 < ranking.hits[:, 0].mean() < 1
    if first_limit > k:
        assert (ranking.first_positive > k).any()  # ranks beyond the list were really needed


def test_symmetric_with_the_list_covering_almost_every_reference(monkeypatch):
    x, labels = _clustered(1, 300, 16, 3, noise=3.0)
    rows = np.arange(len(x))
    for k in (len(x) - 1, 150):  # k = n - 1: the sample is every reference
        expected = _rank(x, labels, rows, k, k, "torch", "rows", monkeypatch)
        _assert_same(_rank(x, labels, rows, k, k, "torch", "symmetric", monkeypatch, block=32), expected)


def test_bf16_rows_without_certificate_are_ranked_again(monkeypatch):
    # no margin: the re-scored candidates are the list itself, so a row is certified only when it
    # had at most k candidates; the others go to the row-by-row path
    monkeypatch.setattr(symmetric, "SCREEN_MARGIN", 0)
    calls = []
    original = symmetric.rank_symmetric

    def counting(task, bf16, rank_rows):
        return original(task, bf16, lambda subset: calls.append(len(subset.queries)) or rank_rows(subset))

    monkeypatch.setattr(symmetric, "rank_symmetric", counting)
    x, labels = _clustered(2, 900, 32, 120, noise=1.5)
    rows = np.arange(len(x))
    expected = _rank(x, labels, rows, 12, 12, "torch", "rows", monkeypatch)
    _assert_same(_rank(x, labels, rows, 12, 12, "screened", "symmetric", monkeypatch, block=128), expected)
    assert calls and calls[0] > 100


@pytest.mark.parametrize("backend", ["torch", "screened"])
def test_collapsed_embedding_gives_up_and_keeps_the_tie_rule(monkeypatch, backend):
    # every similarity equal: every pair is a candidate, past the budget, so the row-by-row path runs
    monkeypatch.setattr(symmetric, "CANDIDATE_BUDGET", 1000)
    labels = np.repeat(np.arange(10), 10)
    collapsed = normalize_rows(np.ones((100, 8), dtype=np.float32))
    rows = np.arange(100)
    assert symmetric.rank_symmetric(_task(collapsed, labels, rows, 9, 9), backend == "screened", lambda s: None) is None
    ranking = _rank(collapsed, labels, rows, 9, 95, backend, "symmetric", monkeypatch)
    assert not ranking.hits.any()  # different-class references first among equals
    assert (ranking.first_positive == 90).all()


def test_schedule_follows_backend_device_and_size(monkeypatch):
    monkeypatch.setattr(symmetric, "MIN_REFERENCES", 2048)
    assert ranking_schedule("torch", "cpu", True, 5000)[2] == "symmetric fp32"
    assert ranking_schedule("screened", "cpu", True, 5000)[2] == "symmetric bf16"
    assert ranking_schedule("torch", "cpu", True, 1000)[2] == "rows"  # small: row by row
    assert ranking_schedule("torch", "cpu", False, 5000)[2] == "rows"  # query/gallery
    assert ranking_schedule("faiss", "cpu", True, 5000)[2] == "rows"  # faiss asked for: faiss
