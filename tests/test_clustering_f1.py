"""Clustering F1 (Oh Song et al., CVPR 2016) against independent computations: brute-force
pair counting, scikit-learn's pair confusion matrix, and worked examples; exact (integer
counts, one rounding), so no tolerance depends on the CPU."""

from __future__ import annotations

from fractions import Fraction
from itertools import combinations

import numpy as np
import pytest

from dmlbench.evaluate import clustering
from dmlbench.evaluate.clustering import clustering_metrics, pair_counts, pairwise_f1


def _brute_force(labels_true, labels_pred) -> tuple[int, int, int, float]:
    """TP, FP, FN over all n (n - 1) / 2 unordered pairs, and F1 = 2PR / (P + R) in exact
    rationals (None where P, R or P + R is 0 / 0)."""
    tp = fp = fn = 0
    for i, j in combinations(range(len(labels_true)), 2):
        same_class, same_cluster = labels_true[i] == labels_true[j], labels_pred[i] == labels_pred[j]
        tp += same_class and same_cluster
        fp += same_cluster and not same_class
        fn += same_class and not same_cluster
    if tp + fp == 0 or tp + fn == 0 or tp == 0:
        return tp, fp, fn, None
    precision, recall = Fraction(tp, tp + fp), Fraction(tp, tp + fn)
    return tp, fp, fn, float(2 * precision * recall / (precision + recall))


def _random_cases(seed: int, count: int = 60):
    rng = np.random.default_rng(seed)
    for _ in range(count):
        n = int(rng.integers(2, 70))
        classes, clusters = int(rng.integers(1, n + 1)), int(rng.integers(1, n + 1))
        truth = rng.integers(0, classes, n)
        noisy = np.where(rng.random(n) < 0.6, truth, rng.integers(0, clusters, n))
        yield truth, rng.integers(0, clusters, n)
        yield truth, noisy


def test_matches_brute_force_pair_counting():
    seen_positive = 0
    for truth, predicted in _random_cases(0):
        tp, fp, fn, expected = _brute_force(truth.tolist(), predicted.tolist())
        assert pair_counts(truth, predicted) == (tp, tp + fp, tp + fn)
        if expected is not None:
            seen_positive += 1
            assert pairwise_f1(truth, predicted) == expected  # exact: same rational, one rounding
        elif fp == fn == 0:
            assert pairwise_f1(truth, predicted) == 1.0
        else:
            assert pairwise_f1(truth, predicted) == 0.0
    assert seen_positive > 60


def test_matches_scikit_learn_pair_confusion_matrix_halved():
    from sklearn.metrics import pair_confusion_matrix

    rng = np.random.default_rng(1)
    cases = list(_random_cases(2))
    truth = rng.integers(0, 300, 2000)
    cases.append((truth, np.where(rng.random(2000) < 0.5, truth, rng.integers(0, 280, 2000))))
    for truth, predicted in cases:
        confusion = pair_confusion_matrix(truth, predicted)  # ordered pairs: each pair twice
        assert (confusion % 2 == 0).all()
        tp, fp, fn = (int(confusion[1, 1]) // 2, int(confusion[0, 1]) // 2, int(confusion[1, 0]) // 2)
        assert pair_counts(truth, predicted) == (tp, tp + fp, tp + fn)
        if tp > 0:
            assert pairwise_f1(truth, predicted) == float(Fraction(2 * tp, 2 * tp + fp + fn))


def test_hand_worked_examples():
    # classes {0,1} {2,3}; clusters {0,1,2} {3}: same-cluster pairs 01 02 12, same-class 01 23,
    # TP = 1 (01), P = 1/3, R = 1/2, F1 = 2 (1/6) / (5/6) = 2/5.
    assert pair_counts([0, 0, 1, 1], [0, 0, 0, 1]) == (1, 3, 2)
    assert pairwise_f1([0, 0, 1, 1], [0, 0, 0, 1]) == 0.4
    # Manning, Raghavan & Schuetze, Introduction to Information Retrieval, Sec. 16.3 (Fig. 16.4):
    # clusters {5 x, 1 o}, {1 x, 4 o, 1 d}, {2 x, 3 d}: TP = 20, FP = 20, FN = 24, F1 = 40/84.
    classes = list("xxxxxo" + "xooood" + "xxddd")
    clusters = [1] * 6 + [2] * 6 + [3] * 5
    assert pair_counts(classes, clusters) == (20, 40, 44)
    assert pairwise_f1(classes, clusters) == 10 / 21
    assert round(pairwise_f1(classes, clusters), 2) == 0.48  # the book's value


def test_invariant_to_renumbering_and_symmetric():
    rng = np.random.default_rng(3)
    for truth, predicted in _random_cases(4, count=20):
        f1 = pairwise_f1(truth, predicted)
        class_names = rng.permutation(1000)[: truth.max() + 1] - 500  # arbitrary, negative too
        cluster_names = rng.permutation(predicted.max() + 1)
        assert pairwise_f1(class_names[truth], cluster_names[predicted]) == f1
        assert pairwise_f1([f"class{c}" for c in truth], predicted.astype(np.float64)) == f1
        assert pairwise_f1(predicted, truth) == f1  # swapping the labellings swaps P and R
        order = rng.permutation(len(truth))
        assert pairwise_f1(truth[order], predicted[order]) == f1


def test_perfect_and_degenerate_clusterings():
    rng = np.random.default_rng(5)
    truth = rng.integers(0, 40, 500)
    assert pairwise_f1(truth, truth) == 1.0
    assert pairwise_f1(truth, rng.permutation(1000)[truth]) == 1.0  # renumbered clusters
    assert pairwise_f1(truth, np.arange(500)) == 0.0  # every point alone: TP = 0, R = 0
    assert pairwise_f1([0, 0, 0, 1, 1], [0, 0, 0, 0, 0]) == 2 * 4 / (2 * 4 + 6)  # one cluster: P = 4/10
    # No positive pairs at all (every class a singleton):
    assert pairwise_f1(np.arange(6), np.arange(6)[::-1]) == 1.0  # every cluster one point too
    assert pairwise_f1(np.arange(6), [0, 0, 1, 2, 3, 4]) == 0.0  # a cluster merges two classes
    assert pairwise_f1([7], [3]) == 1.0 and pairwise_f1([], []) == 1.0  # no pairs
    assert pairwise_f1([0, 0], [5, 5]) == 1.0
    with pytest.raises(ValueError, match="3 class labels but 2 cluster labels"):
        pairwise_f1([0, 1, 2], [0, 1])


def test_sop_scale_counts_are_exact_integers():
    rng = np.random.default_rng(6)
    truth = np.repeat(np.arange(11_316), rng.integers(2, 13, 11_316))
    predicted = np.where(rng.random(len(truth)) < 0.7, truth, rng.integers(0, 11_316, len(truth)))
    tp, same_cluster, same_class = pair_counts(truth, predicted)
    assert all(type(c) is int for c in (tp, same_cluster, same_class))
    sizes = np.bincount(truth)
    assert same_class == sum(int(s) * (int(s) - 1) // 2 for s in sizes)
    assert 0 < pairwise_f1(truth, predicted) < 1


def test_clustering_metrics_takes_f1_from_the_same_single_k_means(monkeypatch):
    from sklearn.metrics import normalized_mutual_info_score

    rng = np.random.default_rng(7)
    labels = rng.integers(0, 12, 200)
    embeddings = rng.standard_normal((200, 16)).astype(np.float32)
    assignment = np.where(rng.random(200) < 0.6, labels, rng.integers(0, 12, 200))
    calls = []

    def fake_kmeans(x, k, **kwargs):
        calls.append(k)
        return assignment

    monkeypatch.setattr(clustering, "kmeans_assign", fake_kmeans)
    found = clustering_metrics(embeddings, labels)
    assert calls == [12]  # one k-means, k = classes
    assert set(found) == {"nmi", "ami", "f1"} and all(type(v) is float for v in found.values())
    assert found["f1"] == pairwise_f1(labels, assignment)
    assert found["nmi"] == normalized_mutual_info_score(labels, assignment)


def test_clustering_metrics_reports_f1_with_a_real_k_means():
    rng = np.random.default_rng(8)
    labels = np.repeat(np.arange(10), 12)
    embeddings = rng.standard_normal((10, 32))[labels] + 0.3 * rng.standard_normal((120, 32))
    found = clustering_metrics(embeddings, labels, backend="torch")
    assert 0.0 <= found["f1"] <= 1.0 and 0.0 <= found["nmi"] <= 1.0
