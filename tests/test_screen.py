"""bf16 screening with fp32 certificates: the bound holds, and the results equal the exact fp32 ones
(ranking, first-positive ranks, nearest centroids, k-means), including where certificates fail."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from dmlbench.evaluate import screen
from dmlbench.evaluate.clustering import adjusted_mutual_info, expected_mutual_information, kmeans_assign
from dmlbench.evaluate.knn import normalize_rows, rank_neighbours
from dmlbench.evaluate.metrics import per_query_metrics
from dmlbench.evaluate.ranking import RankingTask
from dmlbench.evaluate.screen import NearestCentroids, ScreenError, bf16_screen_error, nearest_centroids


def _clustered(seed: int, n: int, dim: int, classes: int, noise: float):
    rng = np.random.default_rng(seed)
    labels = rng.integers(0, classes, size=n)
    centres = rng.normal(size=(classes, dim)).astype(np.float32)
    return normalize_rows(centres[labels] + noise * rng.normal(size=(n, dim)).astype(np.float32)), labels


def _adversarial(seed: int, n: int, dim: int) -> np.ndarray:
    """Rows whose coordinates sit near bf16 rounding midpoints (worst input rounding), plus
    spiky rows (one dominant coordinate) and exact duplicates."""
    rng = np.random.default_rng(seed)
    mantissa = 1 + (rng.integers(0, 128, size=(n, dim)) + 0.4999) / 128  # just below a midpoint
    x = (mantissa * 2.0 ** rng.integers(-8, -3, size=(n, dim)) * rng.choice([-1, 1], size=(n, dim))).astype(np.float32)
    x[: n // 8, 0] = 40.0
    x[n // 8 : n // 4] = x[n // 8]
    return normalize_rows(x)


@pytest.mark.parametrize("dim", [8, 64, 512])
def test_bf16_error_stays_within_the_bound(dim):
    x = torch.from_numpy(_adversarial(dim, 600, dim))
    y = torch.from_numpy(_adversarial(dim + 1, 700, dim))
    x16, y16 = x.to(torch.bfloat16), y.to(torch.bfloat16)
    approx = (x16 @ y16.T).float().double().numpy()
    exact = (x.double() @ y.double().T).numpy()
    error = np.abs(approx - exact)
    per_query = ScreenError(y, y16).base(x, x16)[:, None] + screen.RESULT_ROUNDING * np.abs(approx)
    assert (error <= per_query).all()
    assert (per_query <= bf16_screen_error(dim)).all()  # the per-query bound is the tighter one
    assert error.max() > 0.05 * bf16_screen_error(dim)  # and the data really does stress it


def _assert_same_ranking(x, labels, k, first_limit, chunk=None):
    task = dict(queries=x, query_labels=labels, references=x, reference_labels=labels, k=k, first_limit=first_limit)
    exact = rank_neighbours(RankingTask(**task, self_index=np.arange(len(x)), backend="torch", chunk_size=chunk))
    screened = rank_neighbours(RankingTask(**task, self_index=np.arange(len(x)), backend="screened", chunk_size=chunk))
    assert np.array_equal(exact.hits, screened.hits)
    assert np.array_equal(exact.first_positive, screened.first_positive)
    return exact


@pytest.mark.parametrize("margin", [0, 4, screen.SCREEN_MARGIN])
def test_screened_ranking_equals_fp32_with_and_without_certificates(monkeypatch, margin):
    # margin 0: the L-th candidate is the k-th, so most certificates fail and the fp32 path runs.
    monkeypatch.setattr(screen, "SCREEN_MARGIN", margin)
    x, labels = _clustered(0, 1500, 64, 150, noise=1.5)
    ranking = _assert_same_ranking(x, labels, 12, 500, chunk=256)
    assert 0 < ranking.first_positive.mean() < 500  # the first-positive counting really ran


def test_screened_ranking_on_adversarial_rows_and_a_query_gallery_split():
    x = _adversarial(3, 900, 96)
    labels = np.random.default_rng(3).integers(0, 60, size=900)
    _assert_same_ranking(x, labels, 20, 899)
    queries, gallery = x[:200], x[200:]
    q_labels, g_labels = labels[:200], labels[200:]
    task = dict(queries=queries, query_labels=q_labels, references=gallery, reference_labels=g_labels, k=30)
    a = rank_neighbours(RankingTask(**task, first_limit=700, backend="torch"))
    b = rank_neighbours(RankingTask(**task, first_limit=700, backend="screened"))
    assert np.array_equal(a.hits, b.hits) and np.array_equal(a.first_positive, b.first_positive)


def test_first_positive_behind_everything_uses_the_exact_path_for_negative_thresholds():
    # Each query's only same-class reference points away from it (similarity < 0), so the
    # count threshold is negative: the raw-bits shortcut does not apply.
    rng = np.random.default_rng(4)
    base = normalize_rows(rng.normal(size=(100, 16)).astype(np.float32))
    x = np.concatenate([base, -base + 0.01 * rng.normal(size=base.shape).astype(np.float32)])
    x = normalize_rows(x)
    labels = np.concatenate([np.arange(100), np.arange(100)])
    ranking = _assert_same_ranking(x, labels, 1, 199)
    assert (ranking.first_positive > 150).all()


def test_a_block_whose_first_positives_are_all_past_the_limit_ranks_like_fp32():
    # Unclustered rows, 10 per class, small blocks: in some block every query whose first positive
    # needs counting is already past the limit, so no similarity is left in the uncertain band.
    rng = np.random.default_rng(7)
    x = rng.normal(size=(2600, 32)).astype(np.float32)
    labels = rng.integers(0, 260, size=2600)
    ks = (1, 2, 4, 8, 16, 32)
    screened = per_query_metrics(x, labels, recall_ks=ks, backend="screened", device="cpu", chunk_size=37)
    exact = per_query_metrics(x, labels, recall_ks=ks, backend="torch", device="cpu", chunk_size=37)
    assert screened.metrics.keys() == exact.metrics.keys()
    for name, values in exact.metrics.items():
        np.testing.assert_array_equal(screened.metrics[name], values, err_msg=name)


def test_nearest_centroids_equal_the_fp32_argmin():
    x, _ = _clustered(5, 3000, 48, 40, noise=2.0)
    rng = np.random.default_rng(5)
    centroids = np.concatenate([x[rng.choice(3000, 200, replace=False)], np.zeros((1, 48), np.float32)])
    centroids[10] = centroids[11]  # a duplicate: ties go to the lower index
    points = torch.from_numpy(x)
    found = nearest_centroids(points, points.to(torch.bfloat16), centroids, chunk=512)
    assert np.array_equal(found, _nearest_fp64(x, centroids))
    assert 11 not in found


def _nearest_fp64(x, centroids):
    distances = ((x[:, None, :].astype(np.float64) - centroids[None].astype(np.float64)) ** 2).sum(-1)
    return distances.argmin(axis=1)  # first minimum: the lowest index among equals


def test_assignment_after_a_few_centroids_move_equals_a_full_one(monkeypatch):
    x, _ = _clustered(6, 2500, 32, 30, noise=1.0)
    rng = np.random.default_rng(6)
    points = torch.from_numpy(x)
    assign = NearestCentroids(points, points.to(torch.bfloat16), block=300)
    old = x[rng.choice(len(x), 120, replace=False)].copy()
    previous = assign(old)
    assert np.array_equal(previous, _nearest_fp64(x, old))
    assert np.array_equal(assign(old, np.arange(100, 900)), previous[100:900])  # a subset of the points
    new = old.copy()
    new[3] = x[:40].mean(axis=0)  # moves next to many points: takes them over
    new[7] = 5.0  # moves far away: its points must find another centroid
    new[50] = new[20]  # moves onto an unmoved centroid with a lower index: that one keeps the ties
    new[9] = new[90]  # moves onto an unmoved centroid with a higher index: it takes the ties
    new[60] = old[60] * np.float32(1 + 2**-20)  # a tiny move still counts as a move
    calls = []
    full_call = NearestCentroids.__call__
    monkeypatch.setattr(
        NearestCentroids, "__call__", lambda self, c, rows=None: calls.append(rows) or full_call(self, c, rows)
    )
    updated = assign.update(previous, old, new)
    assert all(rows is not None for rows in calls)  # no full assignment was needed
    assert sum(len(rows) for rows in calls) < 1.5 * len(x)
    expected = _nearest_fp64(x, new)
    assert np.array_equal(updated, expected)
    assert (updated != previous).sum() > 40 and (updated == 3).sum() >= 40 and not (updated == 7).any()
    assert (previous == 90).any() and not (updated == 90).any()  # equal scores: the lower index wins
    assert (previous == 20).any() and not (updated == 50).any()
    assert np.array_equal(assign.update(updated, new, new.copy()), updated)  # nothing moved


@pytest.mark.parametrize("backend", ["screened", "torch"])
@pytest.mark.parametrize(("n", "dim", "k"), [(2000, 16, 100), (3000, 32, 600), (500, 8, 250), (300, 4, 299)])
def test_screened_and_torch_kmeans_reproduce_faiss_kmeans(n, dim, k, backend):
    # Same initial centroids, updates and empty-cluster splits as faiss (k close to n forces
    # splits); torch assigns with an exact fp32 product (on the CPU here, on CUDA in test_gpu.py).
    x = normalize_rows(np.random.default_rng(n + k).normal(size=(n, dim)).astype(np.float32))
    ours = kmeans_assign(x, k, niter=20, backend=backend, device="cpu")
    theirs = kmeans_assign(x, k, niter=20, backend="faiss")
    assert np.array_equal(ours, theirs)


@pytest.mark.parametrize(("n", "classes", "clusters"), [(50, 3, 4), (300, 40, 35), (2000, 300, 280), (2000, 2, 1)])
def test_adjusted_mutual_info_equals_scikit_learn(n, classes, clusters):
    from sklearn.metrics import adjusted_mutual_info_score
    from sklearn.metrics.cluster import contingency_matrix
    from sklearn.metrics.cluster._expected_mutual_info_fast import expected_mutual_information as sklearn_emi

    rng = np.random.default_rng(n + classes)
    truth = rng.integers(0, classes, n)
    noisy = np.where(rng.random(n) < 0.5, truth, rng.integers(0, clusters, n))
    for predicted in (rng.integers(0, clusters, n), noisy, truth):
        assert adjusted_mutual_info(truth, predicted) == pytest.approx(
            adjusted_mutual_info_score(truth, predicted), abs=1e-10
        )
        sizes = np.bincount(np.unique(truth, return_inverse=True)[1])
        cluster_sizes = np.bincount(np.unique(predicted, return_inverse=True)[1])
        contingency = contingency_matrix(truth, predicted, sparse=True)
        assert expected_mutual_information(sizes, cluster_sizes) == pytest.approx(
            sklearn_emi(contingency, n), rel=1e-9, abs=1e-12
        )
    assert adjusted_mutual_info(np.zeros(10), np.zeros(10)) == 1.0


def test_kmeans_auto_choice_covers_every_branch(monkeypatch):
    from dmlbench.evaluate import clustering

    monkeypatch.setattr(clustering, "faiss_gpus", lambda: 0)
    monkeypatch.setattr(clustering, "fast_bf16_matmul", lambda: True)
    assert clustering.resolve_kmeans_backend("cpu") == "screened"  # native bf16: certified screen
    assert clustering.resolve_kmeans_backend("cuda") == "torch"  # a GPU, faiss-cpu: fp32 on CUDA
    assert clustering.resolve_kmeans_backend("cuda:1") == "torch"
    monkeypatch.setattr(clustering, "fast_bf16_matmul", lambda: False)
    assert clustering.resolve_kmeans_backend("cpu") == "faiss"
    monkeypatch.setattr(clustering, "faiss_gpus", lambda: 2)
    assert clustering.resolve_kmeans_backend("cpu") == "faiss"  # faiss-gpu wins everywhere
    assert clustering.resolve_kmeans_backend("cuda") == "faiss"
    monkeypatch.setattr(clustering, "faiss_available", lambda: False)
    assert clustering.resolve_kmeans_backend("cpu") == "torch"  # no faiss: plain Lloyd
    # device None follows torch's view of the machine
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    assert clustering.resolve_kmeans_backend(str(clustering.default_device(None))) == "torch"
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert clustering.default_device(None) == torch.device("cpu")


def test_torch_kmeans_without_faiss_is_a_seeded_lloyd(monkeypatch):
    from dmlbench.evaluate import clustering

    rng = np.random.default_rng(3)
    centres = normalize_rows(rng.normal(size=(6, 8)).astype(np.float32))
    x = normalize_rows(centres[np.repeat(np.arange(6), 40)] + 0.05 * rng.normal(size=(240, 8)).astype(np.float32))
    monkeypatch.setattr(clustering, "faiss_available", lambda: False)
    first = kmeans_assign(x, 6, niter=50, backend="auto", device="cpu")
    assert np.array_equal(first, kmeans_assign(x, 6, niter=50, backend="torch", device="cpu"))  # reproducible
    # a Lloyd fixed point: every point is nearest to the mean of its own cluster
    used = np.unique(first)
    means = np.stack([x[first == c].mean(axis=0) for c in used])
    nearest = used[np.argmin(((x[:, None, :] - means[None]) ** 2).sum(axis=2), axis=1)]
    assert np.array_equal(nearest, first) and len(used) >= 5


def test_exact_nearest_centroids_give_the_same_answer_in_any_number_of_blocks():
    from dmlbench.evaluate.clustering import ExactNearestCentroids

    rng = np.random.default_rng(11)
    x = normalize_rows(rng.normal(size=(500, 16)).astype(np.float32))
    centroids = x[rng.choice(500, 40, replace=False)] * np.float32(0.9)
    centroids[7] = centroids[3]  # equal centroids: the lower index wins, as faiss's top-1
    whole = ExactNearestCentroids(x, "cpu")(centroids)
    for budget in (4 * 40, 4 * 40 * 7, 4 * 40 * 499):  # 1, 7 and 499 rows per block
        assert np.array_equal(ExactNearestCentroids(x, "cpu", budget_bytes=budget)(centroids), whole)
    expected = np.argmin(((x[:, None, :].astype(np.float64) - centroids[None]) ** 2).sum(axis=2), axis=1)
    assert np.array_equal(whole, expected) and (whole == 3).any() and not (whole == 7).any()


def test_nan_similarities_are_ordered_as_the_tie_rule_orders_them():
    import torch

    from dmlbench.evaluate.ranking import canonical_hits, canonical_hits_sorted

    values = np.array([[0.9, 0.5, 0.2, 0.1], [0.8, 0.7, 0.6, 0.5]], dtype=np.float32)
    values[0, 2] = np.nan
    hits = np.array([[True, False, True, False], [False, True, False, True]])
    top_values, order = torch.topk(torch.from_numpy(values), 4, dim=1)
    top_hits = torch.from_numpy(hits).gather(1, order)
    sorted_hits, sorted_ties = canonical_hits_sorted(top_values, top_hits, 3)
    expected_hits, expected_ties = canonical_hits(top_values.numpy(), top_hits.numpy(), 3)
    assert np.array_equal(sorted_hits, expected_hits) and np.array_equal(sorted_ties, expected_ties)
