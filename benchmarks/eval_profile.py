"""Where the CPU time of self-retrieval from half the products goes (``symmetric fp32`` or ``bf16``).

The embeddings of ``benchmarks/eval_speed.py`` (class centre + noise, SOP-like classes of 2-12
images), scaled to ``--n`` rows. The same call as its ``--pml`` side: ``per_query_metrics`` with
Recall@1 only (P@1, R-Precision, MAP@R), profiled with cProfile on CPU time
(``time.process_time``: all threads of the process) and split into:

* block products: ``_Products.block``, rows [a, b) times rows [a, n) (BLAS);
* threshold samples: ``_row_thresholds``, every ``SAMPLE_STRIDE``-th reference (BLAS + partition);
* candidate selection: the rest of ``rank_symmetric`` (compare with the thresholds, nonzero,
  the later rows' pairs routed to their blocks, concatenation);
* sorting and ranking: ``_rank_block_fp32`` / ``_rank_block_bf16``;
* row-by-row re-ranking of the rows without a certificate;
* metrics and the rest: ``per_query_metrics`` outside the ranking.

``--row-block B [B ...]``: then ``--rounds`` alternating timings of the whole call, unprofiled, with
``symmetric.ROW_BLOCK`` set to each B; the per-query metrics must be bit-identical across them
(else the script fails).

    taskset -c 0,1 python benchmarks/eval_profile.py --n 20000 --threads 2
    taskset -c 0,1 python benchmarks/eval_profile.py --n 60502 --threads 2 --row-block 256 512 --rounds 2
"""

from __future__ import annotations

import argparse
import cProfile
import json
import pstats
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))  # run from a checkout without installing
sys.path.insert(0, str(Path(__file__).resolve().parent))

PHASES = (
    ("block products (BLAS)", ("block",)),
    ("threshold samples (BLAS + partition)", ("_row_thresholds",)),
    ("sorting and ranking", ("_rank_block_fp32", "_rank_block_bf16")),
    ("row-by-row re-ranking", ("rank_rows",)),
)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--n", type=int, default=20000)
    parser.add_argument("--dim", type=int, default=512)
    parser.add_argument("--backend", choices=["auto", "torch", "screened"], default="auto")
    parser.add_argument("--threads", type=int, default=None, help="torch and BLAS threads (default: all cores)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--row-block", type=int, nargs="*", default=[], help="then time these ROW_BLOCK values")
    parser.add_argument("--rounds", type=int, default=1)
    args = parser.parse_args()

    import numpy as np
    import torch
    from eval_speed import sop_like_labels

    from dmlbench.evaluate import symmetric
    from dmlbench.evaluate.knn import ranking_schedule
    from dmlbench.evaluate.metrics import means, per_query_metrics

    if args.threads:
        from threadpoolctl import threadpool_limits

        torch.set_num_threads(args.threads)
        threadpool_limits(args.threads)
    rng = np.random.default_rng(args.seed)
    labels = sop_like_labels(args.n, rng)
    centres = rng.standard_normal((int(labels.max()) + 1, args.dim), dtype=np.float32)
    embeddings = centres[labels] + 2.5 * rng.standard_normal((args.n, args.dim), dtype=np.float32)
    _, _, schedule = ranking_schedule(args.backend, "cpu", True, args.n)
    print(json.dumps({"n": args.n, "dim": args.dim, "schedule": schedule, "row_block": symmetric.ROW_BLOCK,
                      "threads": torch.get_num_threads()}), flush=True)  # fmt: skip

    def evaluate() -> dict[str, np.ndarray]:
        return per_query_metrics(embeddings, labels, recall_ks=[1], backend=args.backend)

    evaluate_small = sop_like_labels(3000, np.random.default_rng(1))  # warm up imports and BLAS
    per_query_metrics(embeddings[: len(evaluate_small)], evaluate_small, recall_ks=[1], backend=args.backend)

    profile = cProfile.Profile(time.process_time)
    cpu = time.process_time()
    profile.enable()
    reference = evaluate()
    profile.disable()
    total = time.process_time() - cpu
    stats = pstats.Stats(profile).stats  # type: ignore[attr-defined]

    def cumulative(names: tuple[str, ...], file: str | None = "symmetric.py") -> float:
        return sum(
            entry[3]
            for (path, _, name), entry in stats.items()
            if name in names and (file is None or path.endswith(file) or name == "rank_rows")
        )

    split = {phase: cumulative(names) for phase, names in PHASES}
    ranked = cumulative(("rank_symmetric",))
    split["candidate selection (compare, nonzero, routing)"] = ranked - sum(split.values())
    split["metrics and the rest"] = total - ranked
    products = args.n * (args.n - 1) / 2 * 2 * args.dim
    print(f"\nCPU time of per_query_metrics (P@1, R-Precision, MAP@R), {args.n:,} x {args.dim}, {schedule}")
    print("| phase | CPU s | share |")
    print("| --- | ---: | ---: |")
    for phase, seconds in split.items():
        print(f"| {phase} | {seconds:.2f} | {seconds / total:.0%} |")
    print(f"| total (profiled) | {total:.2f} | 100% |")
    blas = split["block products (BLAS)"]
    rate = products / blas / 1e9
    print(f"\nblock products: {products / 1e12:.3f} TFLOP in {blas:.2f} CPU s = {rate:.1f} GFLOP/s per CPU second")
    print(json.dumps({name: float(value) for name, value in means(reference).items() if name != "r"}))

    if not args.row_block:
        return
    times: dict[int, list[tuple[float, float]]] = {block: [] for block in args.row_block}
    default = symmetric.ROW_BLOCK
    try:
        for round_ in range(args.rounds):
            for block in args.row_block:
                symmetric.ROW_BLOCK = block
                wall, cpu = time.perf_counter(), time.process_time()
                values = evaluate()
                times[block].append((time.perf_counter() - wall, time.process_time() - cpu))
                same = all(np.array_equal(values[name], reference[name]) for name in reference)
                print(json.dumps({"round": round_ + 1, "row_block": block, "wall_s": round(times[block][-1][0], 2),
                                  "cpu_s": round(times[block][-1][1], 2), "identical": same}), flush=True)  # fmt: skip
                if not same:
                    raise SystemExit(f"ROW_BLOCK {block}: per-query metrics differ from the profiled run")
    finally:
        symmetric.ROW_BLOCK = default
    print(f"\n| ROW_BLOCK | CPU s (median of {args.rounds}) | wall s | per-query metrics |")
    print("| ---: | ---: | ---: | --- |")
    for block, pairs in times.items():
        cpu_s = float(np.median([p[1] for p in pairs]))
        wall_s = float(np.median([p[0] for p in pairs]))
        print(f"| {block} | {cpu_s:.2f} | {wall_s:.2f} | bit-identical |")


if __name__ == "__main__":
    main()
