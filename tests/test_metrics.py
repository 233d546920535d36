"""Retrieval metrics against the Reality Check's worked examples, brute force and PML."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from dmlbench.evaluate import symmetric
from dmlbench.evaluate.clustering import clustering_metrics
from dmlbench.evaluate.knn import normalize_rows
from dmlbench.evaluate.metrics import per_query_metrics, query_gallery_metrics, retrieval_metrics

BACKENDS = ["faiss", "torch", "screened"]


def _ranked_case(correct_ranks: list[int]):
    """One query whose i-th nearest reference is of its class iff i in correct_ranks.

    R = 10 same-class references in total (those not among the top 10 come last), as in the
    Reality Check's table of examples ("10 results, of which ...").
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


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize(
    ("correct_ranks", "rp", "map_r"),
    [([1], 0.10, 0.10), ([1, 10], 0.20, 0.12), ([1, 2], 0.20, 0.20), (list(range(1, 11)), 1.0, 1.0)],
)
def test_reality_check_worked_examples(correct_ranks, rp, map_r, backend):
    query, q_labels, refs, r_labels = _ranked_case(correct_ranks)
    metrics = retrieval_metrics(query, q_labels, refs, r_labels, backend=backend)
    assert metrics["precision_at_1"] == 1.0 and metrics["recall_at_1"] == 1.0
    assert metrics["r_precision"] == pytest.approx(rp)
    assert metrics["map_at_r"] == pytest.approx(map_r)


def _brute_force(
    queries: np.ndarray,
    q_labels: np.ndarray,
    refs: np.ndarray | None = None,
    r_labels: np.ndarray | None = None,
    ks=(1, 2, 4, 8),
) -> dict[str, float]:
    """Definition-by-definition implementation on the full similarity matrix (float64).

    Each row is fully sorted by similarity descending, different-class references first among
    exact ties (the documented pessimistic rule); self excluded when refs is None.
    """
    same = refs is None
    q = queries / np.linalg.norm(queries, axis=1, keepdims=True)
    x = q if same else refs / np.linalg.norm(refs, axis=1, keepdims=True)
    ref_labels = q_labels if same else r_labels
    sims = q.astype(np.float64) @ x.astype(np.float64).T
    scores = {name: [] for name in ["precision_at_1", "r_precision", "map_at_r", *[f"recall_at_{k}" for k in ks]]}
    for i in range(len(q)):
        candidates = np.arange(len(x))
        if same:
            candidates = candidates[candidates != i]
        rel_all = ref_labels[candidates] == q_labels[i]
        order = np.lexsort((rel_all, -sims[i, candidates]))
        rel = rel_all[order]
        r = int(rel.sum())
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


def _assert_same(ours: dict, expected: dict, tol: float = 1e-9) -> None:
    assert ours.keys() == expected.keys()
    for name in expected:
        assert ours[name] == pytest.approx(expected[name], abs=tol), name


@pytest.mark.parametrize("seed", [0, 1])
@pytest.mark.parametrize("backend", BACKENDS)
def test_matches_brute_force(seed, backend):
    embeddings, labels = _random_case(seed)
    ks = (1, 2, 4, 8, 16, 100, 599, 1000)  # up to the whole reference set and beyond
    ours = retrieval_metrics(embeddings, labels, recall_ks=ks, backend=backend)
    _assert_same(ours, _brute_force(embeddings, labels, ks=ks))
    assert ours["recall_at_599"] == ours["recall_at_1000"] == 1.0  # K >= references: the whole set
    assert all(isinstance(v, float) and 0 <= v <= 1 for v in ours.values())


@pytest.mark.parametrize("backend", BACKENDS)
def test_query_gallery_matches_brute_force(backend):
    gallery, gallery_labels = _random_case(4, n=500)
    queries, query_labels = _random_case(4, n=150)  # same class centres, different noise
    query_labels = query_labels.copy()
    query_labels[:5] = 999  # no gallery image of this class: left out
    ours = query_gallery_metrics(queries, query_labels, gallery, gallery_labels, recall_ks=(1, 10, 20), backend=backend)
    _assert_same(ours, _brute_force(queries, query_labels, gallery, gallery_labels, ks=(1, 10, 20)))
    assert len(per_query_metrics(queries, query_labels, gallery, gallery_labels).r) == 145


class _RecallCalculator:
    """PML's AccuracyCalculator plus Recall@K (as the reference notes verify for PML 2.9)."""

    def __new__(cls, ks, **kwargs):
        from pytorch_metric_learning.utils.accuracy_calculator import AccuracyCalculator

        def make(k):
            def calculate(self, knn_labels, query_labels, not_lone_query_mask, **kw):
                hit = (knn_labels[:, :k] == query_labels[:, None]).any(1)[not_lone_query_mask]
                return hit.double().mean().item()

            return calculate

        methods = {f"calculate_recall_at_{k}": make(k) for k in ks}
        methods["requires_knn"] = lambda self: AccuracyCalculator.requires_knn(self) + [f"recall_at_{k}" for k in ks]
        return type("RecallCalculator", (AccuracyCalculator,), methods)(**kwargs)


PML_NAMES = {
    "precision_at_1": "precision_at_1",
    "r_precision": "r_precision",
    "map_at_r": "mean_average_precision_at_r",
}


@pytest.mark.parametrize("backend", BACKENDS)
def test_matches_pml_accuracy_calculator(backend):
    ks = (1, 2, 4, 8, 32)
    embeddings, labels = _random_case(3, n=800)
    embeddings[:3] = embeddings[3]  # exact duplicates inside one class...
    labels[:4] = labels[4]
    labels[10] = 1000  # ... and a lone query
    ours = retrieval_metrics(embeddings, labels, recall_ks=ks, backend=backend)
    ours.update(clustering_metrics(embeddings, labels))
    normalized = torch.from_numpy(normalize_rows(embeddings))
    calculator = _RecallCalculator(
        ks,
        include=(*PML_NAMES.values(), "NMI", "AMI", *[f"recall_at_{k}" for k in ks]),
        k=max(ks),
        device=torch.device("cpu"),
    )
    pml = calculator.get_accuracy(normalized, torch.from_numpy(labels))
    for ours_name, pml_name in {
        **PML_NAMES,
        "nmi": "NMI",
        "ami": "AMI",
        **{f"recall_at_{k}": f"recall_at_{k}" for k in ks},
    }.items():
        assert ours[ours_name] == pytest.approx(pml[pml_name], abs=1e-9), ours_name


def test_query_gallery_matches_pml_without_self_exclusion():
    gallery, gallery_labels = _random_case(5, n=400)
    queries, query_labels = _random_case(5, n=120)
    calculator = _RecallCalculator((1, 10), include=(*PML_NAMES.values(), "recall_at_1", "recall_at_10"), k=40)
    pml = calculator.get_accuracy(
        torch.from_numpy(normalize_rows(queries)),
        torch.from_numpy(query_labels),
        torch.from_numpy(normalize_rows(gallery)),
        torch.from_numpy(gallery_labels),
        ref_includes_query=False,
    )
    ours = query_gallery_metrics(queries, query_labels, gallery, gallery_labels, recall_ks=(1, 10))
    for ours_name, pml_name in {**PML_NAMES, "recall_at_1": "recall_at_1", "recall_at_10": "recall_at_10"}.items():
        assert ours[ours_name] == pytest.approx(pml[pml_name], abs=1e-9), ours_name
    # The same image in query and gallery is found at rank 1 (nothing excluded in this mode).
    assert query_gallery_metrics(gallery, gallery_labels, gallery, gallery_labels)["precision_at_1"] == 1.0


@pytest.mark.parametrize("backend", BACKENDS)
def test_ties_are_broken_against_the_query(backend):
    # Collapsed embedding: every similarity ties, so nothing may be credited (not even by row order).
    labels = np.repeat(np.arange(4), 5)
    collapsed = np.ones((20, 8), dtype=np.float32)
    metrics = retrieval_metrics(collapsed, labels, recall_ks=(1, 15, 16), backend=backend)
    assert metrics["precision_at_1"] == metrics["r_precision"] == metrics["map_at_r"] == 0.0
    assert metrics["recall_at_15"] == 0.0 and metrics["recall_at_16"] == 1.0  # 15 other-class items rank first
    # Two groups of exact duplicates, across classes, around the boundary of the R list.
    rng = np.random.default_rng(1)
    embeddings = rng.normal(size=(60, 6)).astype(np.float32)
    labels = rng.integers(0, 6, size=60)
    embeddings[10:20] = embeddings[10]
    embeddings[30:36] = embeddings[30]
    ours = retrieval_metrics(embeddings, labels, recall_ks=(1, 3, 9, 30), backend=backend)
    _assert_same(ours, _brute_force(embeddings, labels, ks=(1, 3, 9, 30)))


def test_classes_of_size_one_are_left_out_and_k_is_never_capped():
    labels = np.array([0] * 40 + [1, 2, 3])  # R = 39 for class 0; classes 1-3 are singletons
    rng = np.random.default_rng(5)
    embeddings = np.concatenate(
        [[1.0, 0.0, 0.0] + 0.05 * rng.normal(size=(40, 3)), [[-1.0, 0.1, 0.0], [-1.0, 0.0, 0.1], [-1.0, -0.1, 0.0]]]
    )
    values = per_query_metrics(embeddings, labels)  # needs all 39 neighbours, far beyond max(recall_ks) = 8
    assert len(values.r) == 40 and set(values.r) == {39}
    assert list(values.query_index) == list(range(40))
    assert np.allclose(values.metrics["r_precision"], 1.0) and np.allclose(values.metrics["map_at_r"], 1.0)
    with pytest.raises(ValueError, match="no query has a same-class reference"):
        retrieval_metrics(embeddings[40:], labels[40:])


@pytest.mark.parametrize("backend", BACKENDS)
def test_largest_class_is_almost_everything(backend):
    # k = R = n - 2 for the big class: the ranked list covers nearly every reference.
    rng = np.random.default_rng(7)
    labels = np.array([0] * 30 + [1, 1])
    embeddings = rng.normal(size=(32, 5)).astype(np.float32)
    ours = retrieval_metrics(embeddings, labels, recall_ks=(1, 30, 31), backend=backend)
    _assert_same(ours, _brute_force(embeddings, labels, ks=(1, 30, 31)))


def test_tensor_and_string_label_inputs():
    embeddings, labels = _random_case(2, n=200)
    expected = retrieval_metrics(embeddings, labels)
    assert retrieval_metrics(torch.from_numpy(embeddings), torch.from_numpy(labels)) == expected
    assert retrieval_metrics(embeddings, np.array([f"class{c}" for c in labels])) == expected


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        (dict(query_embeddings=np.zeros((3, 2)), query_labels=[0, 1]), "labels have shape"),
        (dict(query_embeddings=np.full((2, 2), np.nan), query_labels=[0, 0]), "NaN or infinite"),
        (dict(query_embeddings=np.ones((2, 2)), query_labels=[0, 0], recall_ks=(0,)), "positive integers"),
        (dict(query_embeddings=np.ones((2, 2)), query_labels=[0, 0], reference_embeddings=np.ones((2, 2))), "both"),
        (
            dict(
                query_embeddings=np.ones((2, 2)),
                query_labels=[0, 0],
                reference_embeddings=np.ones((2, 3)),
                reference_labels=[0, 0],
            ),
            "dim",
        ),
    ],
)
def test_bad_input_is_rejected_in_one_line(kwargs, message):
    with pytest.raises(ValueError, match=message):
        retrieval_metrics(**kwargs)


def _sop_like(seed: int, classes: int = 40, dim: int = 32):
    """Several classes of 2-12 images each (as in SOP), shuffled: ~280 images."""
    rng = np.random.default_rng(seed)
    labels = rng.permutation(np.repeat(np.arange(classes), rng.integers(2, 13, size=classes)))
    centres = rng.normal(size=(classes, dim))
    return (centres[labels] + rng.normal(scale=1.2, size=(len(labels), dim))).astype(np.float32), labels


def _pml_as_benchmarked(embeddings: np.ndarray, labels: np.ndarray) -> dict[str, float]:
    """PML's calculator as benchmarks/eval_speed.py --pml runs it: its default k-NN (faiss-cpu
    IndexFlatL2) on the L2-normalised embeddings, k = max_bin_count."""
    from pytorch_metric_learning.utils.accuracy_calculator import AccuracyCalculator

    calculator = AccuracyCalculator(include=tuple(PML_NAMES.values()), k="max_bin_count", device=torch.device("cpu"))
    normalized = torch.nn.functional.normalize(torch.from_numpy(embeddings), dim=1)
    values = calculator.get_accuracy(normalized, torch.from_numpy(labels))
    return {ours: values[pml] for ours, pml in PML_NAMES.items()}


@pytest.mark.parametrize("schedule", ["rows", "symmetric"])
@pytest.mark.parametrize("backend", ["auto", *BACKENDS])
def test_equals_pml_as_the_speed_benchmark_compares(monkeypatch, backend, schedule):
    monkeypatch.setattr(symmetric, "MIN_REFERENCES", 0 if schedule == "symmetric" else 10**9)
    for seed in (0, 1):
        embeddings, labels = _sop_like(seed)
        ours = retrieval_metrics(embeddings, labels, recall_ks=(1,), backend=backend)
        pml = _pml_as_benchmarked(embeddings, labels)
        for name in PML_NAMES:
            assert ours[name] == pytest.approx(pml[name], abs=1e-9), name
        assert 0.1 < ours["map_at_r"] < 0.9  # neither trivial nor hopeless


@pytest.mark.parametrize("schedule", ["rows", "symmetric"])
def test_with_ties_pml_keeps_faiss_order_and_ours_the_documented_rule(monkeypatch, schedule):
    """Exact ties: ten identical images, five of class 0 and five of class 1, among other images.
    PML ranks the tied references in the order faiss returns them; ours ranks the other class first
    (docs/evaluation.md). The same metric formulas on PML's own order give PML's numbers, so the
    tie order is the only difference, and ours is the lower (never credited by a tie)."""
    from pytorch_metric_learning.utils.inference import FaissKNN

    from dmlbench.evaluate.metrics import list_metrics

    monkeypatch.setattr(symmetric, "MIN_REFERENCES", 0 if schedule == "symmetric" else 10**9)
    embeddings, labels = _sop_like(2, classes=30, dim=8)
    tied = np.concatenate([np.flatnonzero(labels == 0)[:5], np.flatnonzero(labels == 1)[:5]])
    embeddings[tied] = embeddings[tied[0]]
    labels[np.isin(labels, [0, 1]) & ~np.isin(np.arange(len(labels)), tied)] = 2  # classes 0 and 1: the tied ones only
    ours_values = per_query_metrics(embeddings, labels, recall_ks=(1,), backend="torch")
    ours = ours_values.means()
    pml = _pml_as_benchmarked(embeddings, labels)

    # each tied query: 4 same-class references at similarity 1 behind 5 of the other class
    in_tie = np.isin(ours_values.query_index, tied)
    for name in PML_NAMES:
        assert (ours_values.metrics[name][in_tie] == 0).all(), name
    # PML's numbers are our formulas applied to faiss's order
    k = int(np.bincount(labels).max()) - 1
    normalized = torch.nn.functional.normalize(torch.from_numpy(embeddings), dim=1)
    _, order = FaissKNN()(normalized, k, normalized, True)
    hits = labels[order.numpy()] == labels[:, None]
    r = np.bincount(labels)[labels] - 1
    on_pml_order = {name: float(v.mean()) for name, v in list_metrics(hits, r).items()}
    for name in PML_NAMES:
        assert pml[name] == pytest.approx(on_pml_order[name], abs=1e-12), name
        assert ours[name] <= pml[name] + 1e-12, name
    assert ours["map_at_r"] < pml["map_at_r"]  # faiss's order credits some of the tied same-class images
