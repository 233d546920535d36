"""The local executor: the planned stages' commands in a pool of ``jobs`` workers, a stage starting
as soon as all its upstream stages are done, recorded in DVC in batches by this one process (a
stage stale only because something upstream re-ran is skipped when its dependencies came out the
same, as ``dvc repro``). Why and what is kept: docs/pipeline.md.
"""

from __future__ import annotations

import contextlib
import os
import queue
import signal
import subprocess
import threading
import time
from collections.abc import Callable, Mapping
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from dataclasses import replace
from pathlib import Path

from dmlbench.errors import DmlbenchError
from dmlbench.launch import threads_per_worker, worker_environment
from dmlbench.pipeline import guard
from dmlbench.pipeline.interrupts import InterruptibleCommands, interrupts_raised
from dmlbench.pipeline.plan import VALIDATE, Plan, make_plan
from dmlbench.pipeline.record import RecordError, StageBook

LOG_DIR = Path("artifacts/logs")
GPU_SHARE_VARIABLE = "DMLBENCH_GPU_SHARE"  # how many stages share this worker's GPU


def log_path(stage: str) -> Path:
    return LOG_DIR / guard.stage_filename(stage, ".log")


def worker_gpus(gpus: list[str], slots_per_gpu: int = 1) -> list[str]:
    """One entry per worker: each GPU id ``slots_per_gpu`` times, interleaved (``0,1`` x 2 ->
    ``0,1,0,1``) so that the first workers spread over the GPUs."""
    return [gpu for _ in range(slots_per_gpu) for gpu in gpus]


EARLIER = "completed in an earlier run; recorded now"  # how a stage adopted from its note is reported


def _adopted(book: StageBook, stage: str) -> bool:
    """Whether ``stage``'s command completed in an earlier run that was killed before recording it,
    and it is recorded now (its note, :mod:`dmlbench.pipeline.guard`); else it is to run."""
    note = guard.read_note(stage)
    if note is None or note.get("state") != guard.COMPLETED:
        return False
    try:
        book.adopt(stage, note)
    except RecordError:
        guard.clear_note(stage)
        return False
    return True


def _clear_notes(stages: list[str]) -> None:
    """The stages are in dvc.lock: their notes (:mod:`dmlbench.pipeline.guard`) have served."""
    for stage in stages:
        guard.clear_note(stage)


def _run_stage(
    book: StageBook,
    workers: InterruptibleCommands,
    stage: str,
    slots: queue.Queue[int],
    threads: int,
    gpus: list[str],
    environment: Mapping[str, str],
) -> tuple[str, int, float, str]:
    """Run one stage in a free slot: ``(stage, exit code, seconds, problem or note)``."""
    from tqdm import tqdm

    slot = slots.get()
    started = time.perf_counter()
    lock: int | None = None
    try:
        # a copy an earlier (killed) runner started still runs: wait for it, then record it if it completed
        lock = guard.claim(stage, on_wait=lambda pid: tqdm.write(
            f"wait   {stage} (a copy started by an earlier run is still running{f', pid {pid}' if pid else ''})"
        ), stop=lambda: workers.stopping)  # fmt: skip
        if workers.stopping:
            return stage, -signal.SIGINT, time.perf_counter() - started, ""
        if _adopted(book, stage):
            return stage, 0, time.perf_counter() - started, EARLIER
        extra = {GPU_SHARE_VARIABLE: str(gpus.count(gpus[slot]))} if gpus else {}
        env = worker_environment(threads, gpus[slot] if gpus else None, **environment, **extra)
        command = book.start(stage, env)
        note = guard.note_path(stage)
        guard.write_note(note, {**book.snapshot(stage), "stage": stage, "state": guard.RUNNING})
        with open(log_path(stage), "w") as log:
            argv = guard.guarded_argv(note, lock, command.lines)
            held = () if lock is None else (lock,)
            code = workers.run(
                argv, cwd=command.cwd, env=command.env, stdout=log, stderr=subprocess.STDOUT, pass_fds=held
            )
        problem = ""
        if code == 0:
            try:
                book.finish(stage)
            except RecordError as exc:
                guard.clear_note(stage)
                code, problem = 1, str(exc)
        return stage, code, time.perf_counter() - started, problem
    except Exception as exc:  # DVC's bookkeeping failed (a missing dependency, the cache): this stage failed
        return stage, 1, time.perf_counter() - started, f"{stage}: {type(exc).__name__}: {exc}"
    finally:
        if lock is not None:
            os.close(lock)  # the stage's process holds it now, until it exits
        slots.put(slot)


def tail(path: Path, lines: int = 15) -> str:
    """The last ``lines`` lines of a log, blank ones left out (``splitlines`` also ends a progress bar's ``\\r``)."""
    return "\n".join(line for line in path.read_text(errors="replace").splitlines()[-lines:] if line.strip())


class _Recorder(threading.Thread):
    """Writes the book's queued lock entries: at most one batch every ``interval`` seconds."""

    def __init__(self, book: StageBook, interval: float):
        super().__init__(name="dvc-lock-recorder", daemon=True)
        self.book, self.interval = book, interval
        self.stop = threading.Event()
        self.error: BaseException | None = None

    def run(self) -> None:
        while not self.stop.wait(self.interval):
            try:
                self.book.flush()
            except Exception as exc:  # the batch stays queued; tried again, and reported at the end
                if self.error is None:
                    from tqdm import tqdm

                    tqdm.write(f"warning: writing dvc.lock failed ({exc}); retrying every {self.interval:.0f} s")
                self.error = exc


def run_parallel(
    plan: Plan,
    jobs: int,
    gpus: list[str],
    *,
    root: Path = Path("."),
    record_every: float = 10.0,
    progress: bool = True,
    environment: Mapping[str, str] | None = None,
    progress_note: Callable[[str | None, float | None], str] | None = None,
) -> list[str]:
    """Run the plan with ``jobs`` workers (``gpus``: one id per worker, see :func:`worker_gpus`;
    ``environment``: variables every stage gets, e.g. an MPS daemon's, :mod:`dmlbench.pipeline.mps`;
    ``progress_note``: the progress bar's postfix after each stage ends (its name and seconds, None
    when skipped) and at the start (None, None), e.g. the ETA of :class:`dmlbench.cost.plan.RunnerEta`);
    return the stages that failed (empty on success). Finished stages are in ``dvc.lock`` when it
    returns, also after Ctrl-C or SIGTERM (then re-raised as KeyboardInterrupt)."""
    from tqdm import tqdm

    (root / LOG_DIR).mkdir(parents=True, exist_ok=True)
    threads = threads_per_worker(jobs, os.cpu_count() or 1)
    gpus = gpus[:jobs]  # the workers' GPUs (a GPU's share counts only the workers that run)
    slots: queue.Queue[int] = queue.Queue()
    for slot in range(jobs):
        slots.put(slot)
    done: set[str] = set()
    failed: list[str] = []
    pending = list(plan.order)
    stale = set(plan.stale) if plan.stale is not None else set(plan.order)
    running: dict[Future[tuple[str, int, float, str]], str] = {}
    workers = InterruptibleCommands()
    env = dict(environment or {})
    with (
        interrupts_raised(),
        contextlib.chdir(root),
        StageBook(".") as book,
        ThreadPoolExecutor(max_workers=jobs) as pool,
        tqdm(total=len(plan.order), desc="dvc stages", unit="stage", disable=not progress) as bar,
    ):
        book.on_written = _clear_notes
        recorder = _Recorder(book, record_every)
        recorder.start()
        note = progress_note or (lambda _stage, _seconds: "")
        bar.set_postfix_str(note(None, None))
        try:
            while pending or running:
                if not failed:
                    ready = [s for s in pending if plan.waits_for[s] <= done]
                    for stage in ready:
                        if len(running) >= jobs:
                            break
                        pending.remove(stage)
                        if stage not in stale and not book.is_changed(stage):
                            done.add(stage)  # its upstream re-ran to the same outputs
                            bar.set_postfix_str(note(stage, None), refresh=False)
                            bar.update(1)
                            continue
                        running[pool.submit(_run_stage, book, workers, stage, slots, threads, gpus, env)] = stage
                    if any(plan.waits_for[s] <= done for s in pending) and len(running) < jobs:
                        continue
                if not running:
                    break
                finished, _ = wait(running, return_when=FIRST_COMPLETED)
                for future in finished:
                    stage, code, seconds, problem = future.result()
                    del running[future]
                    bar.set_postfix_str(note(stage, seconds if code == 0 else None), refresh=False)
                    bar.update(1)
                    if code == 0:
                        done.add(stage)
                        tqdm.write(f"done   {stage} ({problem or f'{seconds:.1f} s'})")
                    else:
                        failed.append(stage)
                        why = problem or f"exit {code}; last lines of {log_path(stage)}:\n{tail(log_path(stage))}"
                        tqdm.write(f"FAILED {stage} ({why})")
        except KeyboardInterrupt:
            workers.interrupt()
            wait(running)
            raise
        finally:
            recorder.stop.set()
            recorder.join()  # the last batch: StageBook's exit (raises if the lock still cannot be written)
    return failed


def plan_after_validate(root: Path = Path(".")) -> Plan:
    """The plan, once a stale ``validate`` stage has run (here, recorded: ``Plan.ran_first``): it
    rewrites the stages' inputs manifests (:mod:`dmlbench.pipeline.manifests`) and only those that
    changed make their stages stale, so the plan (and on Slurm, what is submitted) holds the stages an
    edit touches. Also when a stale stage's manifest is missing (its name changed in ``dvc.yaml``
    while validate stayed up to date). A pipeline without ``validate`` is planned as it is."""
    plan = make_plan(root)
    if not plan.refresh_inputs:
        return plan
    if run_parallel(Plan([VALIDATE], {VALIDATE: set()}, plan.total, frozenset({VALIDATE})), 1, [], root=root):
        raise DmlbenchError(f"the {VALIDATE} stage failed (its log: {log_path(VALIDATE)})")
    return replace(make_plan(root), ran_first=(VALIDATE,))
