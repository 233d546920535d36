"""One Slurm job: ``python -m dmlbench.pipeline.job <stage>`` runs that stage's command.

The job runs the spec written at submission (``artifacts/logs/specs/<stage>.json``:
:meth:`dmlbench.pipeline.record.StageBook.job_spec`) without DVC; the executor records the stage
once Slurm says it COMPLETED, so jobs never race for DVC's lock and an unfinished stage is never
recorded. The stage's lock (:mod:`dmlbench.pipeline.guard`) is taken first.

The command runs in its own process group. Slurm's warning signal (``USR1``,
``--signal=B:USR1@<s>``) and ``TERM`` (``scancel``) reach it as ``SIGINT`` (a training stops at its
last checkpoint, a study leaves its running trial to be re-run). After ``USR1`` the job requeues
itself (``scontrol requeue``) only while its checkpoint moved during this start
(:mod:`dmlbench.pipeline.checkpoints`; without a checkpoint: at most ``cluster.max_retries`` times,
by ``SLURM_RESTART_COUNT``), so a stage that cannot reach a checkpoint ends instead of looping.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

from dmlbench.launch import worker_environment
from dmlbench.pipeline.checkpoints import progress
from dmlbench.pipeline.guard import claim, stage_filename
from dmlbench.pipeline.record import run_job_spec


def job_environment() -> dict[str, str]:
    """This job's environment for its stage: this interpreter's ``bin/`` first on ``PATH`` (the
    stage commands call ``python``, also where Slurm passed no ``PATH``), as many BLAS/OpenMP
    threads as CPUs allocated (the local runner does the same per worker)."""
    cpus = os.environ.get("SLURM_CPUS_PER_TASK")
    threads = None if cpus is None or "OMP_NUM_THREADS" in os.environ else int(cpus)
    return worker_environment(threads)


SPEC_DIR = Path("artifacts/logs/specs")  # the executor's job specs, one per stage


def spec_path(stage: str, root: Path = Path(".")) -> Path:
    return root / SPEC_DIR / stage_filename(stage, ".json")


MAX_RETRIES_VARIABLE = "DMLBENCH_MAX_RETRIES"  # cluster.max_retries, in the jobs' environment file


def read_spec(stage: str) -> dict[str, Any]:
    path = spec_path(stage)
    if not path.exists():
        raise SystemExit(f"error: {stage}: no job spec at {path} (jobs are submitted by python -m dmlbench.pipeline)")
    return dict(json.loads(path.read_text()))


def start_stage(stage: str, env: dict[str, str], spec: dict[str, Any] | None = None,
                lock: int | None = None) -> subprocess.Popen:  # fmt: skip
    """Run one stage's command from its job spec, in its own process group (the one place that
    says how; the executor records it); ``lock``: the stage's lock, handed to its process."""
    return run_job_spec(
        spec if spec is not None else read_spec(stage),
        env,
        start_new_session=True,
        # a job started from a shell's background inherits SIGINT ignored, and Python then installs
        # no KeyboardInterrupt handler: the interrupt must reach the stage
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
        pass_fds=() if lock is None else (lock,),
    )


def may_requeue(spec: dict[str, Any], before: str | None) -> str:
    """Why this job must not requeue itself after Slurm's warning signal, or "" when it may: its
    checkpoint moved since it started (``before``: :func:`progress` then); a stage that keeps none,
    while Slurm restarted it fewer than ``cluster.max_retries`` times."""
    now = progress(spec)
    if now is None:
        limit = int(os.environ.get(MAX_RETRIES_VARIABLE, "3"))
        restarts = int(os.environ.get("SLURM_RESTART_COUNT", "0") or 0)
        return f"it keeps no checkpoint and was requeued {restarts} times (cluster.max_retries: {limit})" if (
            restarts >= limit) else ""  # fmt: skip
    return "" if now != before else "its checkpoint did not move during this start"


def main(stage: str) -> int:
    spec = read_spec(stage)
    lock = claim(
        stage,
        Path(spec["env"].get("DVC_ROOT", ".")),
        on_wait=lambda pid: print(
            f"{stage}: another copy of this stage is running{f' (pid {pid})' if pid else ''}: waiting for it",
            flush=True,
        ),
    )
    before = progress(spec)
    child = start_stage(stage, job_environment(), spec, lock)
    if lock is not None:
        os.close(lock)  # the stage's process holds it
    warned: list[int] = []

    def forward(signum: int, _frame: object) -> None:
        warned.append(signum)
        try:
            os.killpg(child.pid, signal.SIGINT)
        except ProcessLookupError:
            pass

    signal.signal(signal.SIGUSR1, forward)
    signal.signal(signal.SIGTERM, forward)
    code = child.wait()
    if code != 0 and signal.SIGUSR1 in warned and os.environ.get("SLURM_JOB_ID"):
        job_id = os.environ["SLURM_JOB_ID"]
        refused = may_requeue(spec, before)
        if refused:
            print(f"{stage}: Slurm's warning signal, and {refused}: not requeued; the job ends (give it more time: "
                  f"cluster.stages.{stage.split('@', 1)[0]}.time)", flush=True)  # fmt: skip
            return code or 1
        print(f"{stage}: Slurm's warning signal: stopped at the last checkpoint; requeueing job {job_id}", flush=True)
        requeued = subprocess.run(["scontrol", "requeue", job_id], check=False).returncode == 0
        if requeued:
            return 0  # Slurm runs it again; it is recorded when it finally completes
        print(f"{stage}: scontrol requeue {job_id} was refused: the job fails (run the pipeline again)", flush=True)
        return code or 1
    return code  # a stage that finished before the signal took effect completed


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
