"""Retrieval metrics against the Reality Check's worked examples, brute force and PML."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from dmlbench.evaluate.intervals import t_interval
from dmlbench.evaluate.knn import knn
from dmlbench.evaluate.metrics import per_query_metrics, retrieval_metrics


def _ranked_case(correct_ranks: list[int], n_results: int = 10):
    """One query (row 0) whose i-th nearest reference is of its class iff i in correct_ranks.

    R = 10 same-class references in total (those not among the top results come last), as in
    the Reality Check's table of examples.
    """
    n_refs = 30
    angles = np.linspace(0.01, 1.5, n_refs)  # reference i is the (i+1)-th nearest to angle 0
    refs = np.stack([np.cos(angles), np.sin(angles)], axis=1)
    labels = np.full(n_refs, 1)
    positives = [r - 1 for r in correct_ranks]
    remaining = 10 - len(positives)
    positives += list(range(n_refs - remaining, n_refs))
    labels[positives] = 0
    return np.array([[1.0, 0.0]]), np.array([0]), refs, labels


@pytest.mark.parametrize(
    ("correct_ranks", "rp", "map_r"),
    [([1], 0.10, 0.10), ([1, 10], 0.20, 0.12), ([1, 2], 0.20, 0.20), (list(range(1, 11)), 1.0, 1.0)],
)
def test_reality_check_worked_examples(correct_ranks, rp, map_r):
    query, q_labels, refs, r_labels = _ranked_case(correct_ranks)
    metrics = retrieval_metrics(query, q_labels, refs, r_labels)
    assert metrics["precision_at_1"] == 1.0 and metrics["recall_at_1"] == 1.0
    assert metrics["r_precision"] == pytest.approx(rp)
    assert metrics["map_at_r"] == pytest.approx(map_r)


def _brute_force(embeddings: np.ndarray, labels: np.ndarray, ks=(1, 2, 4, 8)) -> dict[str, float]:
    """Independent definition-by-definition implementation with a full similarity matrix."""
    x = embeddings / np.linalg.norm(embeddings, axis=1, keepdims=True)
    sims = x @ x.T
    np.fill_diagonal(sims, -np.inf)
    scores = {name: [] for name in ["precision_at_1", "r_precision", "map_at_r", *[f"recall_at_{k}" for k in ks]]}
    for i in range(len(x)):
        order = np.argsort(-sims[i], kind="stable")[:-1]
        rel = labels[order] == labels[i]
        r = int((labels == labels[i]).sum()) - 1
        if r == 0:
            continue
        scores["precision_at_1"].append(rel[0])
        scores["r_precision"].append(rel[:r].sum() / r)
        precisions = np.cumsum(rel[:r]) / np.arange(1, r + 1)
        scores["map_at_r"].append((precisions * rel[:r]).sum() / r)
        for k in ks:
            scores[f"recall_at_{k}"].append(rel[:k].any())
    return {name: float(np.mean(v)) for name, v in scores.items()}


def _random_case(seed: int, n: int = 600, dim: int = 16, classes: int = 60):
    rng = np.random.default_rng(seed)
    labels = rng.integers(0, classes, size=n)
    centres = rng.normal(size=(classes, dim))
    embeddings = centres[labels] + rng.normal(scale=1.5, size=(n, dim))
    return embeddings.astype(np.float32), labels


@pytest.mark.parametrize("seed", [0, 1])
@pytest.mark.parametrize("backend", ["faiss", "torch"])
def test_matches_brute_force(seed, backend):
    embeddings, labels = _random_case(seed)
    ours = retrieval_metrics(embeddings, labels, backend=backend)
    expected = _brute_force(embeddings, labels)
    assert ours.keys() == expected.keys()
    for name in expected:
        assert ours[name] == pytest.approx(expected[name], abs=1e-9), name


def test_matches_pml_accuracy_calculator():
    from pytorch_metric_learning.utils.accuracy_calculator import AccuracyCalculator

    embeddings, labels = _random_case(3, n=800)
    ours = retrieval_metrics(embeddings, labels)
    normalized = torch.nn.functional.normalize(torch.from_numpy(embeddings), dim=1)
    calculator = AccuracyCalculator(
        include=("precision_at_1", "r_precision", "mean_average_precision_at_r"),
        k="max_bin_count",
        device=torch.device("cpu"),
    )
    pml = calculator.get_accuracy(normalized, torch.from_numpy(labels))
    assert ours["precision_at_1"] == pytest.approx(pml["precision_at_1"], abs=1e-6)
    assert ours["r_precision"] == pytest.approx(pml["r_precision"], abs=1e-6)
    assert ours["map_at_r"] == pytest.approx(pml["mean_average_precision_at_r"], abs=1e-6)


def test_query_gallery_mode_and_lone_queries():
    rng = np.random.default_rng(0)
    gallery = rng.normal(size=(50, 8)).astype(np.float32)
    gallery_labels = np.repeat(np.arange(10), 5)
    queries = gallery[::5] + 0.01 * rng.normal(size=(10, 8)).astype(np.float32)
    query_labels = np.arange(10)
    with_lone = np.concatenate([query_labels, [99]])  # class 99 has no gallery image: left out
    queries_with_lone = np.concatenate([queries, rng.normal(size=(1, 8)).astype(np.float32)])
    values = per_query_metrics(queries_with_lone, with_lone, gallery, gallery_labels)
    assert len(values["r"]) == 10 and set(values["r"]) == {5}
    assert values["precision_at_1"].mean() == 1.0  # each query is a near-copy of a gallery image
    # Self rows are not excluded in query/gallery mode: a gallery image identical to the query counts.
    assert retrieval_metrics(gallery, gallery_labels, gallery, gallery_labels)["precision_at_1"] == 1.0


def test_classes_of_size_one_are_left_out_and_k_is_never_capped():
    labels = np.array([0] * 40 + [1, 2, 3])  # R = 39 for class 0; classes 1-3 are singletons
    rng = np.random.default_rng(5)
    embeddings = np.concatenate(
        [[1.0, 0.0, 0.0] + 0.05 * rng.normal(size=(40, 3)), [[-1.0, 0.1, 0.0], [-1.0, 0.0, 0.1], [-1.0, -0.1, 0.0]]]
    )
    values = per_query_metrics(embeddings, labels)  # needs all 39 neighbours, far beyond max(recall_ks) = 8
    assert len(values["r"]) == 40 and set(values["r"]) == {39}
    assert np.allclose(values["r_precision"], 1.0) and np.allclose(values["map_at_r"], 1.0)
    with pytest.raises(ValueError, match="no query has a same-class reference"):
        retrieval_metrics(embeddings[40:], labels[40:])


def test_self_exclusion_with_exact_duplicates():
    embeddings = np.array([[1.0, 0.0], [1.0, 0.0], [1.0, 0.0], [0.0, 1.0]], dtype=np.float32)
    neighbours = knn(embeddings, embeddings, 2, exclude_self=True)
    for row, found in enumerate(neighbours):
        assert row not in found and len(found) == 2


def test_tensor_inputs_and_t_interval():
    embeddings, labels = _random_case(2, n=200)
    from_tensor = retrieval_metrics(torch.from_numpy(embeddings), torch.from_numpy(labels))
    assert from_tensor == retrieval_metrics(embeddings, labels)
    interval = t_interval([0.60, 0.62, 0.64], 0.95)
    # mean 0.62, sd 0.02, sem 0.02/sqrt(3), t_{0.975, 2} = 4.302653
    assert interval.mean == pytest.approx(0.62)
    assert interval.half_width == pytest.approx(4.302653 * 0.02 / np.sqrt(3), rel=1e-5)
    assert interval.n == 3
    single = t_interval([0.5])
    assert single.n == 1 and np.isnan(single.low)
