"""One Slurm job of a stage: its ``sbatch`` command line (:func:`sbatch_command`), and the names the
executor's modules share (:class:`Job`, :class:`Where`, :class:`Detached`)."""

from __future__ import annotations

import enum
import shlex
import sys
from dataclasses import dataclass
from pathlib import Path

from dmlbench.launch import job_script, resource_args
from dmlbench.params.cluster import ClusterConfig, StageResources


class Where(enum.Enum):
    """Where a stage of the plan runs."""

    SLURM = "slurm"  # a Slurm job (:attr:`Job.job_id`: its id)
    HERE = "here"  # this process runs it (:mod:`dmlbench.pipeline.record_only`): no job
    NOWHERE = "nowhere"  # never submitted: its upstream failed, its inputs came out the same, sbatch refused it


@dataclass(frozen=True)
class Job:
    """A started (or settled) stage of the plan: its Slurm job (``job_id``), or run here, or nowhere."""

    stage: str
    job_id: str  # Slurm's id; "" unless ``where`` is SLURM
    log: Path
    where: Where = Where.SLURM

    @classmethod
    def here(cls, stage: str, log: Path) -> Job:
        return cls(stage, "", log, Where.HERE)

    @classmethod
    def nowhere(cls, stage: str, log: Path) -> Job:
        return cls(stage, "", log, Where.NOWHERE)

    @property
    def in_slurm(self) -> bool:
        return self.where is Where.SLURM

    def describe(self) -> str:
        """``job 123``, ``run here`` or ``not submitted``."""
        return {Where.SLURM: f"job {self.job_id}", Where.HERE: "run here", Where.NOWHERE: "not submitted"}[self.where]


def say(line: str, error: bool = False) -> None:
    """Print one line (to stderr when ``error``); a terminal gone (SIGHUP) is no reason to stop."""
    try:
        print(line, file=sys.stderr if error else sys.stdout, flush=True)
    except OSError:
        pass


class Detached(Exception):  # noqa: N818 (an outcome, not an error)
    """The run stops watching; its jobs go on in Slurm (SIGTERM, SIGHUP, ``--detach``)."""


def waiting_resources(config: ClusterConfig, stage: str) -> StageResources:
    """A job that only submits a worker array and waits for it: one CPU, no GPU, 2G, its kind's
    time (the array tasks get the kind's resources, :func:`dmlbench.launch.array_command`)."""
    return StageResources(cpus=1, gpus=0, mem="2G", time=config.resources(stage).time)


def sbatch_command(stage: str, config: ClusterConfig, after: list[str], log: Path, root: Path, python: str,
                   waits_for_array: bool = False, env_file: Path | None = None) -> list[str]:  # fmt: skip
    """The ``sbatch`` command line of one stage's job (``after``: job ids it waits for;
    ``waits_for_array``: the job only waits for a worker array, :func:`waiting_resources`;
    ``env_file``: the variables the job exports, :func:`dmlbench.launch.job_script`)."""
    res = waiting_resources(config, stage) if waits_for_array else config.resources(stage)
    command = [
        "sbatch", "--parsable", f"--job-name={stage}", f"--chdir={root}", f"--output={log}", "--open-mode=append",
        *resource_args(config, res),
    ]  # fmt: skip
    if after:
        command += [f"--dependency=afterok:{':'.join(after)}", "--kill-on-invalid-dep=yes"]
    command += list(config.extra_args)
    # exec: the batch shell becomes the wrapper, so Slurm's B:USR1 reaches it
    wrapper = f"{shlex.quote(python)} -m dmlbench.pipeline.job {shlex.quote(stage)}"
    command.append(f"--wrap={job_script(wrapper, env_file, res.gpus)}")  # a GPU job: DMLBENCH_DEVICE=cuda
    return command
