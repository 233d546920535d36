"""One Slurm job: ``python -m dmlbench.pipeline.job <stage>`` runs ``dvc repro`` of that stage.

The stage runs in its own process group (``dvc --wait-for-lock repro --single-item <stage>``).
Slurm's warning signal (``USR1``, ``--signal=B:USR1@<s>`` before the time limit or a preemption)
and ``TERM`` (``scancel``) reach that group as ``SIGINT``, the interrupt DVC cleans up after
(its stage lock released) and Python raises as ``KeyboardInterrupt``: a training stops with its
last epoch checkpoint on disk, a tuning study leaves its running trial to be re-run (both
resume on the next run). After ``USR1`` the job requeues itself (``scontrol requeue``), so Slurm starts it again
later and it continues from the checkpoint; its dependents keep waiting for it.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys


def main(stage: str) -> int:
    env = dict(os.environ)
    cpus = env.get("SLURM_CPUS_PER_TASK")
    if cpus:  # as many threads as CPUs allocated (the local runner does the same per worker)
        env.setdefault("OMP_NUM_THREADS", cpus)
        env.setdefault("MKL_NUM_THREADS", cpus)
    child = subprocess.Popen(
        [sys.executable, "-m", "dvc", "--wait-for-lock", "repro", "--single-item", stage],
        start_new_session=True,
        env=env,
        # a job started from a shell's background inherits SIGINT ignored, and Python then installs
        # no KeyboardInterrupt handler: the interrupt must reach DVC and the stage
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )
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
    if signal.SIGUSR1 in warned and os.environ.get("SLURM_JOB_ID"):
        print(
            f"{stage}: Slurm's warning signal: stopped at the last checkpoint; requeueing job "
            f"{os.environ['SLURM_JOB_ID']}",
            flush=True,
        )
        subprocess.run(["scontrol", "requeue", os.environ["SLURM_JOB_ID"]], check=False)
        return 0
    return code


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
