"""Launching workers, the one place for it: the executors' stage processes and the tune stage's
trial workers, here as processes (:func:`run_local_workers`) or on Slurm as jobs and job arrays
(:func:`resource_args`, :func:`run_array`). It sits below both the tune stage and the runner, so
both use it and imports still run downward.
"""

from __future__ import annotations

import multiprocessing
import os
import shlex
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
from typing import Any

from dmlbench.errors import DmlbenchError
from dmlbench.params.cluster import ClusterConfig, StageResources

JOB_ENV_VARIABLE = "DMLBENCH_JOB_ENV"  # the environment file of a Slurm job (:func:`job_script`)
MAX_JOBS_VARIABLE = "DMLBENCH_MAX_JOBS"  # the executor's max_jobs, resolved (sacctmgr), for the arrays' %N


def threads_per_worker(workers: int, available: int | None = None) -> int:
    """Each of ``workers`` processes' share of ``available`` CPU threads (default: this process's
    ``OMP_NUM_THREADS``, else the CPU count), at least 1: oversubscription slows everything."""
    total = available or int(os.environ.get("OMP_NUM_THREADS", os.cpu_count() or 1))
    return max(1, total // workers)


def worker_environment(threads: int | None = None, gpu: str | None = None, **extra: str) -> dict[str, str]:
    """``os.environ`` for a worker: this interpreter's ``bin/`` first on ``PATH`` (stage commands
    call ``python``), ``threads`` BLAS/OpenMP threads (None: the libraries' default), and
    ``CUDA_VISIBLE_DEVICES=gpu`` when given."""
    path = os.pathsep.join([str(Path(sys.executable).parent), os.environ.get("PATH", "")])
    env = dict(os.environ, PATH=path, **extra)
    if threads is not None:
        env.update(OMP_NUM_THREADS=str(threads), MKL_NUM_THREADS=str(threads))
    if gpu is not None:
        env["CUDA_VISIBLE_DEVICES"] = gpu
    return env


def run_local_workers(target: Callable[..., Any], arguments: Sequence[tuple[Any, ...]]) -> list[Any]:
    """``target(*args)`` for each of ``arguments`` in its own spawned process, all at once; their
    results in order. The first failure is raised (the others are not waited on)."""
    context = multiprocessing.get_context("spawn")
    with ProcessPoolExecutor(len(arguments), mp_context=context) as pool:
        futures = [pool.submit(target, *args) for args in arguments]
        return [future.result() for future in futures]


def in_slurm_job() -> bool:
    return bool(os.environ.get("SLURM_JOB_ID"))


def tunes_as_array(workers: int, storage: str | None) -> bool:
    """Whether a ``tune@`` job on Slurm runs its workers as an array (several workers on a shared
    RDB study) and so only waits for them (the executor then gives it small resources)."""
    return workers > 1 and bool(storage)


def resource_args(config: ClusterConfig, resources: StageResources) -> list[str]:
    """The ``sbatch`` options of one job: CPUs, memory, time limit, Slurm's warning signal before it,
    requeue, GPUs, partition, account and QOS (https://slurm.schedmd.com/sbatch.html); partition,
    account and QOS are the job's kind's (:meth:`ClusterConfig.resources`), else the section's. A
    GPU share under ``gpu_slots`` is ``shares_per_gpu // gpu_slots`` of the site's shards or MPS
    units (a GPU with 8 shards and 4 slots: ``--gres=shard:2``); unknown: 1 shard, 100 MPS units per GPU."""
    args = [
        f"--cpus-per-task={resources.cpus}", f"--mem={resources.mem}", f"--time={resources.time}",
        f"--signal=B:USR1@{config.signal_seconds}", "--requeue" if config.requeue else "--no-requeue",
    ]  # fmt: skip
    if resources.gpus == 1 and config.gpu_slots > 1:  # one gpu_slots-th of a GPU, in the site's units
        default = 1 if config.shared_gres == "shard" else 100  # (what a site without a count says: sinfo)
        units = config.shares_per_gpu or default * (config.gpu_slots if config.shared_gres == "shard" else 1)
        args.append(f"--gres={config.shared_gres}:{max(1, units // config.gpu_slots)}")
    elif resources.gpus:
        args.append(f"--gres={config.gres}:{resources.gpus}")
    for option in ("partition", "account", "qos"):
        value = getattr(resources, option) or getattr(config, option)
        if value:
            args.append(f"--{option}={value}")
    return args


def job_script(command: str, env_file: Path | None = None, gpus: int | None = 0) -> str:
    """The shell line a Slurm job runs (``sbatch --wrap``): this interpreter's ``bin/`` first on
    ``PATH`` (``python stages/...`` in dvc.yaml finds the venv), the variables of ``env_file``
    (:func:`write_job_environment`) exported when it exists, then ``exec command``. It needs nothing
    of the submitting shell's environment, so jobs run the same under ``SBATCH_EXPORT=NONE``
    (``--export=NONE``, https://slurm.schedmd.com/sbatch.html#OPT_export). A job that asked for
    ``gpus`` runs with ``DMLBENCH_DEVICE=cuda`` (unless the run said ``cpu``, knowingly): its stage
    refuses in one line where it finds no usable GPU (:func:`dmlbench.devices.default_device`)
    instead of training on the CPU."""
    prelude = [f'export PATH={shlex.quote(str(Path(sys.executable).parent))}:"$PATH"']
    if env_file is not None:
        quoted = shlex.quote(str(env_file))
        prelude.append(f"if [ -r {quoted} ]; then set -a; . {quoted}; set +a; fi")
    if gpus:
        prelude.append('export DMLBENCH_DEVICE="${DMLBENCH_DEVICE:-cuda}"')
    return "; ".join([*prelude, f"exec {command}"])


def write_job_environment(path: Path, env: dict[str, str]) -> Path:
    """``env`` as a shell file (``NAME='value'`` lines) readable by its owner only (it may hold
    ``MLFLOW_TRACKING_PASSWORD``), for :func:`job_script` to export in every job."""
    path.parent.mkdir(parents=True, exist_ok=True)
    text = "".join(f"{name}={shlex.quote(value)}\n" for name, value in sorted(env.items()))
    descriptor = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(descriptor, "w") as handle:
        handle.write(text)
    path.chmod(0o600)
    return path


def array_command(config: ClusterConfig, count: int, command: list[str], log: Path, name: str,
                  env_file: Path | None = None) -> list[str]:  # fmt: skip
    """``sbatch --wait --array``: ``command`` per task, ``{worker}`` replaced by the task index; at
    most ``cluster.max_jobs`` tasks at once (``--array=0-<N-1>%<max_jobs>``); each task sets its own
    environment (:func:`job_script`)."""
    task = " ".join(shlex.quote(part) if part != "{worker}" else '"$SLURM_ARRAY_TASK_ID"' for part in command)
    most = config.max_jobs or int(os.environ.get(MAX_JOBS_VARIABLE, "0") or 0)  # (the executor's, resolved)
    limit = f"%{min(most, count)}" if most else ""
    return [
        "sbatch", "--wait", "--parsable", f"--array=0-{count - 1}{limit}", f"--job-name={name}", f"--output={log}",
        f"--chdir={Path.cwd()}", *resource_args(config, config.resources("tune")), *config.extra_args,
        f"--wrap={job_script(task, env_file, config.resources('tune').gpus)}",
    ]  # fmt: skip


def _array_of(name: str) -> str | None:
    """The id of this user's array ``name`` still queued or running in this directory (one an
    earlier start of the same tune job submitted before it was requeued), else None."""
    try:
        shown = subprocess.run(["squeue", "--me", "--noheader", f"--name={name}", "--format=%F|%Z"],
                               capture_output=True, text=True, check=False, timeout=60)  # fmt: skip
    except (OSError, subprocess.TimeoutExpired):
        return None
    here = os.path.realpath(Path.cwd())
    found = {line.split("|")[0] for line in shown.stdout.splitlines() if line.endswith(f"|{here}")}
    return min(found, key=int) if found and all(job.isdigit() for job in found) else None


def _wait_for_array(job: str, poll: float = 30.0) -> int:
    """Wait until array ``job`` left the queue; 0 when every task COMPLETED (``sacct``), else 1."""
    while subprocess.run(["squeue", "--noheader", f"--jobs={job}", "--format=%i"], capture_output=True, text=True,
                         check=False).stdout.strip():  # fmt: skip
        time.sleep(poll)
    ended = subprocess.run(["sacct", "--noheader", "--parsable2", "--allocations", f"--jobs={job}",
                            "--format=JobID,State"], capture_output=True, text=True, check=False)  # fmt: skip
    states = {line.split("|")[1].split()[0] for line in ended.stdout.splitlines() if "|" in line and line.split("|")[1]}
    return 0 if states == {"COMPLETED"} else 1


def run_array(config: ClusterConfig, count: int, command: list[str], log: Path, name: str) -> None:
    """Submit the array and wait for all its tasks; one line naming the log when any failed. The
    tasks read the environment file the executor wrote for its jobs (``DMLBENCH_JOB_ENV``). A tune
    job started again (requeued, preempted) whose array still runs waits for that array instead
    of submitting a second one; a tune job stopped (``scancel``, the run's Ctrl-C) cancels its array."""
    log.parent.mkdir(parents=True, exist_ok=True)
    where = str(log).replace("%a", "<task>")
    earlier = _array_of(name)
    if earlier is not None:
        print(f"{name}: its worker array {earlier} still runs (from before this job was started again): waiting for it",
              flush=True)  # fmt: skip
        code, said = _cancelled_with(name, lambda: (_wait_for_array(earlier), earlier))
    else:
        print(f"{name}: {count} workers as a Slurm job array (log {where})", flush=True)
        env_file = os.environ.get(JOB_ENV_VARIABLE)
        argv = array_command(config, count, command, log, name, Path(env_file) if env_file else None)

        def submit() -> tuple[int, str]:
            result = subprocess.run(argv, capture_output=True, text=True, check=False)
            return result.returncode, f"{result.stdout.strip()}{' ' + result.stderr.strip() if result.stderr else ''}"

        code, said = _cancelled_with(name, submit)
    if code != 0:
        raise DmlbenchError(f"{name}: the worker array {said} failed (exit {code}); logs: {where}")


def _cancelled_with(name: str, wait: Callable[[], tuple[int, str]]) -> tuple[int, str]:
    """``wait()``, the array ``name`` cancelled if this process is stopped meanwhile (SIGINT, which the
    job wrapper passes on for ``scancel``'s SIGTERM): no array outlives its tune job."""
    try:
        return wait()
    except KeyboardInterrupt:
        subprocess.run(["scancel", "--me", f"--name={name}"], capture_output=True, check=False)
        raise
