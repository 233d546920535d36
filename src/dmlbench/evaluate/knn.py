"""Exact k-nearest-neighbour search by cosine similarity, never building an n x n matrix.

``faiss`` (``IndexFlatIP`` on L2-normalised vectors) is the default backend; ``torch``
(chunked matmul + top-k) is the fallback when faiss is not installed. When the reference
set is the query set, each query's own row is removed from its neighbours.
"""

from __future__ import annotations

import numpy as np


def normalize_rows(x: np.ndarray) -> np.ndarray:
    """Rows scaled to unit L2 norm (zero rows stay zero), as contiguous float32."""
    x = np.ascontiguousarray(x, dtype=np.float32)
    norms = np.linalg.norm(x, axis=1, keepdims=True)
    return x / np.maximum(norms, 1e-12)


def _search_faiss(query: np.ndarray, reference: np.ndarray, k: int) -> np.ndarray:
    import faiss

    index = faiss.IndexFlatIP(reference.shape[1])
    index.add(reference)
    _, indices = index.search(query, k)
    return indices.astype(np.int64)


def _search_torch(query: np.ndarray, reference: np.ndarray, k: int, chunk: int = 4096) -> np.ndarray:
    import torch

    ref = torch.from_numpy(reference)
    out = np.empty((len(query), k), dtype=np.int64)
    for start in range(0, len(query), chunk):
        sims = torch.from_numpy(query[start : start + chunk]) @ ref.T
        out[start : start + chunk] = torch.topk(sims, k, dim=1).indices.numpy()
    return out


def knn(
    query: np.ndarray,
    reference: np.ndarray,
    k: int,
    exclude_self: bool = False,
    backend: str = "auto",
) -> np.ndarray:
    """Indices (``n_query x k``) of the ``k`` most cosine-similar reference rows, best first.

    ``exclude_self``: ``reference`` is ``query``; row ``i``'s own index is dropped (searching
    ``k + 1`` neighbours), so every row still has exactly ``k`` neighbours.
    """
    query, reference = normalize_rows(query), normalize_rows(reference)
    available = len(reference) - (1 if exclude_self else 0)
    if not 0 < k <= available:
        raise ValueError(f"k must be in [1, {available}], got {k}")
    search_k = k + 1 if exclude_self else k
    if backend == "auto":
        try:
            import faiss  # noqa: F401

            backend = "faiss"
        except ImportError:
            backend = "torch"
    search = {"faiss": _search_faiss, "torch": _search_torch}[backend]
    indices = search(query, reference, search_k)
    if not exclude_self:
        return indices
    is_self = indices == np.arange(len(query))[:, None]
    # A query absent from its own k+1 list (exact duplicates ranked ahead) drops its last neighbour.
    is_self[~is_self.any(axis=1), -1] = True
    return indices[~is_self].reshape(len(query), k)
