"""Clustering quality: NMI and AMI of k-means clusters against the class labels.

As PML's ``AccuracyCalculator`` computes them: k-means with k = number of classes on the
L2-normalised embeddings, ``faiss.Kmeans(d, k, niter=20, seed=1234)`` (on the GPU when faiss
has one), each point assigned to its nearest centroid, then scikit-learn's
``normalized_mutual_info_score`` and ``adjusted_mutual_info_score`` (arithmetic
normalisation). Without faiss, a torch Lloyd k-means with the same k, iterations and a seeded
random initialisation stands in (same algorithm, different initial centroids).

Cost: ``niter x n x k x dim`` multiply-adds, k = number of classes: at SOP scale (60k x 11k
classes x 512) about 20x the neighbour search, so ``evaluate.clustering`` can be switched off
per dataset.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from dmlbench.evaluate.knn import _full_fp32_matmul, faiss_available, faiss_gpus, normalize_rows

FAISS_KMEANS_SEED = 1234  # faiss.Kmeans's default, which PML uses


def kmeans_assign(
    x: np.ndarray, k: int, niter: int = 20, seed: int = FAISS_KMEANS_SEED, backend: str = "auto", device: str = "cpu"
) -> np.ndarray:
    """Cluster index (0..k-1) of each row of ``x`` after ``niter`` Lloyd iterations."""
    x = np.ascontiguousarray(x, dtype=np.float32)
    if not 1 <= k <= len(x):
        raise ValueError(f"k-means needs 1 <= k <= n points; got k={k}, n={len(x)}")
    if backend == "auto":
        backend = "faiss" if faiss_available() else "torch"
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
    raise ValueError(f"k-means backend must be auto, faiss or torch; got {backend!r}")


def _kmeans_torch(x: np.ndarray, k: int, niter: int, seed: int, device: str) -> np.ndarray:
    """Lloyd's algorithm; initial centroids = k distinct random points; empty clusters keep
    their centroid. Assignment = argmax(x.c - |c|^2 / 2) = nearest centroid in L2."""
    import torch

    generator = torch.Generator().manual_seed(seed)
    points = torch.from_numpy(x).to(device)
    centroids = points[torch.randperm(len(x), generator=generator)[:k].to(device)].clone()
    chunk = max(1, (1 << 26) // k)

    def assign() -> torch.Tensor:
        half_norms = 0.5 * (centroids * centroids).sum(dim=1)
        return torch.cat(
            [(points[s : s + chunk] @ centroids.T - half_norms).argmax(dim=1) for s in range(0, len(points), chunk)]
        )

    with torch.no_grad(), _full_fp32_matmul():
        for _ in range(niter):
            labels = assign()
            sums = torch.zeros_like(centroids).index_add_(0, labels, points)
            counts = torch.bincount(labels, minlength=k)
            filled = counts > 0
            centroids[filled] = sums[filled] / counts[filled, None].to(sums.dtype)
        return assign().cpu().numpy().astype(np.int64)


def clustering_metrics(
    embeddings: Any,
    labels: Any,
    niter: int = 20,
    seed: int = FAISS_KMEANS_SEED,
    backend: str = "auto",
    device: str = "cpu",
) -> dict[str, float]:
    """``{"nmi": ..., "ami": ...}`` of k-means (k = number of distinct labels) on the
    L2-normalised ``embeddings``; plain floats (NMI in [0, 1], AMI <= 1, ~0 for chance)."""
    from sklearn.metrics import adjusted_mutual_info_score, normalized_mutual_info_score

    if hasattr(embeddings, "detach"):
        embeddings = embeddings.detach().cpu().numpy()
    if hasattr(labels, "detach"):
        labels = labels.detach().cpu().numpy()
    labels = np.asarray(labels).reshape(-1)
    x = normalize_rows(np.asarray(embeddings))
    if len(x) != len(labels):
        raise ValueError(f"embeddings have {len(x)} rows but there are {len(labels)} labels")
    k = len(np.unique(labels))
    clusters = kmeans_assign(x, k, niter=niter, seed=seed, backend=backend, device=device)
    return {
        "nmi": float(normalized_mutual_info_score(labels, clusters)),
        "ami": float(adjusted_mutual_info_score(labels, clusters)),
    }
