"""Evaluation speed at Stanford Online Products scale: every metric on 60,502 x 512 embeddings.

Random float32 embeddings (class centre + noise, so the metrics are neither 0 nor 1) with
SOP-like labels: ~11.3k classes of 2-12 images. Runs what the evaluate stage runs for one run:
exact ranking metrics (P@1, R-Precision, MAP@R, Recall@{1,10,100,1000}), NMI/AMI/F1 from one
k-means (k = classes, 20 iterations) and the bootstrap intervals over the test classes; prints wall time, CPU
time and peak memory of each phase.

    python benchmarks/eval_speed.py                      # CPU, auto backend
    python benchmarks/eval_speed.py --backend faiss      # faiss-cpu IndexFlatIP
    python benchmarks/eval_speed.py --device cuda        # GPU (torch, or faiss-gpu if installed)
    taskset -c 0,1 python benchmarks/eval_speed.py --threads 2   # the 2-core target
    taskset -c 0,1 python benchmarks/eval_speed.py --threads 2 --no-clustering --pml 3   # beside PML

``--pml N``: then N rounds, alternating, of the same three metrics from both sides on the same
embeddings: ours (``per_query_metrics`` with Recall@1 only, so nothing beyond the R-long list is
searched) and pytorch-metric-learning's ``AccuracyCalculator(include=("precision_at_1",
"r_precision", "mean_average_precision_at_r"), k="max_bin_count")`` on the CPU with its default
k-NN (faiss-cpu ``IndexFlatL2`` on the L2-normalised embeddings: the cosine ranking). Each side is
timed from the raw embeddings to the three means (normalisation included); the metrics must agree
to 1e-9 (else the script fails). Prints medians, wall and CPU, and their ratio.

Before timing, a small evaluation warms the process up (imports, CUDA context, library
handles: paid once per process, not per evaluation); ``--cold`` times the first one instead.

Targets: < 20 s and < 4 GB on 2 CPU cores; < 2 s on a GPU.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))  # run from a checkout without installing


def sop_like_labels(n: int, rng, min_size: int = 2, max_size: int = 12, mean_size: float = 5.35):
    """Class sizes in [min_size, max_size] with mean ~``mean_size`` (SOP test: 60,502 images, 11,316
    classes), shuffled; the last class absorbs the remainder."""
    import numpy as np

    p = (mean_size - min_size) / (max_size - min_size)
    sizes = []
    total = 0
    while total < n:
        size = min_size + int(rng.binomial(max_size - min_size, p))
        size = min(size, n - total) if n - total >= min_size else n - total
        sizes.append(size)
        total += size
    labels = np.repeat(np.arange(len(sizes)), sizes)
    return rng.permutation(labels)


def peak_rss_gb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20  # kB on Linux


class Phase:
    def __init__(self, name: str, rows: list):
        self.name, self.rows = name, rows

    def __enter__(self):
        self.wall, self.cpu = time.perf_counter(), time.process_time()
        return self

    def __exit__(self, *exc):
        import torch

        if torch.cuda.is_available():
            torch.cuda.synchronize()
        row = {
            "phase": self.name,
            "wall_s": round(time.perf_counter() - self.wall, 2),
            "cpu_s": round(time.process_time() - self.cpu, 2),
            "peak_rss_gb": round(peak_rss_gb(), 2),
        }
        if torch.cuda.is_available():
            row["peak_gpu_gb"] = round(torch.cuda.max_memory_allocated() / 2**30, 2)
        self.rows.append(row)
        print(json.dumps(row), flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--n", type=int, default=60502)
    parser.add_argument("--dim", type=int, default=512)
    parser.add_argument("--recall-at", type=int, nargs="+", default=[1, 10, 100, 1000])
    parser.add_argument("--backend", choices=["auto", "faiss", "torch", "screened"], default="auto")
    parser.add_argument("--device", default="cpu", help="torch device for the torch backend and k-means (cpu, cuda)")
    parser.add_argument("--threads", type=int, default=None, help="torch/faiss threads (default: all cores)")
    parser.add_argument("--no-clustering", action="store_true", help="skip NMI/AMI/F1 (k-means)")
    parser.add_argument("--resamples", type=int, default=1000, help="bootstrap resamples")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--json", type=Path, default=None, help="also write the figures here")
    parser.add_argument(
        "--pml", type=int, default=0, metavar="N", help="then N alternating rounds beside PML's AccuracyCalculator"
    )
    parser.add_argument(
        "--cold", action="store_true", help="time the first evaluation of the process (imports, CUDA start-up)"
    )
    args = parser.parse_args()

    import numpy as np
    import torch

    from dmlbench.evaluate.clustering import clustering_metrics
    from dmlbench.evaluate.intervals import bootstrap_intervals
    from dmlbench.evaluate.knn import faiss_available, faiss_gpus, ranking_schedule
    from dmlbench.evaluate.metrics import per_query_metrics

    if args.threads:
        torch.set_num_threads(args.threads)
        if faiss_available():
            import faiss

            faiss.omp_set_num_threads(args.threads)
        from threadpoolctl import threadpool_limits

        threadpool_limits(args.threads)  # numpy's (and faiss's) BLAS
    rng = np.random.default_rng(args.seed)
    labels = sop_like_labels(args.n, rng)
    classes = int(labels.max()) + 1
    centres = rng.standard_normal((classes, args.dim), dtype=np.float32)
    embeddings = centres[labels] + 2.5 * rng.standard_normal((args.n, args.dim), dtype=np.float32)
    backend, device, schedule = ranking_schedule(args.backend, args.device, True, args.n)
    setup = {
        "n": args.n,
        "dim": args.dim,
        "classes": classes,
        "class_sizes": [int(np.bincount(labels).min()), int(np.bincount(labels).max())],
        "backend": backend,
        "schedule": schedule,  # symmetric: each similarity once for both rows (self-retrieval on the CPU)
        "device": device,
        "faiss_gpus": faiss_gpus(),
        "threads": torch.get_num_threads(),
        "cpu_count": os.cpu_count(),
        "affinity": len(os.sched_getaffinity(0)),
        "gpu": torch.cuda.get_device_name() if device.startswith("cuda") else None,
    }
    print(json.dumps(setup), flush=True)

    if not args.cold:  # imports, the CUDA context and library handles: paid once per process
        warm_labels = sop_like_labels(2000, np.random.default_rng(1))
        warm = embeddings[: len(warm_labels)]
        warm_values = per_query_metrics(warm, warm_labels, recall_ks=[1, 10], backend=args.backend, device=device)
        clustering_metrics(warm, warm_labels, device=device, backend="auto")
        bootstrap_intervals(
            {"p": warm_values.metrics["precision_at_1"]}, n_resamples=10, seed=0, clusters=warm_values.query_label
        )

    rows: list = []
    total_wall, total_cpu = time.perf_counter(), time.process_time()
    with Phase("ranking metrics", rows):
        values = per_query_metrics(embeddings, labels, recall_ks=args.recall_at, backend=args.backend, device=device)
    metrics = values.means()
    if not args.no_clustering:
        with Phase("nmi/ami/f1 (k-means)", rows):
            metrics.update(clustering_metrics(embeddings, labels, device=device, backend="auto"))
    with Phase("bootstrap intervals (test classes resampled)", rows):
        intervals = bootstrap_intervals(values.metrics, n_resamples=args.resamples, seed=0, clusters=values.query_label)
    total = {
        "phase": "total",
        "wall_s": round(time.perf_counter() - total_wall, 2),
        "cpu_s": round(time.process_time() - total_cpu, 2),
        "peak_rss_gb": round(peak_rss_gb(), 2),
    }
    print(json.dumps(total))
    print(json.dumps({name: round(value, 4) for name, value in metrics.items()}))
    print(json.dumps({name: [round(i.low, 4), round(i.high, 4), i.n] for name, i in intervals.items()}))
    beside_pml = compare_with_pml(embeddings, labels, args.backend, device, args.pml) if args.pml else None
    if args.json:
        figures = {"setup": setup, "phases": rows + [total], "metrics": metrics, "pml": beside_pml}
        args.json.write_text(json.dumps(figures, indent=2))


PML_METRICS = {
    "precision_at_1": "precision_at_1",
    "r_precision": "r_precision",
    "map_at_r": "mean_average_precision_at_r",
}


def compare_with_pml(embeddings, labels, backend: str, device: str, rounds: int) -> dict:
    """``rounds`` alternating timings of P@1, R-Precision and MAP@R, ours and PML's
    (module docstring); fails when the metrics differ by more than 1e-9."""
    import numpy as np
    import torch
    from pytorch_metric_learning.utils.accuracy_calculator import AccuracyCalculator

    from dmlbench.evaluate.knn import ranking_schedule
    from dmlbench.evaluate.metrics import per_query_metrics

    def ours() -> dict[str, float]:
        values = per_query_metrics(embeddings, labels, recall_ks=[1], backend=backend, device=device).means()
        return {name: values[name] for name in PML_METRICS}

    def pml() -> dict[str, float]:
        calculator = AccuracyCalculator(
            include=tuple(PML_METRICS.values()), k="max_bin_count", device=torch.device(device)
        )
        normalized = torch.nn.functional.normalize(torch.from_numpy(embeddings), dim=1)
        values = calculator.get_accuracy(normalized, torch.from_numpy(labels))
        return {name: values[pml_name] for name, pml_name in PML_METRICS.items()}

    times: dict[str, list[tuple[float, float]]] = {"ours": [], "pml": []}
    results: dict[str, dict[str, float]] = {}
    for round_ in range(rounds):
        for side, run in (("ours", ours), ("pml", pml)):
            wall, cpu = time.perf_counter(), time.process_time()
            results[side] = run()
            times[side].append((time.perf_counter() - wall, time.process_time() - cpu))
            print(json.dumps({"round": round_ + 1, "side": side, "wall_s": round(times[side][-1][0], 2),
                              "cpu_s": round(times[side][-1][1], 2)}), flush=True)  # fmt: skip
    difference = max(abs(results["ours"][name] - results["pml"][name]) for name in PML_METRICS)
    equal = difference <= 1e-9
    figures = {}
    for column, clock in (("wall", 0), ("CPU", 1)):
        ours_s, pml_s = (np.array([t[clock] for t in times[side]]) for side in ("ours", "pml"))
        # the ratio round by round (each PML run beside the ours before it), then the median
        figures[column] = (float(np.median(ours_s)), float(np.median(pml_s)), float(np.median(pml_s / ours_s)))
    resolved, _, schedule = ranking_schedule(backend, device, True, len(labels))
    used = f"{schedule} products" if schedule != "rows" else f"{resolved}, row by row"
    print(
        f"\nP@1, R-Precision and MAP@R of {len(labels):,} x {embeddings.shape[1]} embeddings: ours ({used}) beside "
        f"PML's AccuracyCalculator (faiss-cpu IndexFlatL2, k = max_bin_count), medians of {rounds} alternating rounds"
    )
    print("| phase | ours s | PML s | PML / ours | metrics equal |")
    print("| --- | --- | --- | --- | --- |")
    for column, (ours_s, pml_s, ratio) in figures.items():
        verdict = "yes" if equal else f"NO ({difference:.2g})"
        print(f"| P@1, R-Precision, MAP@R ({column}) | {ours_s:.2f} | {pml_s:.2f} | {ratio:.2f}x | {verdict} |")
    print(json.dumps({"ours": results["ours"], "pml": results["pml"], "max_difference": difference}))
    if not equal:
        raise SystemExit(f"metrics differ from PML's by {difference:.3g} (more than 1e-9)")
    return {"rounds": rounds, "times_s": times, "figures": figures, "metrics": results, "max_difference": difference}


if __name__ == "__main__":
    main()
