"""A stand-in Slurm for tests: ``sbatch``, ``squeue``, ``sacct``, ``scancel`` and ``sinfo`` on PATH
(:func:`install`), keeping job states in files under one directory.

``sbatch`` records its arguments (``sbatch.jsonl``), the most jobs ever queued or running at once
(``max_in_flight``), and starts a detached runner that waits for the job's ``afterok`` jobs, then
runs its ``--wrap`` line with ``bash -c`` in ``--chdir``, output appended to ``--output``. Like
Slurm with ``SBATCH_EXPORT=NONE`` (``--export=NONE``), the job then gets no variable of the
submitting shell but ``HOME`` and a system ``PATH`` (plus ``SLURM_*``); with
``FAKE_SLURM_NETNS=1`` the job runs in a network namespace of its own (``unshare -n``: no
interface but a down loopback, so no route anywhere). ``sinfo --format=%n`` lists this machine as
the one node (the jobs run here), or the host names in ``FAKE_SLURM_NODES`` (comma-separated)."""

from __future__ import annotations

import fcntl
import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

ENDED = {"COMPLETED", "FAILED", "CANCELLED"}


def _state_dir() -> Path:
    return Path(os.environ["FAKE_SLURM_DIR"])


def _state(job: str) -> str:
    path = _state_dir() / "jobs" / job
    return path.read_text().strip() if path.exists() else "UNKNOWN"


def _set(job: str, state: str) -> None:
    path = _state_dir() / "jobs" / job
    tmp = path.with_suffix(".tmp")
    tmp.write_text(state)
    tmp.replace(path)


def _option(args: list[str], name: str) -> str | None:
    for arg in args:
        if arg.startswith(f"--{name}="):
            return arg.split("=", 1)[1]
    return None


def sbatch(args: list[str]) -> int:
    root = _state_dir()
    (root / "jobs").mkdir(parents=True, exist_ok=True)
    with open(root / "lock", "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        counter = root / "counter"
        job = str(int(counter.read_text()) + 1 if counter.exists() else 1)
        counter.write_text(job)
        in_flight = 1 + sum(1 for p in (root / "jobs").iterdir() if p.suffix == "" and _state(p.name) not in ENDED)
        top = root / "max_in_flight"
        top.write_text(str(max(in_flight, int(top.read_text()) if top.exists() else 0)))
        _set(job, "PENDING")
        with open(root / "sbatch.jsonl", "a") as record:
            record.write(json.dumps({"job": job, "args": args, "in_flight": in_flight}) + "\n")
    subprocess.Popen([sys.executable, __file__, "run", job, json.dumps(args)], start_new_session=True,
                     stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)  # fmt: skip
    print(job)
    return 0


def run(job: str, args: list[str]) -> int:
    dependency = _option(args, "dependency") or ""
    after = dependency.split(":")[1:] if dependency.startswith("afterok:") else []
    while True:
        if _state(job) == "CANCELLED":
            return 0
        states = [_state(a) for a in after]
        if any(s in {"FAILED", "CANCELLED"} for s in states):
            _set(job, "CANCELLED")
            return 0
        if all(s == "COMPLETED" for s in states):
            break
        time.sleep(0.1)
    _set(job, "RUNNING")
    env = {"HOME": os.environ.get("HOME", "/root"), "PATH": "/usr/bin:/bin", "SLURM_JOB_ID": job,
           "SLURM_CPUS_PER_TASK": (_option(args, "cpus-per-task") or "1")}  # fmt: skip
    command = ["bash", "-c", _option(args, "wrap") or "false"]
    if os.environ.get("FAKE_SLURM_NETNS") == "1":
        command = ["unshare", "-n", *command]
    with open(_option(args, "output") or os.devnull, "a") as log:
        code = subprocess.run(command, cwd=_option(args, "chdir"), env=env, stdout=log, stderr=subprocess.STDOUT,
                              check=False).returncode  # fmt: skip
    if _state(job) != "CANCELLED":
        _set(job, "COMPLETED" if code == 0 else "FAILED")
    return 0


def _jobs(args: list[str]) -> list[str]:
    listed = _option(args, "jobs") or ""
    return [j for j in listed.split(",") if j]


def main(argv: list[str]) -> int:
    command, args = Path(argv[0]).name, argv[1:]
    if command == "run":
        return run(args[0], json.loads(args[1]))
    if command == "sbatch":
        return sbatch(args)
    if command == "squeue":
        with open(_state_dir() / "squeue.calls", "a") as calls:
            calls.write(f"{time.time()}\n")
        for job in _jobs(args):
            if _state(job) in {"PENDING", "RUNNING"}:
                print(f"{job} {_state(job)}")
        return 0
    if command == "sacct":
        for job in _jobs(args):
            if _state(job) in ENDED:
                print(f"{job}|{_state(job)}")
        return 0
    if command == "scancel":
        for job in args:
            if _state(job) not in ENDED:
                _set(job, "CANCELLED")
        return 0
    if command == "sinfo" and "--format=%n" in args:  # the nodes' host names: this machine, or FAKE_SLURM_NODES
        nodes = os.environ.get("FAKE_SLURM_NODES") or socket.gethostname()
        print("\n".join(nodes.split(",")))
        return 0
    if command in {"sinfo", "scontrol"}:
        print("debug")
        return 0
    return 1


def install(bin_dir: Path, state_dir: Path) -> dict[str, str]:
    """The fake commands in ``bin_dir``; the variables that put them first on PATH."""
    bin_dir.mkdir(parents=True, exist_ok=True)
    for name in ("sbatch", "squeue", "sacct", "scancel", "sinfo", "scontrol"):
        script = bin_dir / name
        script.write_text(f"#!{sys.executable}\nimport sys\nsys.path.insert(0, {str(Path(__file__).parent)!r})\n"
                          f"from fake_slurm import main\nsys.exit(main([{name!r}, *sys.argv[1:]]))\n")  # fmt: skip
        script.chmod(0o755)
    state_dir.mkdir(parents=True, exist_ok=True)
    return {"FAKE_SLURM_DIR": str(state_dir), "PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}"}


def submitted(state_dir: Path) -> list[dict]:
    """Every ``sbatch`` call: ``{"job", "args", "in_flight"}``."""
    path = state_dir / "sbatch.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
