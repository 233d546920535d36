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
        "--cold", action="store_true", help="time the first evaluation of the process (imports, CUDA start-up)"
    )
    args = parser.parse_args()

    import numpy as np
    import torch

    from dmlbench.evaluate.clustering import clustering_metrics
    from dmlbench.evaluate.intervals import bootstrap_intervals
    from dmlbench.evaluate.knn import faiss_available, faiss_gpus, resolve_backend
    from dmlbench.evaluate.metrics import QUERY_FIELDS, means, per_query_metrics

    if args.threads:
        torch.set_num_threads(args.threads)
        if faiss_available():
            import faiss

            faiss.omp_set_num_threads(args.threads)
    rng = np.random.default_rng(args.seed)
    labels = sop_like_labels(args.n, rng)
    classes = int(labels.max()) + 1
    centres = rng.standard_normal((classes, args.dim), dtype=np.float32)
    embeddings = centres[labels] + 2.5 * rng.standard_normal((args.n, args.dim), dtype=np.float32)
    backend, device = resolve_backend(args.backend, args.device)
    setup = {
        "n": args.n,
        "dim": args.dim,
        "classes": classes,
        "class_sizes": [int(np.bincount(labels).min()), int(np.bincount(labels).max())],
        "backend": backend,
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
        warm_values = per_query_metrics(warm, warm_labels, recall_ks=[1, 10], backend=backend, device=device)
        clustering_metrics(warm, warm_labels, device=device, backend="auto")
        bootstrap_intervals(
            {"p": warm_values["precision_at_1"]}, n_resamples=10, seed=0, clusters=warm_values["query_label"]
        )

    rows: list = []
    total_wall, total_cpu = time.perf_counter(), time.process_time()
    with Phase("ranking metrics", rows):
        values = per_query_metrics(embeddings, labels, recall_ks=args.recall_at, backend=backend, device=device)
    metrics = means(values)
    if not args.no_clustering:
        with Phase("nmi/ami/f1 (k-means)", rows):
            metrics.update(clustering_metrics(embeddings, labels, device=device, backend="auto"))
    with Phase("bootstrap intervals (test classes resampled)", rows):
        per_query = {name: v for name, v in values.items() if name not in QUERY_FIELDS}
        intervals = bootstrap_intervals(per_query, n_resamples=args.resamples, seed=0, clusters=values["query_label"])
    total = {
        "phase": "total",
        "wall_s": round(time.perf_counter() - total_wall, 2),
        "cpu_s": round(time.process_time() - total_cpu, 2),
        "peak_rss_gb": round(peak_rss_gb(), 2),
    }
    print(json.dumps(total))
    print(json.dumps({name: round(value, 4) for name, value in metrics.items()}))
    print(json.dumps({name: [round(i.low, 4), round(i.high, 4), i.n] for name, i in intervals.items()}))
    if args.json:
        args.json.write_text(json.dumps({"setup": setup, "phases": rows + [total], "metrics": metrics}, indent=2))


if __name__ == "__main__":
    main()
