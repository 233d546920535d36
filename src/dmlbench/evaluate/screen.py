"""Exact ranking at bf16 speed: a bf16 product screens the candidates, fp32 decides
(docs/evaluation.md, "Exact search, never n x n").

For rows of L2 norm <= 1 in d dimensions, with u = 2^-8 (bf16 unit roundoff) and
g = 2d 2^-24 / (1 - 2d 2^-24) (fp32 accumulation), the bf16 product is off by at most

    eps(d) = (2u + u^2) + g (1+u)^2 + 2u (1+u)^2 (1+g)

(input rounding + accumulation + result rounding, counted as 2u for any rounding mode): 0.0158
for d = 512. The k + ``SCREEN_MARGIN`` best bf16 candidates are re-scored in fp32; the list is
exact when its k-th fp32 similarity beats the last candidate's bf16 similarity + eps, else the
query is ranked again in fp32. The first hit's rank counts other-class references from their bf16
values, recomputing in fp32 only those within eps of the best positive. Over 400 lines: the
ranking and the k-means assignment share one certified screen.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from dmlbench.evaluate.ranking import CHUNK_BYTES, Ranking, RankingTask, first_in_lists, rank_torch

SCREEN_MARGIN = 24  # candidates kept beyond the list length k
SCREEN_BLOCK = 256  # queries per bf16 product: its n-wide output stays in cache (measured fastest)
DOT_BLOCK = 64  # queries per gather-and-dot block (the gathered rows stay in cache)
CENTROID_BLOCK = 1024  # points per bf16 product in the k-means assignment (measured fastest)
CENTROID_CANDIDATES = 16  # second look at a k-means assignment the top-2 screen did not settle
BAND_PAIRS = 1 << 18  # (query, reference) pairs recomputed in fp32 at a time
UNIT_ROUNDOFF = 2.0**-8  # bf16: 8 significant bits, round to nearest
RESULT_ROUNDING = 2 * UNIT_ROUNDOFF / (1 - 2 * UNIT_ROUNDOFF)  # |bf16 result - fp32 sum| <= this x |bf16 result|


def accumulation_error(dim: int) -> float:
    """gamma_2d = 2d u32 / (1 - 2d u32): relative bound of an fp32 sum of d (paired) products."""
    return 2 * dim * 2.0**-24 / (1 - 2 * dim * 2.0**-24)


def bf16_screen_error(dim: int) -> float:
    """Worst-case |bf16 similarity - exact similarity| for rows of norm <= 1 (module docstring)."""
    u, g = UNIT_ROUNDOFF, accumulation_error(dim)
    norm = 1 + 1e-6  # rows normalised in fp32 may exceed 1 by a few ulps
    return ((2 * u + u * u) + g * (1 + u) ** 2 + 2 * u * (1 + u) ** 2 * (1 + g)) * norm**2


class ScreenError:
    """Per-query error bound of the bf16 similarity, tighter than :func:`bf16_screen_error`:

        |s~ - s| <= base_q + c |s~|,   base_q = |x~_q - x_q| N~ + |x_q| E + g |x~_q| N~,

    from x~.y~ - x.y = (x~ - x).y~ + x.(y~ - y) (Cauchy-Schwarz), the fp32 accumulation
    (g = :func:`accumulation_error`) and the rounding of the result (c = ``RESULT_ROUNDING``);
    E, N~: the largest |y~ - y| and |y~| over the references. Norms in float64.
    """

    def __init__(self, references: Any, references16: Any) -> None:
        self.dim = references.shape[1]
        self.reference_norms = _norms(references, references16)
        err, norm16, _ = self.reference_norms
        self.ref_error, self.ref_norm16 = float(err.max()), float(norm16.max())

    def base(self, queries: Any, queries16: Any) -> np.ndarray:
        return self.base_from_norms(*_norms(queries, queries16))

    def base_from_norms(self, err: np.ndarray, norm16: np.ndarray, norm: np.ndarray) -> np.ndarray:
        """:meth:`base` from the queries' |x~ - x|, |x~| and |x| (:func:`_norms`)."""
        g = accumulation_error(self.dim)
        base = err * self.ref_norm16 + norm * self.ref_error + g * norm16 * self.ref_norm16
        return base * (1 + 1e-6) + 1e-30  # slack for the float64 norms and flushed denormals

    @staticmethod
    def upper(approx: np.ndarray, base: np.ndarray) -> np.ndarray:
        """Largest exact similarity a bf16 value ``approx`` can stand for."""
        return approx + RESULT_ROUNDING * np.abs(approx) + base

    @staticmethod
    def approx_at_least(exact: np.ndarray, base: np.ndarray) -> np.ndarray:
        """Smallest bf16 value that guarantees an exact similarity >= ``exact``: s~ - c|s~| - base >= exact."""
        v = exact + base
        return np.where(v >= 0, v / (1 - RESULT_ROUNDING), v / (1 + RESULT_ROUNDING))

    @staticmethod
    def approx_below(exact: np.ndarray, base: np.ndarray) -> np.ndarray:
        """bf16 values below this guarantee an exact similarity < ``exact``: s~ + c|s~| + base < exact."""
        v = exact - base
        return np.where(v >= 0, v / (1 + RESULT_ROUNDING), v / (1 - RESULT_ROUNDING))


def _norms(x: Any, x16: Any, block: int = 4096) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """|x~ - x|, |x~| and |x| of each row, summed in float64 (x~ - x is exact in float32)."""
    import torch

    out = np.empty((3, len(x)))
    difference = torch.empty(min(block, len(x)), x.shape[1], dtype=torch.float32)
    for s in range(0, len(x), block):
        rows, rows16 = x[s : s + block], x16[s : s + block]
        diff = difference[: len(rows)].copy_(rows16).sub_(rows)
        for i, v in enumerate((diff, rows16, rows)):
            out[i, s : s + block] = torch.linalg.vector_norm(v, dim=1, dtype=torch.float64).numpy()
    return out[0], out[1], out[2]


def fast_bf16_matmul() -> bool:
    """True when this CPU has native bf16 dot products (AVX512-BF16 or AMX tiles); ``DMLBENCH_CPU_BF16=1``
    / ``0`` forces the answer (and so the CPU path of ``auto``), e.g. for tests in a subprocess."""
    import os

    import torch

    forced = os.environ.get("DMLBENCH_CPU_BF16", "").strip()
    if forced:
        if forced not in ("0", "1"):
            raise ValueError(f"DMLBENCH_CPU_BF16 must be 0 or 1, got {forced!r}")
        return forced == "1"
    cpu = torch.cpu
    return any(
        bool(getattr(cpu, name, lambda: False)()) for name in ("_is_avx512_bf16_supported", "_is_amx_tile_supported")
    )


def rank_screened(task: RankingTask) -> Ranking:
    """:class:`Ranking` of ``task`` on the CPU, by the certified bf16 screen (module docstring):
    the same result as :func:`~dmlbench.evaluate.ranking.rank_torch`."""
    import torch

    queries, query_labels, references, self_index = task.queries, task.query_labels, task.references, task.self_index
    m, n, k, first_limit = len(queries), len(references), task.k, task.first_limit
    length = min(k + SCREEN_MARGIN, task.available)
    block = min(task.chunk_size or _rows_within_budget(SCREEN_BLOCK, n), m)
    positives = task.positives()
    hits_out: np.ndarray = np.empty((m, k), dtype=bool)
    first_out: np.ndarray = np.empty(m, dtype=np.int64)
    uncertain: list[np.ndarray] = []
    with torch.no_grad():
        ref = torch.from_numpy(references)
        ref16 = ref.to(torch.bfloat16)
        bound = ScreenError(ref, ref16)
        query_rows = torch.from_numpy(queries)
        if self_index is not None:  # the queries are reference rows: reuse their bf16 copy and norms
            queries16 = ref16[torch.from_numpy(self_index)]
            bases = bound.base_from_norms(*(v[self_index] for v in bound.reference_norms))
        else:
            queries16 = query_rows.to(torch.bfloat16)
            bases = bound.base(query_rows, queries16)
        # reused outputs: a fresh n-wide block per product costs page faults, not just the product
        screen_buffer = torch.empty(block, n, dtype=torch.bfloat16)
        approx_buffer = torch.empty(block, length, dtype=torch.bfloat16)
        candidate_buffer = torch.empty(block, length, dtype=torch.int64)
        for start in range(0, m, block):
            stop = min(start + block, m)
            rows = stop - start
            q, base = query_rows[start:stop], bases[start:stop]
            screen = torch.matmul(queries16[start:stop], ref16.T, out=screen_buffer[:rows])
            if self_index is not None:
                screen[torch.arange(rows), torch.from_numpy(self_index[start:stop])] = -torch.inf
            approx, candidates = torch.topk(screen, length, dim=1, out=(approx_buffer[:rows], candidate_buffer[:rows]))
            exact = dots(q, ref, candidates).numpy()
            candidates = candidates.numpy()
            hits = task.reference_labels[candidates] == query_labels[start:stop, None]
            order = np.lexsort((hits, -exact), axis=1)
            hits = np.take_along_axis(hits, order, axis=1)[:, :k]
            kth = np.take_along_axis(exact, order[:, k - 1 : k], axis=1)[:, 0]
            if length < task.available:
                certain = kth > bound.upper(approx[:, -1].float().numpy().astype(np.float64), base)
            else:
                certain = np.ones(len(kth), dtype=bool)
            uncertain.append(start + np.flatnonzero(~certain))
            found, first = first_in_lists(hits)
            need = np.flatnonzero(certain & ~found) if first_limit > k else np.empty(0, dtype=np.int64)
            if len(need):
                first[need] = _first_positive_ranks(
                    screen, need, q[torch.from_numpy(need)], ref, positives[start:stop][need], base[need], first_limit
                )
            hits_out[start:stop] = hits
            first_out[start:stop] = np.minimum(first, first_limit)
            if task.progress:
                task.progress(rows)
    redo = np.concatenate(uncertain)
    if len(redo):  # no certificate: the exact fp32 ranking for these queries
        exact_ranking = rank_torch(task.subset(redo, device="cpu", chunk_size=None))
        hits_out[redo] = exact_ranking.hits
        first_out[redo] = exact_ranking.first_positive
    return Ranking(hits_out, first_out, first_limit)


def _rows_within_budget(rows: int, width: int) -> int:
    """``rows``, fewer when a bf16 block of ``rows`` x ``width`` would pass ``CHUNK_BYTES``."""
    return max(1, min(rows, CHUNK_BYTES // (2 * width)))


def _first_positive_ranks(
    screen: Any, screen_rows: np.ndarray, q: Any, ref: Any, positives: np.ndarray, base: np.ndarray, limit: int
) -> np.ndarray:
    """Number of other-class references with fp32 similarity >= the best positive's (the 0-based
    rank of the first positive, pessimistic ties), capped at ``limit``, for the queries ``q``;
    their bf16 similarities are the rows ``screen_rows`` of ``screen`` (self already -inf; the
    positives are set to -inf here); ``positives``: -1-padded indices."""
    import torch

    pos = torch.from_numpy(positives)
    valid = pos >= 0
    best = dots(q, ref, pos.clamp(min=0)).masked_fill_(~valid, -torch.inf).max(dim=1).values
    rows, cols = torch.nonzero(valid, as_tuple=True)
    screen[torch.from_numpy(screen_rows)[rows], pos[rows, cols]] = -torch.inf  # count other classes only
    best64 = best.numpy().astype(np.float64)
    high = ScreenError.approx_at_least(best64, base)  # at or above: surely ahead
    low = ScreenError.approx_below(best64, base)  # below: surely not ahead
    ahead: np.ndarray = np.empty(len(best64), dtype=np.int64)
    band_rows: list[np.ndarray] = [np.empty(0, np.int64)]  # no row may be left in a band
    band_cols: list[np.ndarray] = [np.empty(0, np.int64)]
    fast = low > 0  # positive thresholds: compare the raw bf16 bits (monotone for values >= 0)
    if fast.any():
        rows_fast = np.flatnonzero(fast)
        bits = screen.view(torch.int16).numpy()
        high16, low16 = _bf16_bits_at_least(high[fast]), _bf16_bits_at_least(low[fast])
        widths = (high16 - low16).view(np.uint16)
        for j, row in enumerate(rows_fast):  # row by row: 1-D counts are the fast ones in numpy
            line = bits[screen_rows[row]]
            ahead[row] = np.count_nonzero(line >= high16[j])
            if ahead[row] >= limit:
                continue  # already past the limit: the band cannot matter
            # low16 <= b < high16, as one unsigned comparison of b - low16
            band = np.flatnonzero((line - low16[j]).view(np.uint16) < widths[j])
            band_rows.append(np.full(len(band), row))
            band_cols.append(band)
    for row in np.flatnonzero(~fast):  # rare: thresholds at or below 0
        sims = screen[screen_rows[row]].float().numpy()
        ahead[row] = np.count_nonzero(sims >= high[row])
        c = np.flatnonzero((sims >= low[row]) & (sims < high[row]))
        band_rows.append(np.full(len(c), row))
        band_cols.append(c)
    band_rows_all = np.concatenate(band_rows)
    band_cols_all = np.concatenate(band_cols)
    open_rows = ahead[band_rows_all] < limit  # rows already past the limit need no more
    band_rows_all, band_cols_all = band_rows_all[open_rows], band_cols_all[open_rows]
    for s in range(0, len(band_rows_all), BAND_PAIRS):
        r = torch.from_numpy(band_rows_all[s : s + BAND_PAIRS])
        c = torch.from_numpy(band_cols_all[s : s + BAND_PAIRS])
        at_least = (dots(q[r], ref, c[:, None])[:, 0] >= best[r]).numpy()
        ahead += np.bincount(r.numpy()[at_least], minlength=len(ahead))
    return np.minimum(ahead, limit)


def _bf16_bits_at_least(values: np.ndarray) -> np.ndarray:
    """int16 bits of the smallest bf16 number >= each (positive) value."""
    f32: np.ndarray = values.astype(np.float32)
    f32 = np.where(f32.astype(np.float64) < values, np.nextafter(f32, np.float32(np.inf)), f32)
    bits = (f32.view(np.int32) >> 16).astype(np.int16)  # truncation: <= the value for positives
    truncated = (bits.astype(np.int32) << 16).view(np.float32)
    return np.where(truncated < f32, bits + np.int16(1), bits).astype(np.int16)


def dots(q: Any, ref: Any, index: Any) -> Any:
    """fp32 similarity of each query row with the references ``index[row]``, in blocks of
    ``DOT_BLOCK`` queries (one summation order for every pair, so identical references get
    identical similarities); the gathered rows go to one reused buffer."""
    import torch

    out = torch.empty(index.shape, dtype=torch.float32)
    if out.numel() == 0:
        return out
    width = index.shape[1]
    gathered = torch.empty(min(DOT_BLOCK, len(index)) * width, ref.shape[1], dtype=torch.float32)
    for s in range(0, len(index), DOT_BLOCK):
        e = min(s + DOT_BLOCK, len(index))
        rows = torch.index_select(ref, 0, index[s:e].reshape(-1), out=gathered[: (e - s) * width])
        rows = rows.view(e - s, width, -1).mul_(q[s:e, None, :])
        torch.sum(rows, dim=-1, out=out[s:e])
    return out


def nearest_centroids(points: Any, points16: Any, centroids: np.ndarray, chunk: int | None = None) -> np.ndarray:
    """Index of the nearest centroid (L2) of each point: :class:`NearestCentroids` for one call."""
    return NearestCentroids(points, points16, chunk)(centroids)


class NearestCentroids:
    """Exact nearest centroid (L2) of fixed points (float32 ``points``, norms <= 1, and their bf16
    ``points16``) for any number of centroid sets: argmax_j x.c_j - |c_j|^2 / 2 (lowest j among
    equals), screened by one bf16 product of [x, 1] and [c_j, -|c_j|^2 / 2]. With h_j <= H, the bf16
    score is within base_x + u H + g H (1 + u) + c |score| of the fp32 one (:class:`ScreenError`);
    the top bf16 candidate wins when its fp32 score beats the runner-up's bf16 score plus that bound,
    else the best of the top ``CENTROID_CANDIDATES`` under the same test, else the fp32 argmax.
    """

    def __init__(self, points: Any, points16: Any, block: int | None = None) -> None:
        import torch

        self.points = points
        self.scored16 = torch.cat([points16, torch.ones(len(points), 1, dtype=torch.bfloat16)], dim=1)
        self.norms = _norms(points, points16)
        self.block = block

    def __call__(self, centroids: np.ndarray, rows: np.ndarray | None = None) -> np.ndarray:
        """Nearest centroid of every point, or of the points ``rows`` only."""
        import torch

        points, points_scored16, point_norms = self.points, self.scored16, self.norms
        if rows is not None:
            index = torch.from_numpy(np.asarray(rows, dtype=np.int64))
            points, points_scored16 = points[index], points_scored16[index]
            point_norms = tuple(v[rows] for v in point_norms)
        n = len(points)
        cents, half_norms = _centroid_rows(centroids)
        cents16 = cents.to(torch.bfloat16)
        scored16 = torch.cat([cents16, (-half_norms).to(torch.bfloat16)[:, None]], dim=1)
        h_max = float(half_norms.max())
        extra = UNIT_ROUNDOFF * h_max + accumulation_error(points.shape[1] + 1) * h_max * (1 + UNIT_ROUNDOFF)
        bases = ScreenError(cents, cents16).base_from_norms(*point_norms) + extra
        k = len(cents)
        out: np.ndarray = np.empty(n, dtype=np.int64)
        if k == 1 or n == 0:
            return np.zeros(n, dtype=np.int64)
        block = min(self.block or _rows_within_budget(CENTROID_BLOCK, k), n)
        uncertain: list[np.ndarray] = [np.empty(0, dtype=np.int64)]
        screen_buffer = torch.empty(block, k, dtype=torch.bfloat16)  # reused: no page faults per block
        with torch.no_grad():
            for start in range(0, n, block):
                stop = min(start + block, n)
                x, base = points[start:stop], bases[start:stop]
                screen = torch.matmul(points_scored16[start:stop], scored16.T, out=screen_buffer[: stop - start])
                approx, top = torch.topk(screen, 2, dim=1)
                best = top[:, 0]
                exact = _centroid_scores(x, cents, half_norms, best[:, None])[:, 0]
                certain = exact.numpy() > ScreenError.upper(approx[:, 1].float().numpy().astype(np.float64), base)
                out[start:stop] = best.numpy()
                doubtful = np.flatnonzero(~certain) if k > 2 else np.empty(0, dtype=np.int64)
                if len(doubtful):  # second look: the best of more candidates, same certificate
                    rows = torch.from_numpy(doubtful)
                    approx_more, more = torch.topk(screen[rows], min(CENTROID_CANDIDATES, k), dim=1)
                    scores = _centroid_scores(x[rows], cents, half_norms, more)
                    pick = scores.argmax(dim=1)
                    upper = ScreenError.upper(approx_more[:, -1].float().numpy().astype(np.float64), base[doubtful])
                    winner = scores.gather(1, pick[:, None])[:, 0].numpy()
                    # the winner must beat every candidate left out and every other candidate exactly
                    others = scores.clone().scatter_(1, pick[:, None], -torch.inf).max(dim=1).values.numpy()
                    ok = (winner > upper) & (winner > others)
                    out[start + doubtful[ok]] = more.gather(1, pick[:, None])[:, 0].numpy()[ok]
                    certain[doubtful[ok]] = True
                uncertain.append(start + np.flatnonzero(~certain))
            redo = np.concatenate(uncertain)
            for s in range(0, len(redo), block):
                rows = torch.from_numpy(redo[s : s + block])
                scores = points[rows] @ cents.T - half_norms
                out[redo[s : s + block]] = scores.argmax(dim=1).numpy()  # first maximum: lowest index
        return out

    def update(self, assignment: np.ndarray, old_centroids: np.ndarray, centroids: np.ndarray) -> np.ndarray:
        """``self(centroids)`` from ``assignment = self(old_centroids)``, looking only at what moved:
        a point whose centroid kept its exact coordinates keeps it unless a moved centroid
        scores higher (the unmoved ones score as before, and it beat them all); a point whose
        centroid moved is assigned again from scratch. Same result, at the cost of
        points x moved centroids (late k-means iterations move few)."""
        import torch

        moved = np.flatnonzero((centroids != old_centroids).any(axis=1))
        if 4 * len(moved) > len(centroids):
            return self(centroids)
        out = assignment.copy()
        orphaned = np.isin(assignment, moved)
        orphans, stay = np.flatnonzero(orphaned), np.flatnonzero(~orphaned)
        out[orphans] = self(centroids, orphans)
        if len(moved) == 0 or len(stay) == 0:
            return out
        incumbent = assignment[stay]
        challenger = moved[self(centroids[moved], stay)]
        cents, half_norms = _centroid_rows(centroids)
        pair = torch.from_numpy(np.stack([incumbent, challenger], axis=1))
        scores = _centroid_scores(self.points[torch.from_numpy(stay)], cents, half_norms, pair).numpy()
        take = (scores[:, 1] > scores[:, 0]) | ((scores[:, 1] == scores[:, 0]) & (challenger < incumbent))
        out[stay[take]] = challenger[take]
        return out


def _centroid_rows(centroids: np.ndarray) -> tuple[Any, Any]:
    """Centroids as a float32 tensor and their |c_j|^2 / 2."""
    import torch

    cents = torch.from_numpy(np.ascontiguousarray(centroids, dtype=np.float32))
    return cents, 0.5 * (cents * cents).sum(dim=1)


def _centroid_scores(x: Any, cents: Any, half_norms: Any, index: Any) -> Any:
    """fp32 scores x.c_j - |c_j|^2 / 2 of each point with the centroids ``index[row]``: the one
    formula every certified comparison uses (full and incremental assignments alike)."""
    return dots(x, cents, index) - half_norms[index]
