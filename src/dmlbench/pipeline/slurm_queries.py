"""What the Slurm executor asks Slurm (``squeue``, ``sacct``, ``scontrol``, ``sbatch``, ``sacctmgr``,
``sinfo``), and how it reads the answers.

Job states and reasons: https://slurm.schedmd.com/job_state_codes.html,
https://slurm.schedmd.com/resource_limits.html (the ``squeue`` reason codes).
"""

from __future__ import annotations

import getpass
import os
import re
import subprocess
from dataclasses import dataclass
from datetime import datetime

from dmlbench.gres import gres_counts, per_gpu

SBATCH_SECONDS = 120.0  # a controller that does not answer sbatch in this time: a refusal (tried again)
# states in which Slurm still holds the job (it may start, run or be requeued); the rest are endings
IN_QUEUE = {
    "PENDING", "RUNNING", "REQUEUED", "REQUEUE_FED", "REQUEUE_HOLD", "RESIZING", "SUSPENDED", "CONFIGURING",
    "COMPLETING", "SIGNALING", "STAGE_OUT", "STOPPED", "RESV_DEL_HOLD", "SPECIAL_EXIT",
}  # fmt: skip
# refusals that no retry cures (the request is wrong for this cluster)
_PERMANENT = re.compile(
    r"invalid (account|partition|qos|generic resource|feature|time limit|constraint)|requested node configuration is "
    r"not available|memory specification can not be satisfied|unrecognized option|invalid option|no partition "
    r"specified|not a valid|access/permission denied|user's group not permitted",
    re.IGNORECASE,
)


@dataclass(frozen=True)
class JobState:
    """A job's state as Slurm reports it: ``queued`` while Slurm holds it (:data:`IN_QUEUE`),
    ``reason`` why a pending job waits (``squeue``'s ``%r``)."""

    state: str
    reason: str = ""
    queued: bool = False


@dataclass(frozen=True)
class Submitted:
    """One ``sbatch``: the job id, or Slurm's reason for refusing it and whether a retry can help."""

    job: str | None
    reason: str = ""
    permanent: bool = False
    unsure: bool = False  # no answer: the job may have been submitted all the same


def _run(argv: list[str], timeout: float = 60.0) -> subprocess.CompletedProcess[str] | None:
    try:
        return subprocess.run(argv, capture_output=True, text=True, check=False, timeout=timeout)
    except (OSError, subprocess.TimeoutExpired):
        return None


def poll(job_ids: list[str]) -> dict[str, JobState]:
    """Each job's state: from ``squeue`` while Slurm holds it, then from ``sacct`` (accounting) or,
    where accounting is off, ``scontrol show job`` (kept for MinJobAge seconds after the end). A job
    none of them knows (a controller that did not answer) is left out: asked again next time."""
    found: dict[str, JobState] = {}
    if not job_ids:
        return found
    queued = _run(["squeue", "--noheader", "--format=%i %T %r", f"--jobs={','.join(job_ids)}"])
    for line in queued.stdout.splitlines() if queued is not None else []:
        parts = line.split(None, 2)
        if len(parts) >= 2:
            state = parts[1]
            found[parts[0]] = JobState(state, parts[2].strip() if len(parts) > 2 else "", state in IN_QUEUE)
    rest = [j for j in job_ids if j not in found or not found[j].queued]
    if rest:
        ended = _run(["sacct", "--noheader", "--parsable2", "--allocations", "--format=JobID,State",
                      f"--jobs={','.join(rest)}"])  # fmt: skip
        for line in ended.stdout.splitlines() if ended is not None else []:
            job_id, state = (line.split("|") + [""])[:2]
            if job_id in rest and state:
                state = state.split()[0]  # "CANCELLED by 0" -> CANCELLED
                found[job_id] = JobState(state, "", state in IN_QUEUE)
    for job_id in [j for j in job_ids if j not in found]:
        shown = _run(["scontrol", "--oneliner", "show", "job", job_id])
        fields = dict(part.split("=", 1) for part in (shown.stdout if shown else "").split() if "=" in part)
        if "JobState" in fields:
            found[job_id] = JobState(fields["JobState"], fields.get("Reason", ""), fields["JobState"] in IN_QUEUE)
    return found


def states(job_ids: list[str]) -> dict[str, str]:
    """Slurm's state of each job (``PENDING``, ``RUNNING``, ``COMPLETED``, ``FAILED``, ...)."""
    return {job_id: found.state for job_id, found in poll(job_ids).items()}


def cancel(job_ids: list[str]) -> None:
    if job_ids:
        _run(["scancel", *job_ids])


def sbatch(command: list[str]) -> Submitted:
    """Run one ``sbatch --parsable`` command line (:func:`dmlbench.pipeline.slurm.sbatch_command`)."""
    try:
        result = subprocess.run(command, capture_output=True, text=True, check=False, timeout=SBATCH_SECONDS)
    except subprocess.TimeoutExpired:
        return Submitted(None, f"sbatch did not answer in {SBATCH_SECONDS:g} s", unsure=True)
    if result.returncode == 0 and result.stdout.strip():
        return Submitted(result.stdout.strip().split(";")[0])
    said = [line for line in result.stderr.splitlines() if line.strip()] or [f"exit {result.returncode}"]
    reason = re.sub(r"^sbatch: error: (Batch job submission failed: )?", "", said[-1].strip())
    unsure = bool(re.search(r"timed out|zero bytes were transmitted", reason, re.IGNORECASE))
    return Submitted(None, reason, permanent=bool(_PERMANENT.search(reason)), unsure=unsure)


def _timestamp(text: str) -> float | None:
    try:
        return float(text)
    except ValueError:
        pass
    try:
        return datetime.fromisoformat(text).timestamp()
    except ValueError:
        return None


def find_jobs(name: str, workdir: str, since: float) -> list[tuple[str, str]]:
    """``(job id, state)`` of this user's jobs named ``name`` working in ``workdir`` and submitted at
    ``since`` or later (a minute of clock skew allowed): queued ones from ``squeue``, ended ones from
    ``sacct``. Empty when Slurm does not say."""
    found: dict[str, str] = {}
    queued = _run(["squeue", "--me", "--noheader", f"--name={name}", "--format=%i|%T|%Z|%V"])
    for line in queued.stdout.splitlines() if queued is not None else []:
        parts = line.split("|")
        moment = _timestamp(parts[3]) if len(parts) == 4 else None
        if len(parts) == 4 and os.path.realpath(parts[2]) == workdir and (moment is None or moment >= since - 60):
            found[parts[0]] = parts[1]
    start = datetime.fromtimestamp(since - 60).strftime("%Y-%m-%dT%H:%M:%S")
    ended = _run(["sacct", "--noheader", "--parsable2", "--allocations", f"--name={name}", f"--starttime={start}",
                  "--format=JobID,State,WorkDir"])  # fmt: skip
    for line in ended.stdout.splitlines() if ended is not None else []:
        parts = line.split("|")
        if len(parts) == 3 and os.path.realpath(parts[2]) == workdir and parts[0] not in found:
            found[parts[0]] = parts[1].split()[0] if parts[1] else ""
    return sorted(found.items(), key=lambda item: int(item[0]) if item[0].isdigit() else 0)


def site_max_jobs(qos: str | None = None) -> int | None:
    """The most jobs this user may still queue, as ``sacctmgr`` says: the smallest ``MaxSubmitJobs`` of
    the user's associations and ``MaxSubmitJobsPerUser`` of the QOS the jobs run under (``qos``, else
    the association's default), less the jobs queued now; None when it does not answer or sets none."""
    user = os.environ.get("USER") or getpass.getuser()
    limits: list[int] = []
    shown = _run(["sacctmgr", "--noheader", "--parsable2", "show", "assoc", f"user={user}",
                  "format=MaxSubmitJobs,DefaultQOS"], timeout=30)  # fmt: skip
    if shown is None or shown.returncode != 0:
        return None
    defaults = set()
    for line in shown.stdout.splitlines():
        limit, default = (line.split("|") + [""])[:2]
        limits += [int(limit)] if limit.strip().isdigit() else []
        defaults |= {default.strip()} if default.strip() else set()
    for name in [qos] if qos else sorted(defaults):
        per_qos = _run(["sacctmgr", "--noheader", "--parsable2", "show", "qos", name, "format=MaxSubmitJobsPerUser"],
                       timeout=30)  # fmt: skip
        for line in per_qos.stdout.splitlines() if per_qos is not None and per_qos.returncode == 0 else []:
            value = line.split("|")[0].strip()
            limits += [int(value)] if value.isdigit() else []
    if not limits:
        return None
    queued = _run(["squeue", "--me", "--noheader", "--format=%i"])
    mine = len(queued.stdout.split()) if queued is not None and queued.returncode == 0 else 0
    return max(1, min(limits) - mine)


def gres_per_gpu(name: str, partition: str | None = None) -> int | None:
    """The site's count of gres ``name`` (``shard``, ``mps``) per GPU, the smallest over its nodes
    (``sinfo --format=%G``: ``gpu:a100:4(S:0-1),shard:a100:32(S:0-1)`` -> 8; :mod:`dmlbench.gres`);
    None when no node says."""
    argv = ["sinfo", "--noheader", "--format=%G", *([f"--partition={partition}"] if partition else [])]
    shown = _run(argv, timeout=30)
    lines = shown.stdout.splitlines() if shown is not None and shown.returncode == 0 else []
    found = [count for count in (per_gpu(gres_counts(line), name) for line in lines) if count is not None]
    return min(found) if found and min(found) > 0 else None
