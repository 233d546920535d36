"""GPU packing: aggregate training throughput of 1, 2, 4, 8 concurrent trainings on one GPU.

What ``make repro GPUS=0 GPU_SLOTS=N`` does to one GPU: N training processes at once, each told
its share (``DMLBENCH_GPU_SHARE=N``: its image cache stays on the GPU only if it fits in 1/N of
half the free memory) and ``cpu_count // N`` CPU threads, as the local executor gives its workers. Each process
builds the full training step of one setting (:func:`throughput_probe.benchmark_steps`:
uint8 cache -> augmentation on the device -> bf16 forward/backward -> optimiser), warms up, waits
for the others at a barrier, then trains for ``--seconds`` of wall time. Per N it prints the
images/s of each training, their sum over the common window (all images / (last end - first
start)), the speed-up over one training alone (when ``--concurrency`` has 1), and the peak GPU
memory torch reserved (each process's ``max_memory_reserved`` and their sum; CUDA contexts not
counted). Under MPS (``CUDA_MPS_PIPE_DIRECTORY`` set, a daemon running) the JSON says so.

    python benchmarks/gpu_packing.py --device cpu --backbone tiny_cnn --image-size 36 --crop 32 \\
        --concurrency 1,2 --seconds 3                              # a smoke run on the CPU
    python benchmarks/gpu_packing.py                               # the Reality Check's setting on GPU 0
    python benchmarks/gpu_packing.py --backbone resnet50 --crop 224 --batch 100 --grad-clip 10  # thesis
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import queue
import sys
import time
from pathlib import Path
from typing import Any

SRC = str(Path(__file__).resolve().parents[1] / "src")  # run from a checkout without installing
sys.path.insert(0, SRC)

from throughput_probe import add_setting_arguments, benchmark_steps, setting_from_arguments  # noqa: E402


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    add_setting_arguments(parser, backbone="bn_inception", dim=128, image_size=256, crop=227)
    parser.add_argument("--concurrency", default="1,2,4,8", help="comma-separated numbers of trainings at once")
    parser.add_argument("--seconds", type=float, default=15.0, help="timed wall time of each training")
    parser.add_argument("--warmup", type=int, default=10, help="untimed steps before the barrier (>= 1)")
    parser.add_argument("--wait", type=float, default=600.0, help="seconds to wait for every process to be ready")
    parser.add_argument("--device", default="cuda", help="cuda (the first visible GPU) or cpu")
    parser.add_argument("--json", type=Path, help="also write the results here")
    args = parser.parse_args()
    try:
        args.concurrency = [int(n) for n in args.concurrency.split(",")]
    except ValueError:
        parser.error(f"--concurrency must be comma-separated positive integers, got {args.concurrency!r}")
    if not args.concurrency or min(args.concurrency) < 1:
        parser.error(f"--concurrency must be comma-separated positive integers, got {args.concurrency!r}")
    if args.warmup < 1 or args.seconds <= 0:
        parser.error(f"--warmup must be >= 1 and --seconds > 0, got {args.warmup} and {args.seconds}")
    if args.device not in ("cuda", "cpu"):
        parser.error(f"--device must be cuda or cpu, got {args.device!r}")
    return args


def train_for(args: argparse.Namespace, share: int, threads: int, barrier: Any, results: Any) -> None:
    """One training process: build, warm up, wait at the barrier, train ``args.seconds``."""
    os.environ["DMLBENCH_GPU_SHARE"] = str(share)
    import torch

    torch.set_num_threads(threads)
    device = torch.device(args.device)
    setting = setting_from_arguments(args, "packing")
    steps = benchmark_steps(setting, device, iterations=1000, images=args.images, classes=args.classes)
    for _ in range(args.warmup):
        loss = steps.full()
    float(loss)  # the device drained before the window opens
    barrier.wait(timeout=args.wait)  # broken (an exception here) if another process died first
    start = time.monotonic()  # CLOCK_MONOTONIC: one clock for every process of the machine
    done = 0
    while time.monotonic() - start < args.seconds:
        loss = steps.full()
        done += 1
    float(loss)
    end = time.monotonic()
    reserved = torch.cuda.max_memory_reserved(device) / 2**20 if device.type == "cuda" else None
    results.put(
        {
            "images": done * args.batch,
            "start": start,
            "end": end,
            "placement": steps.placement,
            "reserved_mib": reserved,
        }
    )


def run_packed(args: argparse.Namespace, trainings: int) -> dict[str, Any]:
    """``trainings`` concurrent processes; their rates and the aggregate over the common window."""
    context = multiprocessing.get_context("spawn")  # CUDA cannot be forked
    barrier = context.Barrier(trainings)
    results = context.Queue()
    threads = max(1, (os.cpu_count() or 1) // trainings)
    processes = [
        context.Process(target=train_for, args=(args, trainings, threads, barrier, results)) for _ in range(trainings)
    ]
    for process in processes:
        process.start()
    rows: list[dict[str, Any]] = []
    while len(rows) < trainings:  # a process that died never reports: stop all instead of waiting forever
        try:
            rows.append(results.get(timeout=1.0))
        except queue.Empty:
            dead = [p.exitcode for p in processes if p.exitcode not in (None, 0)]
            if dead:
                barrier.abort()
                for process in processes:
                    process.terminate()
                raise SystemExit(
                    f"error: a training process exited with {dead[0]} at {trainings} trainings at once"
                ) from None
    for process in processes:
        process.join()
    window = max(row["end"] for row in rows) - min(row["start"] for row in rows)
    reserved = [row["reserved_mib"] for row in rows if row["reserved_mib"] is not None]
    return {
        "trainings": trainings,
        "threads_each": threads,
        "each_images_per_s": sorted(row["images"] / (row["end"] - row["start"]) for row in rows),
        "aggregate_images_per_s": sum(row["images"] for row in rows) / window,
        "window_s": window,
        "placement": sorted({row["placement"] for row in rows}),
        "reserved_mib_each": sorted(reserved),
        "reserved_mib_total": sum(reserved) if reserved else None,
    }


def main() -> None:
    args = parse_args()
    import torch

    if args.device == "cuda" and not torch.cuda.is_available():
        raise SystemExit("error: --device cuda but torch sees no CUDA GPU; use --device cpu for a smoke run")
    device_name = torch.cuda.get_device_name(0) if args.device == "cuda" else f"cpu ({os.cpu_count()} cores)"
    print(
        f"{device_name}; torch {torch.__version__}; {args.backbone} + {args.loss}, dim {args.dim}, batch {args.batch} "
        f"({args.per_class}/class), cache {args.images} x {args.image_size} px each, crop {args.crop} px, "
        f"{args.seconds:g} s per training",
        flush=True,
    )
    rows: list[dict[str, Any]] = []
    print("| trainings | each (img/s) | aggregate (img/s) | vs one | GPU memory reserved, total (MiB) | cache on |")
    print("| ---: | --- | ---: | ---: | ---: | --- |", flush=True)
    for trainings in args.concurrency:
        row = run_packed(args, trainings)
        rows.append(row)
        alone = next((r["aggregate_images_per_s"] for r in rows if r["trainings"] == 1), None)
        speedup = f"{row['aggregate_images_per_s'] / alone:.2f}x" if alone else "-"
        each = ", ".join(f"{rate:,.0f}" for rate in row["each_images_per_s"])
        memory = f"{row['reserved_mib_total']:,.0f}" if row["reserved_mib_total"] is not None else "-"
        print(
            f"| {trainings} | {each} | {row['aggregate_images_per_s']:,.0f} | "
            f"{speedup} | {memory} | {', '.join(row['placement'])} |",
            flush=True,
        )
    if args.json:
        setting = {k: v for k, v in vars(args).items() if k != "json"}
        mps = os.environ.get("CUDA_MPS_PIPE_DIRECTORY")  # the trainings ran under this MPS daemon, if any
        payload = {"device": device_name, "torch": torch.__version__, "mps_pipe": mps, "setting": setting, "rows": rows}
        args.json.write_text(json.dumps(payload, indent=2) + "\n")


if __name__ == "__main__":
    main()
