"""The exact-ranking core that every neighbour search shares: the ``Ranking`` contract, the
pessimistic tie rule, each query's same-class references, chunking, and the chunked torch
search (CPU or CUDA, fp32 with TF32 off) that the other backends fall back on.

Tie rule: among references with exactly equal similarity, those of a different class than the
query rank first (:func:`canonical_hits`), so a metric never profits from ties and the result
depends on the similarity values only (module docstring of :mod:`dmlbench.evaluate.knn`).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from dataclasses import dataclass

import numpy as np

CHUNK_BYTES = 1 << 28  # similarity block budget: 256 MB of float32 per chunk


def normalize_rows(x: np.ndarray) -> np.ndarray:
    """Rows scaled to unit L2 norm (zero rows stay zero), as contiguous float32."""
    x = np.ascontiguousarray(x, dtype=np.float32)
    norms = np.linalg.norm(x, axis=1, keepdims=True)
    return np.ascontiguousarray(x / np.maximum(norms, 1e-12), dtype=np.float32)


def rows_per_chunk(n_reference: int, budget_bytes: int = CHUNK_BYTES) -> int:
    return max(1, min(1 << 16, budget_bytes // max(1, 4 * n_reference)))


@contextlib.contextmanager
def full_fp32_matmul() -> Iterator[None]:
    """Exact fp32 products on CUDA (no TF32), restored afterwards."""
    import torch

    previous = torch.get_float32_matmul_precision()
    torch.set_float32_matmul_precision("highest")
    try:
        yield
    finally:
        torch.set_float32_matmul_precision(previous)


@dataclass(frozen=True)
class Ranking:
    """Relevance of the ``k`` nearest references of each query, best first (pessimistic ties),
    and the exact 0-based rank of each query's nearest same-class reference when it is
    ``< first_limit`` (else ``first_limit``)."""

    hits: np.ndarray  # bool (m, k)
    first_positive: np.ndarray  # int64 (m,)
    first_limit: int


def canonical_hits(values: np.ndarray, hits: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
    """Order each row by similarity descending, different-class first among equals; keep ``k``.

    Returns the hits and a mask of rows whose k-th and (k+1)-th values are equal: for those the
    set of k items itself depends on ties outside the list, so they are recomputed exactly.
    """
    order = np.lexsort((hits, -values), axis=1)
    ordered = np.take_along_axis(hits, order, axis=1)[:, :k]
    if values.shape[1] > k:
        boundary_tie = values[:, k - 1] == values[:, k]
    else:
        boundary_tie = np.zeros(len(values), dtype=bool)
    return ordered, boundary_tie


def canonical_hits_sorted(values, hits, k: int) -> tuple[np.ndarray, np.ndarray]:
    """:func:`canonical_hits` of ``torch.topk`` output (values already descending), as numpy:
    only rows holding equal values (or NaN) need reordering, so only those leave the device whole."""
    import torch

    ordered = np.array(hits[:, :k].cpu().numpy())  # a copy: on the CPU .numpy() shares the caller's tensor
    if values.shape[1] > k:
        boundary_tie = (values[:, k - 1] == values[:, k]).cpu().numpy()
    else:
        boundary_tie = np.zeros(len(ordered), dtype=bool)
    # rows with equal neighbours, or with NaN (topk puts NaN first, the tie rule's lexsort last)
    unordered = (values[:, 1:] == values[:, :-1]).any(dim=1) | torch.isnan(values).any(dim=1)
    tied = np.flatnonzero(unordered.cpu().numpy())
    if len(tied):
        rows = torch.from_numpy(tied).to(values.device)
        ordered[tied] = canonical_hits(values[rows].cpu().numpy(), hits[rows].cpu().numpy(), k)[0]
    return ordered, boundary_tie


def exact_row(sims: np.ndarray, relevant: np.ndarray, k: int) -> np.ndarray:
    """Pessimistic-tie ranking of one full similarity row (self already set to -inf)."""
    order = np.lexsort((relevant, -sims))
    return relevant[order[:k]]


def positive_index_matrix(
    query_labels: np.ndarray, reference_labels: np.ndarray, self_index: np.ndarray | None, width: int
) -> np.ndarray:
    """``m x width`` indices of each query's same-class references (self excluded), -1 padded."""
    order = np.argsort(reference_labels, kind="stable")
    sorted_labels = reference_labels[order]
    start = np.searchsorted(sorted_labels, query_labels, side="left")
    stop = np.searchsorted(sorted_labels, query_labels, side="right")
    extra = 1 if self_index is not None else 0
    cols = np.arange(width + extra)
    pos = start[:, None] + cols[None, :]
    inside = pos < stop[:, None]
    candidates = np.where(inside, order[np.minimum(pos, len(order) - 1)], -1)
    if self_index is not None:
        candidates = np.where(candidates == self_index[:, None], -1, candidates)
        # the -1 left where self was moves to the end of its row
        keep = np.argsort(candidates < 0, axis=1, kind="stable")
        candidates = np.take_along_axis(candidates, keep, axis=1)
    return np.ascontiguousarray(candidates[:, :width])


def rank_torch(
    queries, query_labels, references, reference_labels, k, first_limit, self_index, device, chunk, progress
):
    import torch

    m, n = len(queries), len(references)
    chunk = chunk or rows_per_chunk(n, CHUNK_BYTES * (4 if str(device).startswith("cuda") else 1))
    r_max = int(np.bincount(np.unique(reference_labels, return_inverse=True)[1]).max())
    positives = positive_index_matrix(query_labels, reference_labels, self_index, r_max)
    hits_out = np.empty((m, k), dtype=bool)
    first_out = np.empty(m, dtype=np.int64)
    search_k = min(k + 1, n)
    with torch.no_grad(), full_fp32_matmul():
        ref = torch.from_numpy(references).to(device)
        ref_labels = torch.from_numpy(reference_labels).to(device)
        for start in range(0, m, chunk):
            stop = min(start + chunk, m)
            rows = torch.arange(stop - start, device=device)
            sims = torch.from_numpy(queries[start:stop]).to(device) @ ref.T
            if self_index is not None:
                sims[rows, torch.from_numpy(self_index[start:stop]).to(device)] = -torch.inf
            labels = torch.from_numpy(query_labels[start:stop]).to(device)
            values, indices = torch.topk(sims, search_k, dim=1)
            hits = ref_labels[indices] == labels[:, None]
            ordered, ties = canonical_hits_sorted(values, hits, k)
            for row in np.flatnonzero(ties):
                relevant = (ref_labels == labels[row]).cpu().numpy()
                ordered[row] = exact_row(sims[row].cpu().numpy(), relevant, k)
            hits_out[start:stop] = ordered
            # Rank of the nearest same-class reference: its place in the list if it is there,
            # else the number of different-class references with similarity >= its similarity.
            found = ordered.any(axis=1)
            first = np.where(found, ordered.argmax(axis=1), k)
            need = np.flatnonzero(~found) if first_limit > k else np.empty(0, dtype=np.int64)
            if len(need):
                take = torch.from_numpy(need).to(device)
                rest = sims if len(need) == len(found) else sims.index_select(0, take)
                pos = torch.from_numpy(positives[start:stop][need]).to(device)
                pos_sims = rest.gather(1, pos.clamp(min=0)).masked_fill_(pos < 0, -torch.inf)
                best = pos_sims.max(dim=1).values
                tied_positives = (pos_sims == best[:, None]).sum(dim=1, dtype=torch.int32)
                at_least = (rest >= best[:, None]).sum(dim=1, dtype=torch.int32)
                first[need] = (at_least - tied_positives).cpu().numpy()
            first_out[start:stop] = np.minimum(first, first_limit)
            hits_out[start:stop] = ordered
            if progress:
                progress(stop - start)
    return Ranking(hits_out, first_out, first_limit)
