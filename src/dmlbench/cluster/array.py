"""A Slurm job array for the workers of one tuning study (``tune@`` with ``tuning.workers: N``).

The ``tune@`` stage's own job submits ``N`` array tasks (``sbatch --wait --array=0-<N-1>``),
each one worker on the shared study (an RDB storage, e.g. PostgreSQL), and returns when the
whole array has ended: the one kind of stage that spans several jobs. Each task gets the tune
stage kind's resources (``cluster.stages.tune``) and requeues on Slurm's warning signal like any
job; a trial a task leaves running is recovered by the workers' heartbeat check
(:func:`dmlbench.tune.study.recover_interrupted`).
"""

from __future__ import annotations

import os
import shlex
import subprocess
from pathlib import Path

from dmlbench.cluster.settings import ClusterConfig
from dmlbench.errors import DmlbenchError


def in_slurm_job() -> bool:
    return bool(os.environ.get("SLURM_JOB_ID"))


def tunes_as_array(workers: int, storage: str | None) -> bool:
    """Whether a ``tune@`` job on Slurm runs its workers as an array (several workers on a shared
    RDB study) and so only waits for them (the executor then gives it small resources)."""
    return workers > 1 and bool(storage)


def array_command(config: ClusterConfig, count: int, command: list[str], log: Path, name: str) -> list[str]:
    """``sbatch --wait --array``: ``command`` per task, ``{worker}`` replaced by the task index."""
    res = config.resources("tune")
    task = " ".join(shlex.quote(part) if part != "{worker}" else '"$SLURM_ARRAY_TASK_ID"' for part in command)
    args = [
        "sbatch", "--wait", "--parsable", f"--array=0-{count - 1}", f"--job-name={name}", f"--output={log}",
        f"--chdir={Path.cwd()}", f"--cpus-per-task={res.cpus}", f"--mem={res.mem}", f"--time={res.time}",
        f"--signal=B:USR1@{config.signal_seconds}", "--requeue" if config.requeue else "--no-requeue",
    ]  # fmt: skip
    if res.gpus:
        args.append(f"--gres={config.gres}:{res.gpus}")
    args += [f"--partition={config.partition}"] * bool(config.partition) + [f"--account={config.account}"] * bool(config.account)
    return [*args, *config.extra_args, f"--wrap=exec {task}"]


def run_array(config: ClusterConfig, count: int, command: list[str], log: Path, name: str) -> None:
    """Submit the array and wait for all its tasks; one line naming the log when any failed."""
    log.parent.mkdir(parents=True, exist_ok=True)
    print(f"{name}: {count} workers as a Slurm job array (log {str(log).replace('%a', '<task>')})", flush=True)
    result = subprocess.run(array_command(config, count, command, log, name), capture_output=True, text=True)
    if result.returncode != 0:
        raise DmlbenchError(
            f"{name}: the worker array {result.stdout.strip()} failed (exit {result.returncode}); "
            f"logs: {str(log).replace('%a', '<task>')} {result.stderr.strip()}"
        )
