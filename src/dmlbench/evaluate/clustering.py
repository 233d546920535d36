"""Clustering quality: NMI, AMI and F1 of k-means clusters against the class labels.

As PML's ``AccuracyCalculator``: k-means with k = number of classes on the L2-normalised
embeddings, ``faiss.Kmeans(d, k, niter=20, seed=1234)``, then scikit-learn's NMI and AMI
(arithmetic normalisation); F1 (:func:`pairwise_f1`) from the same assignment. Backends:
``faiss`` (``faiss.Kmeans`` itself); ``screened`` (faiss's Lloyd iterations re-done step for step
with certified bf16 assignments, :mod:`dmlbench.evaluate.screen`, and a stop at a fixed point);
``torch`` (the same iterations with exact fp32 assignments on ``device``; without faiss, plain
Lloyd from a seeded start). docs/evaluation.md, "Metrics", says more."""

from __future__ import annotations

from typing import Any

import numpy as np

from dmlbench.devices import default_device
from dmlbench.evaluate.knn import faiss_available, faiss_gpus
from dmlbench.evaluate.ranking import as_numpy, full_fp32_matmul, normalize_rows
from dmlbench.evaluate.screen import NearestCentroids, fast_bf16_matmul

SPLIT_EPS = 1 / 1024  # faiss's perturbation when an empty cluster takes half of another

FAISS_KMEANS_SEED = 1234  # faiss.Kmeans's default, which PML uses


def kmeans_assign(
    x: np.ndarray,
    k: int,
    niter: int = 20,
    seed: int = FAISS_KMEANS_SEED,
    backend: str = "auto",
    device: str | None = None,
) -> np.ndarray:
    """Cluster index (0..k-1) of each row of ``x`` after ``niter`` Lloyd iterations
    (``device``: None = CUDA when available, as the neighbour search)."""
    x = np.ascontiguousarray(x, dtype=np.float32)
    if not 1 <= k <= len(x):
        raise ValueError(f"k-means needs 1 <= k <= n points; got k={k}, n={len(x)}")
    device = str(default_device(device))
    if backend == "auto":
        backend = resolve_kmeans_backend(device)
    if backend == "screened":
        return _kmeans_screened(x, k, niter, seed)
    if backend == "faiss":
        import faiss

        kmeans = faiss.Kmeans(
            x.shape[1], k, niter=niter, seed=seed, gpu=faiss_gpus() > 0, verbose=False, min_points_per_centroid=1
        )
        kmeans.train(x)
        _, assignment = kmeans.index.search(x, 1)
        return assignment[:, 0].astype(np.int64)
    if backend == "torch":
        return _kmeans_torch(x, k, niter, seed, device)
    raise ValueError(f"k-means backend must be auto, faiss, screened or torch; got {backend!r}")


def resolve_kmeans_backend(device: str) -> str:
    """The k-means ``auto`` choice: faiss when it has GPUs; on CUDA ``torch``; on a CPU with
    native bf16 ``screened``; else faiss; ``torch`` without faiss."""
    if not faiss_available():
        return "torch"
    if faiss_gpus() > 0:
        return "faiss"
    if str(device).startswith("cuda"):
        return "torch"
    return "screened" if fast_bf16_matmul() else "faiss"


class ExactNearestCentroids:
    """Nearest centroid of fixed points by an fp32 product on ``device`` (TF32 off):
    argmax_j x.c_j - |c_j|^2 / 2, the lowest j among equals. Blocks of rows keep the score
    matrix under ``budget_bytes`` (scores are computed in place); ``update`` recomputes everything (a GPU does it in
    milliseconds at SOP scale)."""

    def __init__(self, points: np.ndarray, device: str, budget_bytes: int = 1 << 30):
        import torch

        self.points = torch.from_numpy(points).to(device)
        self.device, self.budget_bytes = device, budget_bytes

    def __call__(self, centroids: np.ndarray) -> np.ndarray:
        import torch

        cents = torch.from_numpy(np.ascontiguousarray(centroids, dtype=np.float32)).to(self.device)
        half_norms = 0.5 * (cents * cents).sum(dim=1)
        block = max(1, self.budget_bytes // (4 * len(cents)))
        with torch.no_grad(), full_fp32_matmul():
            parts = [
                (self.points[s : s + block] @ cents.T).sub_(half_norms).argmax(dim=1)
                for s in range(0, len(self.points), block)
            ]
        return torch.cat(parts).cpu().numpy().astype(np.int64)

    def update(self, assignment: np.ndarray, old_centroids: np.ndarray, centroids: np.ndarray) -> np.ndarray:
        return self(centroids)


def _kmeans_screened(x: np.ndarray, k: int, niter: int, seed: int) -> np.ndarray:
    return _kmeans_faiss_steps(x, k, niter, seed, "screened")


def _kmeans_torch(x: np.ndarray, k: int, niter: int, seed: int, device: str) -> np.ndarray:
    if faiss_available():
        return _kmeans_faiss_steps(x, k, niter, seed, device)
    return _kmeans_lloyd(x, k, niter, seed, device)


def _kmeans_faiss_steps(x: np.ndarray, k: int, niter: int, seed: int, assign_on: str) -> np.ndarray:
    """faiss ``Clustering::train`` (random init, no sub-sampling as n <= 256 k here) re-done step
    for step, with a fixed-point stop; assignments by the certified bf16 screen on the CPU
    (``assign_on="screened"``) or by :class:`ExactNearestCentroids` on the torch device
    ``assign_on`` (module docstring)."""
    import faiss
    import torch

    n = len(x)
    if n > 256 * k:
        return kmeans_assign(x, k, niter, seed, backend="faiss")  # faiss sub-samples: use it as is
    points = torch.from_numpy(x)
    nearest_centroids: NearestCentroids | ExactNearestCentroids
    if assign_on == "screened":
        nearest_centroids = NearestCentroids(points, points.to(torch.bfloat16))
    else:
        nearest_centroids = ExactNearestCentroids(x, assign_on)
    if n == k:  # faiss: the points are the centroids
        return nearest_centroids(x)
    perm: np.ndarray = np.empty(n, dtype=np.int32)
    faiss.rand_perm(faiss.swig_ptr(perm), n, seed + 1)  # type: ignore[attr-defined]
    centroids = x[perm[:k]].copy()
    previous: np.ndarray | None = None
    previous_centroids, split = centroids, True
    for iteration in range(niter + 1):  # niter updates, each after an assignment, then the final one
        if previous is None:
            assignment = nearest_centroids(centroids)
        else:  # only moved centroids can take points: cheap once few clusters change
            assignment = nearest_centroids.update(previous, previous_centroids, centroids)
            if not split and np.array_equal(assignment, previous):
                return assignment  # fixed point: the remaining iterations change nothing
        if iteration == niter:
            return assignment
        previous, previous_centroids = assignment, centroids
        centroids, counts = _centroids(points, assignment, k)
        split = _split_empty_clusters(centroids, counts, n) > 0
    return assignment


def _centroids(points: Any, assignment: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
    """Mean of each cluster's points (``sum * (1 / count)`` in float32, as faiss); empty: 0."""
    import torch

    index = torch.from_numpy(assignment)
    sums = torch.zeros(k, points.shape[1], dtype=torch.float32).index_add_(0, index, points)
    counts = np.bincount(assignment, minlength=k).astype(np.float32)
    scale = np.divide(np.float32(1), counts, out=np.zeros_like(counts), where=counts > 0)
    return sums.numpy() * scale[:, None], counts


def _split_empty_clusters(centroids: np.ndarray, counts: np.ndarray, n: int) -> int:
    """faiss ``split_clusters``: each empty cluster copies a cluster drawn with probability
    (size - 1) / (n - k) and both move apart by +-1/1024 in alternate coordinates."""
    import faiss

    k = len(counts)
    empty = np.flatnonzero(counts == 0)
    if len(empty) == 0:
        return 0
    rng = faiss.RandomGenerator(1234)  # type: ignore[attr-defined]
    sign = np.where(np.arange(centroids.shape[1]) % 2 == 0, SPLIT_EPS, -SPLIT_EPS)
    for ci in empty:
        cj = 0
        while True:
            p = np.float32((float(counts[cj]) - 1.0) / float(np.float32(n - k)))
            if np.float32(rng.rand_float()) < p:
                break
            cj = (cj + 1) % k
        source = centroids[cj].copy()
        centroids[ci] = source * (1 + sign).astype(np.float32)
        centroids[cj] = source * (1 - sign).astype(np.float32)
        counts[ci] = np.float32(counts[cj] / 2)
        counts[cj] -= counts[ci]
    return len(empty)


def _kmeans_lloyd(x: np.ndarray, k: int, niter: int, seed: int, device: str) -> np.ndarray:
    """Without faiss: Lloyd's algorithm; initial centroids = k distinct random points; empty clusters keep
    their centroid; assignments by :class:`ExactNearestCentroids`."""
    import torch

    generator = torch.Generator().manual_seed(seed)
    nearest_centroids = ExactNearestCentroids(x, device, budget_bytes=1 << 28)
    points = nearest_centroids.points
    centroids = points[torch.randperm(len(x), generator=generator)[:k].to(device)].clone()
    with torch.no_grad():
        for _ in range(niter):
            labels = torch.from_numpy(nearest_centroids(centroids.cpu().numpy())).to(device)
            sums = torch.zeros_like(centroids).index_add_(0, labels, points)
            counts = torch.bincount(labels, minlength=k)
            filled = counts > 0
            centroids[filled] = sums[filled] / counts[filled, None].to(sums.dtype)
        return nearest_centroids(centroids.cpu().numpy())


def clustering_metrics(
    embeddings: Any,
    labels: Any,
    niter: int = 20,
    seed: int = FAISS_KMEANS_SEED,
    backend: str = "auto",
    device: str | None = None,
) -> dict[str, float]:
    """``{"nmi": ..., "ami": ..., "f1": ...}`` of one k-means (k = number of distinct labels)
    on the L2-normalised ``embeddings``, all three from the same assignment; plain floats (NMI
    in [0, 1], AMI <= 1 and ~0 for chance, F1 in [0, 1]: :func:`pairwise_f1`)."""
    from sklearn.metrics import normalized_mutual_info_score

    labels = as_numpy(labels).reshape(-1)
    x = normalize_rows(as_numpy(embeddings))
    if len(x) != len(labels):
        raise ValueError(f"embeddings have {len(x)} rows but there are {len(labels)} labels")
    k = len(np.unique(labels))
    clusters = kmeans_assign(x, k, niter=niter, seed=seed, backend=backend, device=device)
    return {
        "nmi": float(normalized_mutual_info_score(labels, clusters)),
        "ami": adjusted_mutual_info(labels, clusters),
        "f1": pairwise_f1(labels, clusters),
    }


def pair_counts(labels_true: Any, labels_pred: Any) -> tuple[int, int, int]:
    """``(TP, TP + FP, TP + FN)`` over the unordered pairs of points, exact Python ints: pairs in the
    same class and cluster, in the same cluster, in the same class. From the non-zero cells n_ij of
    the cluster x class table (sizes a_i, b_j): TP = sum_ij C(n_ij, 2), TP + FP = sum_i C(a_i, 2),
    TP + FN = sum_j C(b_j, 2)."""
    labels_true, labels_pred = np.asarray(labels_true).reshape(-1), np.asarray(labels_pred).reshape(-1)
    if len(labels_true) != len(labels_pred):
        raise ValueError(f"{len(labels_true)} class labels but {len(labels_pred)} cluster labels")
    if len(labels_true) == 0:
        return 0, 0, 0
    _, class_codes = np.unique(labels_true, return_inverse=True)
    _, cluster_codes = np.unique(labels_pred, return_inverse=True)
    class_codes, cluster_codes = class_codes.ravel().astype(np.int64), cluster_codes.ravel().astype(np.int64)
    cells = np.unique(cluster_codes * (int(class_codes.max()) + 1) + class_codes, return_counts=True)[1]

    def pairs(sizes: np.ndarray) -> int:
        sizes = sizes.astype(np.int64)
        return int(np.sum(sizes * (sizes - 1) // 2))

    return pairs(cells), pairs(np.bincount(cluster_codes)), pairs(np.bincount(class_codes))


def pairwise_f1(labels_true: Any, labels_pred: Any) -> float:
    """Clustering F1 of Oh Song et al. (CVPR 2016) in [0, 1]: the pair-counting F measure (Manning
    et al., *Introduction to Information Retrieval*, 2008, Sec. 16.3) over unordered pairs, positive =
    same class, predicted positive = same cluster (:func:`pair_counts`):

        F1 = 2 P R / (P + R) = 2 TP / (2 TP + FP + FN)

    The right-hand form settles 0 / 0: identical partitions give 1.0 (as scikit-learn's
    ``adjusted_rand_score``). The same F1 as rksltnl/Deep-Metric-Learning-CVPR16
    ``compute_clutering_metric.m`` and Confusezius/Revisiting_Deep_Metric_Learning_PyTorch
    ``metrics/f1.py`` (both NaN on 0 / 0), up to their k-means."""
    tp, same_cluster, same_class = pair_counts(labels_true, labels_pred)
    fp, fn = same_cluster - tp, same_class - tp
    if fp == 0 and fn == 0:
        return 1.0  # identical partitions (also when no pair shares a class or a cluster)
    return 2 * tp / (2 * tp + fp + fn)


def adjusted_mutual_info(labels_true: np.ndarray, labels_pred: np.ndarray) -> float:
    """scikit-learn's ``adjusted_mutual_info_score`` (arithmetic normalisation, same special
    cases): (MI - E[MI]) / (mean(H_true, H_pred) - E[MI]), with E[MI] from
    :func:`expected_mutual_information` (scikit-learn's own takes ~20 s at SOP scale)."""
    from sklearn.metrics import mutual_info_score

    _, true_codes = np.unique(labels_true, return_inverse=True)
    _, pred_codes = np.unique(labels_pred, return_inverse=True)
    class_sizes, cluster_sizes = np.bincount(true_codes.ravel()), np.bincount(pred_codes.ravel())
    if len(class_sizes) == len(cluster_sizes) == 1 or len(labels_true) == 0:
        return 1.0  # both labellings have zero entropy: a perfect match
    mi = mutual_info_score(true_codes.ravel(), pred_codes.ravel())
    emi = expected_mutual_information(class_sizes, cluster_sizes)
    normalizer = (_entropy(class_sizes) + _entropy(cluster_sizes)) / 2
    denominator = normalizer - emi
    eps = float(np.finfo("float64").eps)
    denominator = min(denominator, -eps) if denominator < 0 else max(denominator, eps)
    return float((mi - emi) / denominator)


def _entropy(sizes: np.ndarray) -> float:
    p = sizes[sizes > 0].astype(np.float64)
    total = p.sum()
    return float(-np.sum((p / total) * (np.log(p) - np.log(total))))


def expected_mutual_information(class_sizes: np.ndarray, cluster_sizes: np.ndarray) -> float:
    """E[MI] of two labellings under the hypergeometric model (Vinh et al., 2010), from the
    class sizes a_i and cluster sizes b_j (N = sum a = sum b):

        sum_i sum_j sum_{n=max(1, a_i+b_j-N)}^{min(a_i, b_j)} (n/N) log(N n / (a_i b_j))
            a_i! b_j! (N-a_i)! (N-b_j)! / (N! n! (a_i-n)! (b_j-n)! (N-a_i-b_j+n)!)

    summed once per pair of distinct sizes, weighted by their counts: scikit-learn's
    ``expected_mutual_information`` in O(distinct sizes^2 x largest size)."""
    from scipy.special import gammaln

    class_sizes = np.asarray(class_sizes, dtype=np.int64)
    cluster_sizes = np.asarray(cluster_sizes, dtype=np.int64)
    class_sizes, cluster_sizes = class_sizes[class_sizes > 0], cluster_sizes[cluster_sizes > 0]
    if len(class_sizes) == 1 or len(cluster_sizes) == 1:
        return 0.0  # a labelling with zero entropy
    n = float(class_sizes.sum())
    a_values, a_counts = np.unique(class_sizes, return_counts=True)
    b_values, b_counts = np.unique(cluster_sizes, return_counts=True)
    a, b = a_values[:, None].astype(np.float64), b_values[None, :].astype(np.float64)
    weight = a_counts[:, None].astype(np.float64) * b_counts[None, :]
    fixed = gammaln(a + 1) + gammaln(b + 1) + gammaln(n - a + 1) + gammaln(n - b + 1) - gammaln(n + 1)
    emi = 0.0
    for nij in range(1, int(min(a_values.max(), b_values.max())) + 1):
        valid = (nij >= a + b - n) & (nij <= np.minimum(a, b))
        rest = np.where(valid, n - a - b + nij, 1.0)
        log_p = fixed - gammaln(nij + 1) - gammaln(np.where(valid, a - nij, 0) + 1)
        log_p = log_p - gammaln(np.where(valid, b - nij, 0) + 1) - gammaln(rest + 1)
        term = (nij / n) * (np.log(n) + np.log(nij) - np.log(a) - np.log(b)) * np.exp(np.where(valid, log_p, -np.inf))
        emi += float(np.sum(weight * term))
    return emi
