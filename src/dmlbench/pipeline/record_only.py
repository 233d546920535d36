"""Stages that only write a record: the ``tune@`` cells of a protocol that trains published values.

Such a stage writes ``best.yaml: hyperparameters: published`` in one Python start. It stays in
dvc.yaml because whether the grid searches is ``protocols.<protocol>.hyperparameters``, which
neither a DVC matrix nor ``train@``'s ``deps`` can read (docs/tuning.md). On Slurm each would be a
job with the tune kind's resources queued in front of the trainings that wait for it, so the Slurm
executor runs them here (:class:`HereStages`), from the job spec a job would run, and records them
like a completed job.
"""

from __future__ import annotations

import os
import signal
import subprocess
import time
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import IO, Any

from dmlbench.launch import worker_environment
from dmlbench.params.model import Params
from dmlbench.pipeline.record import run_job_spec

AT_ONCE = 2  # stages run here at the same time (each a Python start importing torch: ~3 s, ~0.4 GB)


def record_only_stages(params: Params, stages: Iterable[str]) -> frozenset[str]:
    """The ``tune@<dataset>-<backbone>-<loss>`` stages among ``stages`` that search nothing: those
    whose cell's protocol trains published values (the test ``tune_stage`` makes)."""
    wanted = set(stages)
    found: set[str] = set()
    for dataset in params.datasets:
        for backbone in params.backbones:
            if params.protocol.for_run(dataset, backbone).hyperparameters == "tuned":
                continue
            found.update(name for loss in params.losses if (name := f"tune@{dataset}-{backbone}-{loss}") in wanted)
    return frozenset(found)


def here_environment(job_variables: Mapping[str, str]) -> dict[str, str]:
    """The environment of a stage run here: this process's (its venv first on ``PATH``, one thread),
    without the variables of a Slurm job or GPU this process may run in, plus the variables every
    job exports (:func:`dmlbench.pipeline.slurm.job_environment`: offline, the tracking URI)."""
    env = worker_environment(1, **job_variables)
    return {key: value for key, value in env.items() if not key.startswith("SLURM_") and key != "CUDA_VISIBLE_DEVICES"}


class HereStages:
    """Stages this process runs itself, at most ``at_once`` at a time: each from its job spec
    (:func:`dmlbench.pipeline.record.run_job_spec`), in a session of its own, output to its log."""

    def __init__(self, env: Mapping[str, str], at_once: int = AT_ONCE) -> None:
        self.env, self.at_once = dict(env), at_once
        self.running: dict[str, tuple[subprocess.Popen[Any], IO[Any]]] = {}

    def has_room(self) -> bool:
        return len(self.running) < self.at_once

    def start(self, stage: str, spec: dict[str, Any], log: Path) -> None:
        handle = open(log, "w")  # noqa: SIM115 (closed when the stage ends)
        try:
            # started from a shell's background, SIGINT is inherited ignored: the interrupt must reach it
            inherited = signal.getsignal(signal.SIGINT) is signal.SIG_IGN
            process = run_job_spec(
                spec, self.env, stdout=handle, stderr=subprocess.STDOUT, start_new_session=True,
                preexec_fn=(lambda: signal.signal(signal.SIGINT, signal.SIG_DFL)) if inherited else None,
            )  # fmt: skip
        except BaseException:
            handle.close()
            raise
        self.running[stage] = (process, handle)

    def ended(self) -> list[tuple[str, int]]:
        """The stages that ended since the last call, with their exit codes."""
        done = []
        for stage, (process, handle) in list(self.running.items()):
            code = process.poll()
            if code is not None:
                handle.close()
                del self.running[stage]
                done.append((stage, code))
        return done

    def wait(self, seconds: float) -> None:
        """Sleep ``seconds``, or less: until a stage running here ends."""
        deadline = time.monotonic() + seconds
        while (left := deadline - time.monotonic()) > 0:
            if any(process.poll() is not None for process, _ in self.running.values()):
                return
            time.sleep(min(0.05, left) if self.running else left)

    def interrupt(self, grace: float = 30.0) -> list[str]:
        """Tell every running stage to stop (SIGINT to its process group), wait ``grace`` seconds,
        then kill what is left; the stages that were running."""
        stages = list(self.running)
        try:
            for process, _ in self.running.values():
                _signal_group(process, signal.SIGINT)
            deadline = time.monotonic() + grace
            for process, _ in self.running.values():
                try:
                    process.wait(max(0.0, deadline - time.monotonic()))
                except subprocess.TimeoutExpired:
                    pass
        finally:  # also on a second Ctrl-C while waiting
            for process, handle in self.running.values():
                if process.poll() is None:
                    _signal_group(process, signal.SIGKILL)
                    process.wait()
                handle.close()
            self.running.clear()
        return stages


def _signal_group(process: subprocess.Popen[Any], signum: int) -> None:
    try:
        os.killpg(process.pid, signum)
    except ProcessLookupError:
        pass
