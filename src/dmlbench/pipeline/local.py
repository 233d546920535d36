"""The local executor: every planned stage as ``dvc --wait-for-lock repro --single-item <stage>``
in a pool of ``jobs`` workers, a stage starting as soon as all its upstream stages are done.

``dvc repro`` runs one stage at a time (treeverse/dvc#755); DVC still runs, caches and locks every
stage here, the pool only decides the order. CPU: each worker gets ``cpu_count // jobs`` threads
(:func:`dmlbench.launch.worker_environment`); GPU box: one worker per GPU id with
``CUDA_VISIBLE_DEVICES`` set per worker. Each stage's output goes to
``artifacts/logs/<stage>.log``; a failing stage's tail is printed and no new stage is started.
"""

from __future__ import annotations

import os
import queue
import re
import subprocess
import sys
import time
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from pathlib import Path

from dmlbench.launch import threads_per_worker, worker_environment
from dmlbench.pipeline.plan import Plan

LOG_DIR = Path("artifacts/logs")


def log_path(stage: str) -> Path:
    return LOG_DIR / (re.sub(r"[^A-Za-z0-9_.@-]", "_", stage) + ".log")


def _run_stage(stage: str, slots: queue.Queue[int], threads: int, gpus: list[str]) -> tuple[str, int, float]:
    slot = slots.get()
    try:
        env = worker_environment(threads, gpus[slot] if gpus else None)
        started = time.perf_counter()
        with open(log_path(stage), "w") as log:
            code = subprocess.run(
                [sys.executable, "-m", "dvc", "--wait-for-lock", "repro", "--single-item", stage],
                stdout=log,
                stderr=subprocess.STDOUT,
                env=env, check=False,
            ).returncode
        return stage, code, time.perf_counter() - started
    finally:
        slots.put(slot)


def tail(path: Path, lines: int = 15) -> str:
    text = path.read_text(errors="replace").replace("\r", "\n").splitlines()
    return "\n".join(line for line in text[-lines:] if line.strip())


def run_parallel(plan: Plan, jobs: int, gpus: list[str]) -> list[str]:
    """Run the plan; return the stages that failed (empty on success)."""
    from tqdm import tqdm

    LOG_DIR.mkdir(parents=True, exist_ok=True)
    threads = threads_per_worker(jobs, os.cpu_count() or 1)
    slots: queue.Queue[int] = queue.Queue()
    for slot in range(jobs):
        slots.put(slot)
    done: set[str] = set()
    failed: list[str] = []
    pending = list(plan.order)
    running: dict[Future, str] = {}
    with (
        ThreadPoolExecutor(max_workers=jobs) as pool,
        tqdm(total=len(plan.order), desc="dvc stages", unit="stage") as bar,
    ):
        while pending or running:
            if not failed:
                ready = [s for s in pending if plan.waits_for[s] <= done][: jobs - len(running)]
                for stage in ready:
                    pending.remove(stage)
                    running[pool.submit(_run_stage, stage, slots, threads, gpus)] = stage
            if not running:
                break
            finished, _ = wait(running, return_when=FIRST_COMPLETED)
            for future in finished:
                stage, code, seconds = future.result()
                del running[future]
                bar.update(1)
                if code == 0:
                    done.add(stage)
                    tqdm.write(f"done   {stage} ({seconds:.1f} s)")
                else:
                    failed.append(stage)
                    tqdm.write(
                        f"FAILED {stage} (exit {code}); last lines of {log_path(stage)}:\n{tail(log_path(stage))}"
                    )
    return failed
