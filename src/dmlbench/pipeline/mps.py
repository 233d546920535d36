"""CUDA MPS for the local executor's GPU slots (``--mps``, ``make repro GPUS=0 GPU_SLOTS=8 MPS=1``):
kernels of several processes on one GPU run side by side instead of time-sliced (measured in
docs/gpu.md, "Several trainings on one GPU").

:func:`mps_daemon` starts a control daemon of this user for the run (``nvidia-cuda-mps-control
-d``; no root needed in the GPU's default compute mode) with a pipe directory of its own, and
shuts it down (``quit``) when the run ends, also after a failure or an interrupt. It is started
without ``CUDA_VISIBLE_DEVICES``, so it sees the machine's numbering, which each worker's
``CUDA_VISIBLE_DEVICES`` uses (a server started with a subset renumbers its clients' devices:
NVIDIA's MPS documentation, section 4.2.1). Logs: ``artifacts/logs/mps/``.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path

from dmlbench.errors import DmlbenchError

MPS_CONTROL = "nvidia-cuda-mps-control"
PIPE_VARIABLE = "CUDA_MPS_PIPE_DIRECTORY"  # where clients find the daemon (a UNIX socket: keep it short)
LOG_VARIABLE = "CUDA_MPS_LOG_DIRECTORY"
START_SECONDS = 60.0  # `-d` forks the daemon and returns
QUIT_SECONDS = 60.0  # the daemon's shutdown waits for its server, which waits for its clients


def _last_line(text: str) -> str:
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    return lines[-1] if lines else "no output"


def mps_control(environ: Mapping[str, str] | None = None) -> str:
    """The path of ``nvidia-cuda-mps-control`` on ``PATH``; else :class:`DmlbenchError` in one line
    (checked before any stage runs)."""
    binary = shutil.which(MPS_CONTROL, path=(os.environ if environ is None else environ).get("PATH"))
    if binary is None:
        raise DmlbenchError(
            f"--mps: {MPS_CONTROL} is not on PATH (it comes with the NVIDIA driver's utilities); "
            "run without --mps (the GPU's trainings then take turns on it)"
        )
    return binary


@contextmanager
def mps_daemon(log_dir: Path, environ: Mapping[str, str] | None = None) -> Iterator[dict[str, str]]:
    """An MPS control daemon for the duration of the block; yields the variables a worker needs
    to use it (``CUDA_MPS_PIPE_DIRECTORY``, ``CUDA_MPS_LOG_DIRECTORY``). :class:`DmlbenchError` in
    one line when the daemon cannot start (nothing has run then)."""
    base = dict(os.environ if environ is None else environ)
    binary = mps_control(base)
    pipe = Path(tempfile.mkdtemp(prefix="dmlbench-mps-", dir="/tmp"))  # a UNIX socket's path: short
    log_dir = log_dir.resolve()
    log_dir.mkdir(parents=True, exist_ok=True)
    variables = {PIPE_VARIABLE: str(pipe), LOG_VARIABLE: str(log_dir)}
    env = {key: value for key, value in base.items() if key != "CUDA_VISIBLE_DEVICES"} | variables
    try:
        with open(log_dir / "start.log", "w") as output:  # not a pipe: the forked daemon could hold it open
            started = subprocess.run(
                [binary, "-d"], env=env, stdout=output, stderr=subprocess.STDOUT, timeout=START_SECONDS,
                start_new_session=True, check=False,  # no terminal's Ctrl-C or group signal reaches it
            )  # fmt: skip
        code = started.returncode
    except (subprocess.TimeoutExpired, KeyboardInterrupt) as exc:
        _stop_if_started(binary, env, pipe, log_dir)
        if isinstance(exc, KeyboardInterrupt):
            raise
        code = None
    if code != 0:
        if code is not None:
            shutil.rmtree(pipe, ignore_errors=True)  # nothing started (else `-d` would have said 0)
        said = _last_line((log_dir / "start.log").read_text(errors="replace"))
        why = f"exit {code}: {said}" if code is not None else f"no answer in {START_SECONDS:g} s"
        raise DmlbenchError(f"--mps: '{MPS_CONTROL} -d' failed ({why}); its logs: {log_dir}/")
    try:
        yield variables
    finally:
        _quit(binary, env, pipe, log_dir)


def _stop_if_started(binary: str, env: dict[str, str], pipe: Path, log_dir: Path) -> None:
    """After a start that did not answer: a daemon that got as far as its pipe directory is told to
    quit (:func:`_quit`), else the empty directory goes."""
    if any(pipe.iterdir()):
        _quit(binary, env, pipe, log_dir)
    else:
        shutil.rmtree(pipe, ignore_errors=True)


def _quit(binary: str, env: dict[str, str], pipe: Path, log_dir: Path) -> None:
    """``quit`` to the daemon; its pipe directory is removed only once it has quit, else kept and
    the command that stops it printed (a daemon nobody can reach would hold the GPU)."""
    try:
        stopped = subprocess.run(
            [binary], input="quit\n", env=env, capture_output=True, text=True, timeout=QUIT_SECONDS, check=False
        )
        problem = f"exit {stopped.returncode}" if stopped.returncode != 0 else ""
    except subprocess.TimeoutExpired:
        problem = f"no answer in {QUIT_SECONDS:g} s"
    except KeyboardInterrupt:
        _not_stopped("interrupted while it was stopping", pipe, log_dir)
        raise
    if problem:
        _not_stopped(problem, pipe, log_dir)
        return
    shutil.rmtree(pipe, ignore_errors=True)


def _not_stopped(problem: str, pipe: Path, log_dir: Path) -> None:
    print(
        f"warning: the MPS daemon did not quit ({problem}); stop it with: echo quit | "
        f"{PIPE_VARIABLE}={pipe} {MPS_CONTROL} (its logs: {log_dir}/)",
        file=sys.stderr,
    )
