"""Exact nearest-neighbour ranking by cosine similarity, never building an n x n matrix.

Backends (the same results; tested): ``faiss`` (``IndexFlatIP``, on GPUs for k <= 2048, the GPU
k-selection limit), ``torch`` (chunked products + ``topk``, fp32, TF32 off) and ``screened`` (a
certified bf16 screen on the CPU, :mod:`dmlbench.evaluate.screen`). Ties are broken
*pessimistically* (other-class references first among equals, :mod:`dmlbench.evaluate.ranking`);
in self-retrieval each query's own row is excluded. docs/evaluation.md says more."""

from __future__ import annotations

import importlib.metadata
import re
from dataclasses import replace
from typing import Any

import numpy as np

from dmlbench.devices import default_device
from dmlbench.evaluate import screen, symmetric
from dmlbench.evaluate.ranking import (
    Ranking,
    RankingTask,
    canonical_hits,
    check_backend,
    exact_row,
    first_in_lists,
    normalize_rows,
    rank_torch,
    rows_per_chunk,
)
from dmlbench.evaluate.screen import fast_bf16_matmul

FAISS_GPU_MAX_K = 2048


def faiss_available() -> bool:
    try:
        import faiss  # noqa: F401
    except ImportError:
        return False
    return True


def faiss_cuda_major() -> int | None:
    """The CUDA major release the installed faiss GPU wheel was built for, from its package metadata:
    ``faiss-gpu-cu12`` / ``faiss-gpu-cu11`` by name, ``faiss-gpu`` (1.14.3+, a CUDA 12 wheel) by its
    ``nvidia-cuda-runtime-cu12`` requirement; None when no such wheel is installed or it names no CUDA
    (e.g. a conda build)."""
    for name in ("faiss-gpu", "faiss-gpu-cu12", "faiss-gpu-cu11"):
        try:
            requires = importlib.metadata.requires(name) or []
        except importlib.metadata.PackageNotFoundError:
            continue
        found = re.findall(r"-cu(\d+)\b", " ".join([name, *requires]))
        return int(found[0]) if found else None
    return None


def faiss_gpu_usable(faiss_gpu_count: int, faiss_cuda: int | None, torch_cuda: str | None) -> int:
    """The GPUs faiss may use: its own count, but only when its CUDA major is torch's (another major
    brings a second CUDA runtime, memory pool and minimum driver; torch ranks the same, only slower)."""
    if faiss_gpu_count <= 0 or faiss_cuda is None or not torch_cuda:
        return 0
    return faiss_gpu_count if faiss_cuda == int(torch_cuda.split(".")[0]) else 0


def faiss_gpus() -> int:
    """Number of GPUs faiss can use here: 0 for faiss-cpu, without faiss, or when faiss's CUDA
    major is not torch's (:func:`faiss_gpu_usable`)."""
    if not faiss_available():
        return 0
    import faiss
    import torch

    count = int(faiss.get_num_gpus()) if hasattr(faiss, "get_num_gpus") else 0
    return faiss_gpu_usable(count, faiss_cuda_major() if count else None, torch.version.cuda)


def resolve_backend(backend: str = "auto", device: str | None = None) -> tuple[str, str]:
    """``(backend, torch device)`` to use: ``auto`` as docs/evaluation.md says (faiss on the CPU is
    measured faster than fp32 torch at SOP scale); ``screened`` asked for on CUDA runs ``torch``."""
    check_backend(backend)
    device = str(default_device(device))
    if backend == "auto":
        on_cuda = str(device).startswith("cuda")
        if faiss_gpus() > 0 or (not on_cuda and not fast_bf16_matmul()):
            backend = "faiss" if faiss_available() else "torch"
        else:
            backend = "torch" if on_cuda else "screened"
    if backend == "screened" and str(device).startswith("cuda"):
        backend = "torch"
    if backend == "faiss" and not faiss_available():
        raise ValueError("backend 'faiss' needs the faiss package (pip install faiss-cpu or faiss-gpu)")
    return backend, device


def ranking_schedule(backend: str, device: str | None, self_retrieval: bool, n_references: int) -> tuple[str, str, str]:
    """``(backend, device, schedule)``: :func:`resolve_backend`'s pair, and ``symmetric bf16`` / ``fp32``
    (:mod:`dmlbench.evaluate.symmetric`: self-retrieval on the CPU, from ``symmetric.MIN_REFERENCES``
    references) or ``rows`` (each query's row of similarities)."""
    requested = backend
    backend, device = resolve_backend(backend, device)
    half = backend in ("screened", "torch") or (requested == "auto" and backend == "faiss" and faiss_gpus() == 0)
    if self_retrieval and device == "cpu" and half and n_references >= symmetric.MIN_REFERENCES:
        return backend, device, "symmetric bf16" if backend == "screened" else "symmetric fp32"
    return backend, device, "rows"


def rank_neighbours(task: RankingTask) -> Ranking:
    """Exact neighbour relevance of ``task``'s queries against its references
    (:class:`~dmlbench.evaluate.ranking.RankingTask`) on the backend and schedule
    :func:`ranking_schedule` picks; first ranks are exact below ``min(first_limit, references)``."""
    backend, device, schedule = ranking_schedule(
        task.backend, task.device, task.self_index is not None, len(task.references)
    )
    task = replace(task, backend=backend, device=device, first_limit=min(task.first_limit, task.available))
    if schedule != "rows":
        # self-retrieval on the CPU from half the products; the rows it leaves go row by row
        ranking = symmetric.rank_symmetric(task, schedule == "symmetric bf16", _rank_rows)
        if ranking is not None:
            return ranking
    return _rank_rows(task)


def _rank_rows(task: RankingTask) -> Ranking:
    """Each query's row of similarities, on the resolved ``task.backend``."""
    if task.backend == "screened":
        return screen.rank_screened(task)  # looked up at call time (tests spy on it)
    if task.backend == "torch":
        return rank_torch(task)
    return _rank_faiss(task)


def _faiss_index(references: np.ndarray, k: int) -> Any:
    import faiss

    index: Any = faiss.IndexFlatIP(references.shape[1])
    if faiss_gpus() > 0 and k <= FAISS_GPU_MAX_K:
        index = faiss.index_cpu_to_all_gpus(index)
    index.add(references)
    return index


def _rank_faiss(task: RankingTask) -> Ranking:
    """Two searches: the R-long list of every query, then, only for queries without a
    same-class reference in it, the list up to the largest Recall@K (k-selection over a long
    list is what costs most in a flat search)."""
    k, first_limit = task.k, task.first_limit
    index = _faiss_index(task.references, min(max(k, first_limit) + 2, len(task.references)))
    hits = _faiss_lists(index, task, k)
    found, first = first_in_lists(hits)
    need = np.flatnonzero(~found)
    if first_limit > k and len(need):
        first[need] = first_in_lists(_faiss_lists(index, task.subset(need), first_limit))[1]
    return Ranking(hits, np.minimum(first, first_limit), first_limit)


def _faiss_lists(index: Any, task: RankingTask, length: int) -> np.ndarray:
    """Relevance of the ``length`` nearest references of each query, pessimistic ties."""
    queries, references, self_index = task.queries, task.references, task.self_index
    m = len(queries)
    search_k = min(length + 1 + (self_index is not None), len(references))  # +1: ties at the list's end; +1: self
    chunk = task.chunk_size or max(1, min(8192, (1 << 27) // (12 * search_k)))
    out: np.ndarray = np.empty((m, length), dtype=bool)
    for start in range(0, m, chunk):
        stop = min(start + chunk, m)
        values, indices = index.search(queries[start:stop], search_k)
        if self_index is not None:
            indices, values = _without_self(self_index[start:stop], indices, values)
        hits = task.reference_labels[indices] == task.query_labels[start:stop, None]
        ordered, ties = canonical_hits(values, hits, length)
        for row in np.flatnonzero(ties):
            sims = references @ queries[start + row]
            if self_index is not None:
                sims[self_index[start + row]] = -np.inf
            ordered[row] = exact_row(sims, task.reference_labels == task.query_labels[start + row], length)
        out[start:stop] = ordered
        if task.progress:
            task.progress(stop - start)
    return out


def _without_self(self_index: np.ndarray, indices: np.ndarray, *aligned: np.ndarray) -> tuple[np.ndarray, ...]:
    """Search results (``indices`` and arrays ``aligned`` with them) without each query's own
    column, or without the last where its own is not among them: one column fewer."""
    is_self = indices == self_index[:, None]
    is_self[~is_self.any(axis=1), -1] = True
    return tuple(a[~is_self].reshape(len(a), a.shape[1] - 1) for a in (indices, *aligned))


def knn(
    query: np.ndarray,
    reference: np.ndarray,
    k: int,
    exclude_self: bool = False,
    backend: str = "auto",
) -> np.ndarray:
    """Indices (``n_query x k``) of the ``k`` most cosine-similar reference rows, best first (ties in the
    backend's order); ``exclude_self``: ``reference`` is ``query`` and row ``i``'s own index is dropped."""
    query, reference = normalize_rows(query), normalize_rows(reference)
    available = len(reference) - (1 if exclude_self else 0)
    if not 0 < k <= available:
        raise ValueError(f"k must be in [1, {available}], got {k}")
    backend, device = resolve_backend(backend, "cpu")
    search_k = k + 1 if exclude_self else k
    if backend == "faiss":
        _, indices = _faiss_index(reference, search_k).search(query, search_k)
    else:
        import torch

        ref = torch.from_numpy(reference)
        indices = np.empty((len(query), search_k), dtype=np.int64)
        chunk = rows_per_chunk(len(reference))
        for start in range(0, len(query), chunk):
            sims = torch.from_numpy(query[start : start + chunk]) @ ref.T
            indices[start : start + chunk] = torch.topk(sims, search_k, dim=1).indices.numpy()
    indices = indices.astype(np.int64)
    return _without_self(np.arange(len(query)), indices)[0] if exclude_self else indices
