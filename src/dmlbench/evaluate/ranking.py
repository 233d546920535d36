"""The exact-ranking core every neighbour search shares: :class:`RankingTask`, the :class:`Ranking`
contract, the tie rule, chunking, and the chunked fp32 torch search the other backends fall back on.

Tie rule: among references of exactly equal similarity, those of another class than the query rank
first (:func:`canonical_hits`), so a metric never profits from ties (a collapsed embedding scores 0)
and the result depends on the similarity values only.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass, replace
from typing import Any

import numpy as np

BACKENDS = ("auto", "faiss", "torch", "screened")
CHUNK_BYTES = 1 << 28  # similarity block budget: 256 MB of float32 per chunk


def as_numpy(x: Any) -> np.ndarray:
    """An array, a list or a torch tensor (on any device) as a numpy array."""
    if hasattr(x, "detach"):
        x = x.detach().cpu().numpy()
    return np.asarray(x)


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


def check_backend(backend: str) -> None:
    if backend not in BACKENDS:
        raise ValueError(f"backend must be one of {', '.join(BACKENDS)}; got {backend!r}")


@dataclass(frozen=True, kw_only=True)
class RankingTask:
    """One exact ranking: the ``k`` nearest unit-norm float32 ``references`` of each of the ``queries``,
    and the rank of each query's nearest same-class reference (it needs one) below ``first_limit``
    (the largest Recall@K). ``self_index``: the excluded reference row of each query (self-retrieval);
    ``device``: None = :func:`dmlbench.devices.default_device`; ``chunk_size``: queries per block
    (None: within ``CHUNK_BYTES``); ``progress``: called with the queries each block ranked."""

    queries: np.ndarray
    query_labels: np.ndarray
    references: np.ndarray
    reference_labels: np.ndarray
    k: int
    first_limit: int
    self_index: np.ndarray | None = None
    backend: str = "auto"
    device: str | None = None
    chunk_size: int | None = None
    progress: Callable[[int], None] | None = None

    def __post_init__(self) -> None:
        if not 1 <= self.k <= self.available:
            raise ValueError(f"k must be in [1, {self.available}], got {self.k}")
        if self.first_limit < 1:
            raise ValueError(f"first_limit must be >= 1 (the largest Recall@K), got {self.first_limit}")
        if self.chunk_size is not None and self.chunk_size < 1:
            raise ValueError(f"chunk_size must be >= 1 or None, got {self.chunk_size}")
        check_backend(self.backend)
        if self.device is not None:
            import torch

            try:
                torch.device(self.device)
            except RuntimeError:
                raise ValueError(
                    f"device must be a torch device such as cpu, cuda or cuda:1; got {self.device!r}"
                ) from None

    @property
    def available(self) -> int:
        """How many references each query's list can hold (its own row excluded)."""
        return len(self.references) - (0 if self.self_index is None else 1)

    def subset(self, rows: np.ndarray, **changes: Any) -> RankingTask:
        """The same task for the queries ``rows`` only, without progress reports unless ``changes`` give one."""
        self_index = None if self.self_index is None else self.self_index[rows]
        changes = {"progress": None, **changes}
        return replace(
            self, queries=self.queries[rows], query_labels=self.query_labels[rows], self_index=self_index, **changes
        )

    def positives(self) -> np.ndarray:
        """:func:`positive_index_matrix` as wide as the largest class."""
        r_max = int(np.bincount(np.unique(self.reference_labels, return_inverse=True)[1]).max())
        return positive_index_matrix(self.query_labels, self.reference_labels, self.self_index, r_max)


@dataclass(frozen=True)
class Ranking:
    """Relevance of the ``k`` nearest references of each query, best first (pessimistic ties),
    and the exact 0-based rank of each query's nearest same-class reference when it is
    ``< first_limit`` (else ``first_limit``)."""

    hits: np.ndarray  # bool (m, k)
    first_positive: np.ndarray  # int64 (m,)
    first_limit: int


def first_in_lists(hits: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Whether each ranked list holds a same-class reference, and the rank of the first (the list's
    length where none)."""
    found = np.asarray(hits.any(axis=1))
    return found, np.where(found, hits.argmax(axis=1), hits.shape[1]).astype(np.int64)


def canonical_hits(values: np.ndarray, hits: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
    """Order each row by similarity descending, different-class first among equals; keep ``k``. Returns
    the hits and the rows whose k-th and (k+1)-th values are equal (to be recomputed exactly)."""
    order = np.lexsort((hits, -values), axis=1)
    ordered = np.take_along_axis(hits, order, axis=1)[:, :k]
    if values.shape[1] > k:
        boundary_tie = values[:, k - 1] == values[:, k]
    else:
        boundary_tie = np.zeros(len(values), dtype=bool)
    return ordered, boundary_tie


def canonical_hits_sorted(values: Any, hits: Any, k: int) -> tuple[np.ndarray, np.ndarray]:
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
    start = np.asarray(np.searchsorted(sorted_labels, query_labels, side="left"))
    stop = np.asarray(np.searchsorted(sorted_labels, query_labels, side="right"))
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


def rank_torch(task: RankingTask) -> Ranking:
    """:class:`Ranking` of ``task`` by chunked fp32 products and ``topk`` on ``task.device`` (TF32 off)."""
    import torch

    queries, query_labels, self_index, device = task.queries, task.query_labels, task.self_index, task.device
    m, n, k, first_limit = len(queries), len(task.references), task.k, task.first_limit
    chunk = task.chunk_size or rows_per_chunk(n, CHUNK_BYTES * (4 if str(device).startswith("cuda") else 1))
    positives = task.positives()
    hits_out: np.ndarray = np.empty((m, k), dtype=bool)
    first_out: np.ndarray = np.empty(m, dtype=np.int64)
    search_k = min(k + 1, n)
    with torch.no_grad(), full_fp32_matmul():
        ref = torch.from_numpy(task.references).to(device)
        ref_labels = torch.from_numpy(task.reference_labels).to(device)
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
            found, first = first_in_lists(ordered)
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
            if task.progress:
                task.progress(stop - start)
    return Ranking(hits_out, first_out, first_limit)
