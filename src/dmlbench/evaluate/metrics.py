"""Retrieval metrics as defined in "A Metric Learning Reality Check" (Musgrave et al., 2020).

For a query with R same-class references (its own row excluded in self-retrieval), ranked by
cosine similarity with pessimistic ties (:mod:`dmlbench.evaluate.knn`):

* Precision@1 = 1 if the nearest reference has the query's class;
* Recall@K    = 1 if any of the K nearest has the query's class (the DML sense; K beyond the
  reference set means all of it);
* R-Precision = r / R, r = same-class references among the R nearest;
* MAP@R       = (1/R) sum_{i=1..R} P(i), P(i) = precision of the top i if the i-th
  reference has the query's class, else 0.

Queries with R = 0 are left out of the means. All are exact (the list covers the largest R).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Any

import numpy as np

from dmlbench.evaluate.knn import rank_neighbours
from dmlbench.evaluate.ranking import RankingTask, as_numpy, normalize_rows


def metric_range(metric: str) -> tuple[float, float]:
    """Where a metric's values lie, for intervals that respect it: [0, 1] for every retrieval
    score, NMI and F1; AMI is chance-adjusted and can fall below 0, so it has no lower bound."""
    return (-math.inf, 1.0) if metric == "ami" else (0.0, 1.0)


def _check_embeddings(name: str, x: np.ndarray, labels: np.ndarray) -> None:
    if x.ndim != 2 or x.shape[0] == 0 or x.shape[1] == 0:
        raise ValueError(f"{name} must be a non-empty 2-D array (n x dim), got shape {x.shape}")
    if labels.ndim != 1 or len(labels) != len(x):
        raise ValueError(f"{name}: {len(x)} rows but labels have shape {labels.shape}; need one label per row")
    if not np.isfinite(x).all():
        raise ValueError(f"{name} contains NaN or infinite values")


@dataclass(frozen=True)
class PerQuery:
    """Per-query values of the queries with R >= 1: ``metrics`` (name -> float64 array, one value
    per query) and, apart, each query's R, its row in the query embeddings and its class label
    (the unit that interval bootstraps resample)."""

    metrics: dict[str, np.ndarray]
    r: np.ndarray
    query_index: np.ndarray
    query_label: np.ndarray

    def __len__(self) -> int:
        return len(self.r)

    def means(self) -> dict[str, float]:
        """Mean of each metric over the queries."""
        return {name: float(np.mean(v)) for name, v in self.metrics.items()}

    def arrays(self) -> dict[str, np.ndarray]:
        """Every array by name: the metrics, then ``r``, ``query_index`` and ``query_label``."""
        return self.metrics | {"r": self.r, "query_index": self.query_index, "query_label": self.query_label}


def per_query_metrics(
    query_embeddings: Any,
    query_labels: Any,
    reference_embeddings: Any = None,
    reference_labels: Any = None,
    recall_ks: Sequence[int] = (1, 2, 4, 8),
    backend: str = "auto",
    device: str | None = None,
    chunk_size: int | None = None,
    progress: bool = False,
) -> PerQuery:
    """Per-query metric values of the queries with R >= 1 (:class:`PerQuery`).

    No reference set: the queries are their own references and each query's own row is
    excluded. With a reference set: nothing is excluded (query/gallery protocol).
    """
    queries = as_numpy(query_embeddings)
    q_labels = as_numpy(query_labels)
    same_set = reference_embeddings is None
    if same_set != (reference_labels is None):
        raise ValueError("give both reference_embeddings and reference_labels, or neither")
    refs = queries if same_set else as_numpy(reference_embeddings)
    r_labels = q_labels if same_set else as_numpy(reference_labels)
    _check_embeddings("query_embeddings", queries, q_labels)
    if not same_set:
        _check_embeddings("reference_embeddings", refs, r_labels)
        if refs.shape[1] != queries.shape[1]:
            raise ValueError(f"query dim {queries.shape[1]} != reference dim {refs.shape[1]}")
    recall_ks = [int(k) for k in recall_ks]
    if not recall_ks or min(recall_ks) < 1:
        raise ValueError(f"recall_ks must be positive integers, got {recall_ks}")

    codes = np.unique(np.concatenate([q_labels, r_labels]), return_inverse=True)[1].astype(np.int64)
    q_codes, r_codes = codes[: len(q_labels)], codes[len(q_labels) :]
    r = np.bincount(r_codes, minlength=codes.max() + 1)[q_codes]
    if same_set:
        r = r - 1
    valid = np.flatnonzero(r > 0)
    if len(valid) == 0:
        raise ValueError("no query has a same-class reference: metrics are undefined")
    r = r[valid]

    queries = normalize_rows(queries)
    refs = queries if same_set else normalize_rows(refs)
    task = RankingTask(
        queries=queries[valid],
        query_labels=q_codes[valid],
        references=refs,
        reference_labels=r_codes,
        k=int(r.max()),  # never capped: the list covers every query's R
        first_limit=max(recall_ks),
        self_index=valid if same_set else None,
        backend=backend,
        device=device,
        chunk_size=chunk_size,
    )
    from tqdm import tqdm

    with tqdm(total=len(valid), desc="ranking neighbours", unit="query", leave=False, disable=not progress) as bar:
        ranking = rank_neighbours(replace(task, progress=bar.update))
    values = list_metrics(ranking.hits, r)
    for recall_k in recall_ks:
        values[f"recall_at_{recall_k}"] = (ranking.first_positive < recall_k).astype(np.float64)
    return PerQuery(values, r, valid, q_labels[valid])


def list_metrics(hits: np.ndarray, r: np.ndarray) -> dict[str, np.ndarray]:
    """P@1, R-Precision and MAP@R of each query (float64) from its ranked list: ``hits`` (m x k,
    bool) says which of its k nearest references have its class, best first, ``r`` (m, >= 1,
    <= k) its R. Vectorised over queries (module docstring for the formulas)."""
    k = hits.shape[1]
    ranks = np.arange(1, k + 1)
    relevant_in_r = hits & (ranks[None, :] <= r[:, None])
    precision_at_i = np.cumsum(relevant_in_r, axis=1, dtype=np.int32) / ranks[None, :]
    return {
        "precision_at_1": hits[:, 0].astype(np.float64),
        "r_precision": relevant_in_r.sum(axis=1) / r,
        "map_at_r": np.where(relevant_in_r, precision_at_i, 0.0).sum(axis=1) / r,
    }


def retrieval_metrics(
    query_embeddings: Any,
    query_labels: Any,
    reference_embeddings: Any = None,
    reference_labels: Any = None,
    recall_ks: Sequence[int] = (1, 2, 4, 8),
    backend: str = "auto",
    device: str | None = None,
) -> dict[str, float]:
    """Mean metrics over queries with R >= 1, as plain floats in [0, 1] (see module docstring)."""
    return per_query_metrics(
        query_embeddings, query_labels, reference_embeddings, reference_labels, recall_ks, backend, device
    ).means()


def query_gallery_metrics(
    query_embeddings: Any,
    query_labels: Any,
    gallery_embeddings: Any,
    gallery_labels: Any,
    recall_ks: Sequence[int] = (1, 10, 20, 30, 40, 50),
    backend: str = "auto",
    device: str | None = None,
) -> dict[str, float]:
    """Query/gallery datasets (In-Shop): every query searches the gallery; nothing is excluded,
    R = gallery images of the query's class, queries without any are left out."""
    return retrieval_metrics(
        query_embeddings, query_labels, gallery_embeddings, gallery_labels, recall_ks, backend, device
    )
