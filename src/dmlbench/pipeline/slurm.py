"""Stale DVC stages as Slurm jobs: Slurm schedules them, its ``afterok`` dependencies order them.

Every stage the plan holds (:func:`dmlbench.pipeline.plan.make_plan`: the stale stages and what follows
them) becomes one ``sbatch`` job on the shared checkout, submitted in topological order with
``--dependency=afterok:<the jobs of its upstream stages>`` and ``--kill-on-invalid-dep=yes``, so
a failed job's dependents are cancelled by Slurm itself. Each job runs
``python -m dmlbench.pipeline.job <stage>`` (``dvc --wait-for-lock repro --single-item <stage>``:
DVC's own lock serialises the ``dvc.lock`` updates of jobs finishing together). The submitting
command then only watches the jobs (``squeue``, then ``sacct`` / ``scontrol``) to report: which
stage failed, its state and its log (``artifacts/logs/<stage>.log``), and which were cancelled
because of it. Re-running submits only what is still stale.
"""

from __future__ import annotations

import shlex
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from dmlbench.errors import DmlbenchError
from dmlbench.launch import resource_args, tunes_as_array
from dmlbench.params.cluster import ClusterConfig, StageResources, cluster_settings
from dmlbench.params.model import Params
from dmlbench.params.tuning import tuning_settings
from dmlbench.pipeline.local import LOG_DIR
from dmlbench.pipeline.plan import Plan, make_plan
from dmlbench.tracking.store import ensure_experiment

DONE = {"COMPLETED"}
FAILED = {"FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "OUT_OF_MEMORY", "BOOT_FAIL", "DEADLINE", "PREEMPTED"}


@dataclass(frozen=True)
class Job:
    stage: str
    job_id: str
    log: Path


def waiting_resources(config: ClusterConfig, stage: str) -> StageResources:
    """A job that only submits a worker array and waits for it: one CPU, no GPU, 2G, its kind's
    time (the array tasks get the kind's resources, :func:`dmlbench.launch.array_command`)."""
    return StageResources(cpus=1, gpus=0, mem="2G", time=config.resources(stage).time)


def sbatch_command(stage: str, config: ClusterConfig, after: list[str], log: Path, root: Path, python: str,
                   waits_for_array: bool = False) -> list[str]:  # fmt: skip
    """The ``sbatch`` command line of one stage's job (``after``: job ids it waits for;
    ``waits_for_array``: the job only waits for a worker array, :func:`waiting_resources`)."""
    res = waiting_resources(config, stage) if waits_for_array else config.resources(stage)
    command = [
        "sbatch", "--parsable", f"--job-name={stage}", f"--chdir={root}", f"--output={log}", "--open-mode=append",
        *resource_args(config, res),
    ]  # fmt: skip
    if after:
        command += [f"--dependency=afterok:{':'.join(after)}", "--kill-on-invalid-dep=yes"]
    command += list(config.extra_args)
    # exec: the batch shell becomes the wrapper, so Slurm's B:USR1 reaches it
    command.append(f"--wrap=exec {shlex.quote(python)} -m dmlbench.pipeline.job {shlex.quote(stage)}")
    return command


def require_slurm() -> None:
    """Refuse before submitting anything when this machine cannot reach a Slurm controller."""
    try:
        subprocess.run(["sinfo", "--noheader", "--format=%P"], check=True, capture_output=True, text=True, timeout=30)
    except FileNotFoundError:
        raise DmlbenchError(
            "--executor slurm: sbatch/sinfo not found on PATH (install Slurm's client, or `make cluster-up`)"
        ) from None
    except (subprocess.CalledProcessError, subprocess.TimeoutExpired) as exc:
        detail = getattr(exc, "stderr", "") or str(exc)
        raise DmlbenchError(f"--executor slurm: no Slurm controller answers sinfo ({detail.strip()})") from None


def submit(order: list[str], waits_for: dict[str, set[str]], config: ClusterConfig, root: Path, log_dir: Path,
           python: str = sys.executable, array_waiters: frozenset[str] = frozenset()) -> list[Job]:  # fmt: skip
    """Submit every stage of ``order`` (topological), each after its upstream stages' jobs;
    ``array_waiters``: stages whose job only waits for a worker array (small resources)."""
    log_dir.mkdir(parents=True, exist_ok=True)
    jobs: dict[str, Job] = {}
    for stage in order:
        log = (log_dir / (stage.replace("/", "_") + ".log")).resolve()
        log.write_text("")  # a fresh log per submission (a requeued job appends to it)
        after = [jobs[upstream].job_id for upstream in sorted(waits_for.get(stage, ())) if upstream in jobs]
        result = subprocess.run(
            sbatch_command(stage, config, after, log, root.resolve(), python, stage in array_waiters),
            check=False, capture_output=True, text=True,
        )  # fmt: skip
        if result.returncode != 0:
            cancel([job.job_id for job in jobs.values()])
            raise DmlbenchError(
                f"sbatch refused {stage}: {result.stderr.strip()} (its jobs submitted so far are cancelled)"
            )
        jobs[stage] = Job(stage, result.stdout.strip().split(";")[0], log)
    return list(jobs.values())


def cancel(job_ids: list[str]) -> None:
    if job_ids:
        subprocess.run(["scancel", *job_ids], check=False, capture_output=True)


def states(job_ids: list[str]) -> dict[str, str]:
    """Slurm's state of each job (``PENDING``, ``RUNNING``, ``COMPLETED``, ``FAILED``, ...): from
    ``squeue`` while it is queued or running, then from ``sacct`` (accounting) or, where accounting
    is off, ``scontrol show job`` (kept for MinJobAge seconds after the end)."""
    found: dict[str, str] = {}
    queued = subprocess.run(
        ["squeue", "--noheader", "--format=%i %T", f"--jobs={','.join(job_ids)}"],
        capture_output=True,
        text=True,
        check=False,
    )
    for line in queued.stdout.splitlines():
        job_id, state = line.split()[:2]
        found[job_id] = state
    rest = [j for j in job_ids if j not in found]
    if rest:
        finished = subprocess.run(
            ["sacct", "--noheader", "--parsable2", "--allocations", "--format=JobID,State", f"--jobs={','.join(rest)}"],
            capture_output=True, text=True, check=False,
        )  # fmt: skip
        for line in finished.stdout.splitlines():
            job_id, state = line.split("|")[:2]
            if job_id in rest:
                found[job_id] = state.split()[0]  # "CANCELLED by 0" -> CANCELLED
    for job_id in [j for j in job_ids if j not in found]:
        shown = subprocess.run(
            ["scontrol", "--oneliner", "show", "job", job_id], capture_output=True, text=True, check=False
        )
        fields = dict(part.split("=", 1) for part in shown.stdout.split() if "=" in part)
        if "JobState" in fields:
            found[job_id] = fields["JobState"]
    return found


def wait(jobs: list[Job], poll_seconds: float = 5.0, quiet: bool = False) -> dict[str, str]:
    """Watch until every job has ended; return each stage's final Slurm state. Reports each end."""
    by_id = {job.job_id: job for job in jobs}
    final: dict[str, str] = {}
    while len(final) < len(jobs):
        current = states([j for j in by_id if by_id[j].stage not in final])
        for job_id, state in current.items():
            stage = by_id[job_id].stage
            if stage not in final and (state in DONE or state in FAILED):
                final[stage] = state
                if not quiet:
                    print(f"{'done  ' if state in DONE else state:<9} {stage} (job {job_id})", flush=True)
        if len(final) < len(jobs):
            time.sleep(poll_seconds)
    return final


def failure_report(jobs: list[Job], final: dict[str, str], tail_lines: int = 15) -> str:
    """Which stages failed (state, log, last lines) and which Slurm cancelled because of them."""
    failed = [job for job in jobs if final.get(job.stage) in FAILED]
    lines = []
    first = [job for job in failed if final[job.stage] != "CANCELLED"] or failed
    for job in first:
        tail = "\n".join(
            line for line in job.log.read_text(errors="replace").splitlines()[-tail_lines:] if line.strip()
        )
        lines.append(f"stage {job.stage} {final[job.stage]} (job {job.job_id}); log: {job.log}\n{tail}")
    cancelled = [job.stage for job in failed if job not in first]
    if cancelled:
        lines.append(f"cancelled by Slurm as their dependencies failed: {', '.join(cancelled)}")
    return "\n".join(lines)


def run_on_slurm(params: Params) -> tuple[int, Plan]:
    """Submit the plan to Slurm, watch the jobs; 0 when every job completed, else 1 (reported)."""
    require_slurm()
    ensure_experiment(params.tracking.experiment)  # once, before the jobs fan out
    plan = make_plan()
    if not plan.order:
        return 0, plan
    # a tune@ job that runs its workers as an array only waits for them
    tuning = tuning_settings(params)
    arrays = tunes_as_array(tuning.workers, tuning.storage)
    waiters = frozenset(stage for stage in plan.order if arrays and stage.startswith("tune@"))
    jobs = submit(plan.order, plan.waits_for, cluster_settings(params), Path("."), LOG_DIR, array_waiters=waiters)
    print(f"{len(jobs)} stage(s) submitted to Slurm as jobs {jobs[0].job_id}..{jobs[-1].job_id} "
          f"(squeue --me to watch; logs in {LOG_DIR}/)", flush=True)  # fmt: skip
    final = wait(jobs)
    if all(state == "COMPLETED" for state in final.values()):
        return 0, plan
    print("error: " + failure_report(jobs, final), file=sys.stderr)
    return 1, plan
