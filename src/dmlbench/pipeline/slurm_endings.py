"""How each way a Slurm job ends, or never starts, is handled and told (one line each): retried
(:data:`RETRYABLE`, within ``cluster.max_retries`` and while its checkpoint moves), final with the
setting to raise (TIMEOUT, OUT_OF_MEMORY: :func:`ending_hint`), or pending for a reason that never
passes (:data:`NEVER`: said once, :func:`never_hint`). Behaviour: docs/cluster.md, "Endings".

Slurm's codes: https://slurm.schedmd.com/job_state_codes.html, https://slurm.schedmd.com/squeue.html
(JOB REASON CODES), https://slurm.schedmd.com/resource_limits.html.
"""

from __future__ import annotations

from dmlbench.params.cluster import ClusterConfig

UNCHANGED = "UNCHANGED"  # not run: only downstream of a re-run stage, whose outputs came out the same
DONE = {"COMPLETED", UNCHANGED}
RETRYABLE = {"PREEMPTED", "NODE_FAIL", "BOOT_FAIL"}
FAILED = {"FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "OUT_OF_MEMORY", "BOOT_FAIL", "DEADLINE", "PREEMPTED",
          "REVOKED"}  # fmt: skip
_TIME = ("PartitionTimeLimit", "QOSMaxWallDurationPerJobLimit", "AssocMaxWallDurationPerJobLimit")
_SIZE = (
    "PartitionNodeLimit", "QOSMaxCpuPerJobLimit", "QOSMaxGRESPerJob", "QOSMaxMemoryPerJob", "QOSMaxNodePerJobLimit",
    "AssocMaxCpuPerJobLimit", "AssocMaxMemPerJob", "AssocMaxNodesPerJobLimit", "AssocMaxGRESPerJob",
)  # fmt: skip
_HELD = ("JobHeldUser", "JobHeldAdmin")
_WRONG = ("InvalidAccount", "InvalidQOS", "PartitionDown", "PartitionInactive", "BadConstraints")
NEVER = frozenset((*_TIME, *_SIZE, *_HELD, *_WRONG))


def kind_of(stage: str) -> str:
    """A stage's kind, the key of ``cluster.stages`` (``train@glyphs-...`` -> ``train``)."""
    return stage.split("@", 1)[0]


def ending_hint(stage: str, state: str, config: ClusterConfig) -> str:
    """What to change for a job that ended ``state``: TIMEOUT and OUT_OF_MEMORY name the setting to
    raise and the value it had; empty for other endings."""
    kind, resources = kind_of(stage), config.resources(stage)
    if state == "TIMEOUT":
        return (f"{stage} reached its time limit, cluster.stages.{kind}.time = {resources.time}: raise it in "
                "params.yaml and run again (a training resumes from its checkpoint)")  # fmt: skip
    if state == "OUT_OF_MEMORY":
        return (f"{stage} ran out of memory, cluster.stages.{kind}.mem = {resources.mem}: raise it in params.yaml "
                "and run again")  # fmt: skip
    return ""


def never_hint(stage: str, job: str, reason: str, config: ClusterConfig) -> str | None:
    """One line for a job pending for a reason that never passes by itself; None for other reasons."""
    if reason not in NEVER:
        return None
    kind, resources = kind_of(stage), config.resources(stage)
    where = f"job {job} ({stage}) cannot start: {reason}"
    if reason in _TIME:
        what = (f"its time limit cluster.stages.{kind}.time = {resources.time} is above what the partition or QOS "
                "allows: lower it (a training resumes across jobs) or choose another partition")  # fmt: skip
    elif reason in _SIZE:
        what = (f"it asks more than one job may (cluster.stages.{kind}: cpus {resources.cpus}, mem {resources.mem}, "
                f"gpus {resources.gpus}): lower it or choose another partition/QOS")  # fmt: skip
    elif reason == "JobHeldUser":
        what = f"held by you: scontrol release {job}"
    elif reason == "JobHeldAdmin":
        what = "held by an administrator: ask them to release it"
    else:
        what = "check cluster.partition, account and qos"
    return f"{where}; {what}; the run waits for it (scancel {job} to give up on it)"
