"""Retrieval metrics as defined in "A Metric Learning Reality Check" (Musgrave et al., 2020).

For a query with R same-class references (its own row excluded when the query set is the
reference set) and neighbours ranked by cosine similarity:

* Precision@1 = 1 if the nearest neighbour has the query's class;
* Recall@K    = 1 if any of the K nearest neighbours has the query's class (the DML sense,
  which is not the information-retrieval recall);
* R-Precision = (same-class neighbours among the R nearest) / R;
* MAP@R       = (1/R) sum_{i=1..R} P(i) * rel(i), P(i) = precision of the top i.

Queries with R = 0 (no other image of their class) are left out of the means. The neighbour
search always covers the largest R, so MAP@R and R-Precision are exact.
"""

from __future__ import annotations

from typing import Any, Sequence

import numpy as np

from dmlbench.evaluate.knn import knn


def _as_numpy(x: Any) -> np.ndarray:
    if hasattr(x, "detach"):
        x = x.detach().cpu().numpy()
    return np.asarray(x)


def per_query_metrics(
    query_embeddings: Any,
    query_labels: Any,
    reference_embeddings: Any = None,
    reference_labels: Any = None,
    recall_ks: Sequence[int] = (1, 2, 4, 8),
    backend: str = "auto",
) -> dict[str, np.ndarray]:
    """Per-query values (only queries with R >= 1), plus ``r`` (their R) for weighting/bootstrap."""
    queries = _as_numpy(query_embeddings).astype(np.float32)
    q_labels = _as_numpy(query_labels).reshape(-1)
    same_set = reference_embeddings is None
    if same_set != (reference_labels is None):
        raise ValueError("give both reference_embeddings and reference_labels, or neither")
    refs = queries if same_set else _as_numpy(reference_embeddings).astype(np.float32)
    r_labels = q_labels if same_set else _as_numpy(reference_labels).reshape(-1)
    if len(queries) != len(q_labels) or len(refs) != len(r_labels):
        raise ValueError("embeddings and labels differ in length")
    if len(recall_ks) == 0 or min(recall_ks) < 1:
        raise ValueError(f"recall_ks must be positive integers, got {list(recall_ks)}")

    classes, counts = np.unique(r_labels, return_counts=True)
    count_of = dict(zip(classes.tolist(), counts.tolist(), strict=True))
    r = np.array([count_of.get(label, 0) for label in q_labels.tolist()], dtype=np.int64)
    if same_set:
        r -= 1
    valid = r > 0
    if not valid.any():
        raise ValueError("no query has a same-class reference: metrics are undefined")

    available = len(refs) - (1 if same_set else 0)
    k = min(max(int(r[valid].max()), max(recall_ks)), available)
    if same_set:  # search with every row so that self-exclusion sees global row indices
        neighbours = knn(queries, refs, k, exclude_self=True, backend=backend)[valid]
    else:
        neighbours = knn(queries[valid], refs, k, backend=backend)
    q_labels, r = q_labels[valid], r[valid]
    hits = r_labels[neighbours] == q_labels[:, None]

    ranks = np.arange(1, k + 1)
    within_r = ranks[None, :] <= r[:, None]
    precision_at_i = np.cumsum(hits, axis=1) / ranks[None, :]
    values = {
        "precision_at_1": hits[:, 0].astype(np.float64),
        "r_precision": (hits & within_r).sum(axis=1) / r,
        "map_at_r": (precision_at_i * (hits & within_r)).sum(axis=1) / r,
    }
    for kk in recall_ks:
        values[f"recall_at_{kk}"] = hits[:, : min(kk, k)].any(axis=1).astype(np.float64)
    values["r"] = r
    return values


def retrieval_metrics(
    query_embeddings: Any,
    query_labels: Any,
    reference_embeddings: Any = None,
    reference_labels: Any = None,
    recall_ks: Sequence[int] = (1, 2, 4, 8),
    backend: str = "auto",
) -> dict[str, float]:
    """Mean metrics over queries with R >= 1, as plain floats in [0, 1] (see module docstring)."""
    values = per_query_metrics(
        query_embeddings, query_labels, reference_embeddings, reference_labels, recall_ks, backend
    )
    return {name: float(np.mean(v)) for name, v in values.items() if name != "r"}
