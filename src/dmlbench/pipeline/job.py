"""One Slurm job: ``python -m dmlbench.pipeline.job <stage>`` runs that stage's command.

Who records: not the job. The executor on the login node wrote the stage's job spec at submission
(``artifacts/logs/specs/<stage>.json``: command, working directory, outputs to remove first:
:meth:`dmlbench.pipeline.record.StageBook.job_spec`); the job runs it without DVC, and the
executor records the stage in ``dvc.lock`` (hashes, cache, lock entry; in batches) once Slurm says
the job COMPLETED. So jobs ending out of order, or requeued (a requeued job runs the command again
from its checkpoint; it is recorded only when it finally completes), never race for DVC's lock, and
an unfinished stage is never recorded.

The command runs in its own process group. Slurm's warning signal (``USR1``, ``--signal=B:USR1@<s>``
before the time limit or a preemption) and ``TERM`` (``scancel``) reach that group as ``SIGINT``,
which Python raises as ``KeyboardInterrupt``: a training stops with its
last epoch checkpoint on disk, a tuning study leaves its running trial to be re-run (both
resume on the next run). After ``USR1`` the job requeues itself (``scontrol requeue``), so Slurm starts it again
later and it continues from the checkpoint; its dependents keep waiting for it.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
from pathlib import Path

from dmlbench.launch import worker_environment
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
    return root / SPEC_DIR / (re.sub(r"[^A-Za-z0-9_.@-]", "_", stage) + ".json")


def start_stage(stage: str, env: dict[str, str]) -> subprocess.Popen:
    """Run one stage's command from its job spec, in its own process group (the one place that
    says how; the executor records it)."""
    path = spec_path(stage)
    if not path.exists():
        raise SystemExit(f"error: {stage}: no job spec at {path} (jobs are submitted by python -m dmlbench.pipeline)")
    return run_job_spec(
        json.loads(path.read_text()),
        env,
        start_new_session=True,
        # a job started from a shell's background inherits SIGINT ignored, and Python then installs
        # no KeyboardInterrupt handler: the interrupt must reach the stage
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )


def main(stage: str) -> int:
    child = start_stage(stage, job_environment())
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
        print(f"{stage}: Slurm's warning signal: stopped at the last checkpoint; requeueing job {job_id}", flush=True)
        requeued = subprocess.run(["scontrol", "requeue", job_id], check=False).returncode == 0
        if requeued:
            return 0  # Slurm runs it again; it is recorded when it finally completes
        print(f"{stage}: scontrol requeue {job_id} was refused: the job fails (run the pipeline again)", flush=True)
        return code or 1
    return code  # a stage that finished before the signal took effect completed


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
