"""Self-retrieval ranking from half the products: the similarity of rows i and j is computed once
and serves both rows (docs/evaluation.md, "Self-retrieval from half the products").

Block [a, b) is multiplied with rows [a, n) only. Row i keeps the pairs at or above ``t_i``, the
k-th largest similarity to every ``SAMPLE_STRIDE``-th reference (a lower bound of its true k-th),
lowered by 2 gamma (fp32) or through the screening bound (bf16, as in
:mod:`dmlbench.evaluate.screen`). Rows without a certificate, or needing the first hit's rank beyond
the list, are ranked row by row; massive ties make :func:`rank_symmetric` return None."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from dmlbench.evaluate.ranking import Ranking, RankingTask, first_in_lists
from dmlbench.evaluate.screen import SCREEN_MARGIN, ScreenError, accumulation_error, dots

SAMPLE_STRIDE = 16  # every 16th reference sets the thresholds: ~16 k candidates per row, 1/16 more product
ROW_BLOCK = 512  # rows per block product (its [a, n) wide output is a reused buffer: 2 KiB per reference, fp32)
SAMPLE_BLOCK = 4096  # rows per sample product
MIN_REFERENCES = 2048  # below this the row-by-row search is cheap and kept
CANDIDATE_BUDGET = 1 << 25  # candidate pairs held at once (12-20 bytes each) before giving up


class _Products:
    """Block products in one arithmetic, as numpy arrays whose order is the similarities' order:
    fp32 values (numpy's BLAS), or bf16 products (torch) as order-preserving int16 keys."""

    def __init__(self, embeddings: np.ndarray, bf16: bool):
        import torch

        self.bf16 = bf16
        self.x = torch.from_numpy(embeddings)
        self.embeddings = embeddings
        if bf16:
            self.x16 = self.x.to(torch.bfloat16)
            # every finite bf16 number, ascending, with its key (:meth:`keys`)
            bits: np.ndarray = np.arange(-(2**15), 2**15, dtype=np.int32).astype(np.int16)
            values = (bits.astype(np.int32) << 16).view(np.float32)
            numbers = ~np.isnan(values)
            order = np.argsort(values[numbers], kind="stable")
            self.table_values = values[numbers][order]
            self.table_keys = self.keys(bits[numbers][order])

    @staticmethod
    def keys(bits: np.ndarray) -> np.ndarray:
        """int16 keys of bf16 bit patterns that order as the numbers do (-0 and +0 equal)."""
        return np.where(bits < 0, -(bits & np.int16(0x7FFF)), bits).astype(np.int16)

    def block(self, a: int, b: int, buffer: Any) -> np.ndarray:
        """Products of rows [a, b) with rows [a, n), self set to -inf, in the comparable form
        (raw bf16 bits: :meth:`comparable` turns them into keys only when a threshold needs it)."""
        n = len(self.embeddings)
        width = n - a
        if self.bf16:
            import torch

            out = buffer[: (b - a) * width].view(b - a, width)
            torch.matmul(self.x16[a:b], self.x16[a:].T, out=out)
            products = out.view(torch.int16).numpy()
            products[np.arange(b - a), np.arange(b - a)] = np.int16(-128)  # bits of -inf
            return products
        products = np.matmul(
            self.embeddings[a:b], self.embeddings[a:].T, out=buffer[: (b - a) * width].reshape(b - a, width)
        )
        products[np.arange(b - a), np.arange(b - a)] = -np.inf
        return products

    def thresholds(self, values: np.ndarray) -> np.ndarray:
        """Per-row thresholds in the comparable form: product >= threshold <=> similarity value
        >= ``values`` (float32 values, or the key of the smallest bf16 number >= the value)."""
        if not self.bf16:
            return values
        at = np.searchsorted(self.table_values, values, side="left")
        return self.table_keys[np.minimum(at, len(self.table_keys) - 1)]

    def comparable(self, products: np.ndarray, thresholds: np.ndarray) -> np.ndarray:
        """``products`` as keys where some threshold admits zero or negative bf16 numbers (there the
        raw int16 bits order backwards), else as they are."""
        if self.bf16 and thresholds.min() < 1:
            return self.keys(products)
        return products

    def values(self, products: np.ndarray, index: np.ndarray) -> np.ndarray:
        """float32 similarities (fp32) or bf16 values of the flat positions ``index``."""
        picked = products.reshape(-1)[index]
        if self.bf16:
            return (picked.astype(np.int32) << 16).view(np.float32)
        return picked


def rank_symmetric(task: RankingTask, bf16: bool, rank_rows: Callable[[RankingTask], Ranking]) -> Ranking | None:
    """The :class:`Ranking` of a self-retrieval ``task`` from products in fp32 or (``bf16``) certified
    bf16 (``task.chunk_size``: rows per block product); ``rank_rows(subtask)`` ranks the rows it cannot
    settle, in the same arithmetic. None when the candidates would pass ``CANDIDATE_BUDGET``."""
    import torch

    embeddings, labels, rows, k = task.references, task.reference_labels, task.self_index, task.k
    assert rows is not None, "symmetric ranking is self-retrieval"
    n, dim = embeddings.shape
    block = task.chunk_size or ROW_BLOCK
    arithmetic = _Products(embeddings, bf16)
    gamma = accumulation_error(dim) * (1 + 1e-6) ** 2  # fp32 dot of rows with norm <= 1 + 1e-6
    if bf16:
        bound = ScreenError(arithmetic.x, arithmetic.x16)
        base = bound.base_from_norms(*bound.reference_norms)
    else:
        base = np.zeros(n)
    wanted = np.zeros(n, dtype=bool)
    wanted[rows] = True
    hits_all = np.zeros((n, k), dtype=bool)
    certain = np.ones(n, dtype=bool)
    pending: dict[int, list[tuple[np.ndarray, np.ndarray, np.ndarray]]] = {}
    held = 0
    with torch.no_grad():
        thresholds = arithmetic.thresholds(_row_thresholds(arithmetic, k, base, gamma))
        buffer = torch.empty(block * n, dtype=torch.bfloat16) if bf16 else np.empty(block * n, dtype=np.float32)
        for a in range(0, n, block):
            b = min(a + block, n)
            width = n - a
            raw = arithmetic.block(a, b, buffer)
            own = np.flatnonzero(arithmetic.comparable(raw, thresholds[a:b]) >= thresholds[a:b, None])
            parts = [(own // width + a, own % width + a, arithmetic.values(raw, own))]
            if b < n:  # the later rows' pairs with this block, kept for their own block
                later_thresholds = thresholds[b:]
                later = np.flatnonzero(arithmetic.comparable(raw[:, b - a :], later_thresholds) >= later_thresholds)
                source: np.ndarray = later // (n - b) + a
                target: np.ndarray = later % (n - b) + b
                keep = wanted[target]
                source, target = source[keep], target[keep]
                values = arithmetic.values(raw, (source - a) * width + (target - a))
                destination: np.ndarray = target // block  # the block each pair waits for
                order = np.argsort(
                    destination.astype(np.int16 if n // block < 2**15 else np.int64), kind="stable"
                )  # radix
                target, source, values = target[order], source[order], values[order]
                cuts: np.ndarray = np.asarray(
                    np.searchsorted(destination[order], np.arange(b // block, (n - 1) // block + 2))
                )
                for i, (s, e) in enumerate(zip(cuts[:-1], cuts[1:], strict=True)):
                    if e > s:
                        pending.setdefault(b // block + i, []).append((target[s:e], source[s:e], values[s:e]))
                held += len(target)
            waiting = pending.pop(a // block, [])
            held -= sum(len(p[0]) for p in waiting)
            if held + len(own) > CANDIDATE_BUDGET:
                return None
            query, reference, value = (np.concatenate(p) for p in zip(*parts, *waiting, strict=True))
            keep = wanted[query]
            query, reference, value = query[keep], reference[keep], value[keep]
            if bf16:
                ok = _rank_block_bf16(arithmetic.x, labels, query, reference, value, a, b, k, base, gamma, hits_all)
            else:
                ok = _rank_block_fp32(labels, query, reference, value, a, b, k, hits_all)
            certain[a:b] = ok
            if task.progress:
                task.progress(int(wanted[a:b].sum()))
    hits = hits_all[rows]
    found, first = first_in_lists(hits)
    redo = np.flatnonzero(~certain[rows] | (~found & (task.first_limit > k)))
    if len(redo):
        again = rank_rows(task.subset(redo))
        hits[redo] = again.hits
        first[redo] = again.first_positive
    return Ranking(hits, np.minimum(first, task.first_limit), task.first_limit)


def _row_thresholds(arithmetic: _Products, k: int, base: np.ndarray, gamma: float) -> np.ndarray:
    """Per row, a float32 value such that every pair of the row whose similarity (fp32: its block
    product; bf16: its fp32 re-scoring) may reach the row's k-th largest has a block product >= it.

    t = k-th largest sampled similarity (fp32), or the largest exact similarity its bf16 value
    guarantees (bf16); the k-th largest over all is >= t, so a qualifying pair has, in fp32, a
    block product >= t - 2 gamma; with bf16 an exact similarity >= t - 2 gamma (fp32 re-scoring
    off by gamma on both sides), hence a bf16 value >= ``ScreenError.approx_below`` of that.
    """
    import torch

    n = len(arithmetic.embeddings)
    stride = max(1, min(SAMPLE_STRIDE, (n - 1) // (k + 1)))
    sample = np.arange(0, n, stride)
    kth = np.empty(n)
    for a in range(0, n, SAMPLE_BLOCK):
        b = min(a + SAMPLE_BLOCK, n)
        if arithmetic.bf16:
            products = (arithmetic.x16[a:b] @ arithmetic.x16[torch.from_numpy(sample)].T).float().numpy()
        else:
            products = arithmetic.embeddings[a:b] @ arithmetic.embeddings[sample].T
        own = np.arange(a, b)
        on_sample = own % stride == 0
        products[np.flatnonzero(on_sample), own[on_sample] // stride] = -np.inf
        kth[a:b] = np.partition(products, products.shape[1] - k, axis=1)[:, products.shape[1] - k]
    if arithmetic.bf16:
        exact_floor = kth - (ScreenError.upper(kth, base) - kth)  # s~ - c|s~| - base <= exact
        threshold = ScreenError.approx_below(exact_floor - 2 * gamma, base)
    else:
        threshold = kth - 2 * gamma
    low: np.ndarray = np.asarray(threshold).astype(np.float32)
    return np.where(low.astype(np.float64) > threshold, np.nextafter(low, np.float32(-np.inf)), low)


def _row_slices(query: np.ndarray, a: int, b: int, width: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Grouping of sorted pairs by row: (row of each of ``width`` slots per row in [a, b), the
    slot's position in the sorted pairs, whether the slot holds a pair, each row's pair count)."""
    counts = np.bincount(query - a, minlength=b - a)
    starts = np.concatenate([[0], np.cumsum(counts)[:-1]])
    slots = np.arange(width)
    filled = slots[None, :] < counts[:, None]
    position = np.minimum(starts[:, None] + slots[None, :], max(len(query) - 1, 0))
    return position, filled, counts


def _row_order(query: np.ndarray, a: int, value: np.ndarray, tie: np.ndarray | None = None) -> np.ndarray:
    """Order of pairs by row, then value descending, then ``tie`` (False first): one argsort of a
    composite int64 key (a lexsort of three keys costs several times more)."""
    bits = (value.astype(np.float32) + np.float32(0)).view(np.int32)  # + 0: -0 becomes +0, equal values equal bits
    ascending = np.where(bits < 0, bits ^ np.int32(0x7FFFFFFF), bits).astype(np.int64)  # order of the values
    key = ((query.astype(np.int64) - a) << 34) | ((2**31 - 1 - ascending) << 1)
    if tie is not None:
        key |= tie
    return np.argsort(key)


def _rank_block_fp32(
    labels: np.ndarray,
    query: np.ndarray,
    reference: np.ndarray,
    value: np.ndarray,
    a: int,
    b: int,
    k: int,
    hits_all: np.ndarray,
) -> np.ndarray:
    """Rank the pairs of rows [a, b) (fp32 similarities) with the tie rule; False for rows with
    fewer than k candidates (only possible through rounding beyond the bound)."""
    hit = labels[query] == labels[reference]
    order = _row_order(query, a, value, hit)
    query, hit = query[order], hit[order]
    position, filled, counts = _row_slices(query, a, b, k)
    if len(query):
        hits_all[a:b] = hit[position] & filled
    return counts >= k


def _rank_block_bf16(
    x: Any,
    labels: np.ndarray,
    query: np.ndarray,
    reference: np.ndarray,
    value: np.ndarray,
    a: int,
    b: int,
    k: int,
    base: np.ndarray,
    gamma: float,
    hits_all: np.ndarray,
) -> np.ndarray:
    """Re-score the ``k + SCREEN_MARGIN`` best bf16 candidates of each row of [a, b) in fp32, rank
    them with the tie rule, and certify the list (module docstring); False where not certified."""
    import torch

    length = k + SCREEN_MARGIN
    order = _row_order(query, a, value)
    query, reference, value = query[order], reference[order], value[order]
    position, filled, counts = _row_slices(query, a, b, length + 1)
    if len(query) == 0:
        return counts < 0
    candidates = np.where(filled[:, :length], reference[position[:, :length]], 0)
    exact = dots(x[a:b], x, torch.from_numpy(candidates)).numpy()
    exact[~filled[:, :length]] = -np.inf
    hit = (labels[candidates] == labels[a:b, None]) & filled[:, :length]
    ranked = np.lexsort((hit, -exact), axis=1)[:, :k]
    hits_all[a:b] = np.take_along_axis(hit, ranked, axis=1)
    kth = np.take_along_axis(exact, ranked[:, -1:], axis=1)[:, 0].astype(np.float64)
    left_out = value[position[:, length]].astype(np.float64)  # the best candidate not re-scored
    beaten = kth - gamma > ScreenError.upper(left_out, base[a:b])
    return (counts >= k) & ((counts <= length) | beaten)
