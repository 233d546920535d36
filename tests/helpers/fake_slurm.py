"""A stand-in Slurm for tests: ``sbatch``, ``squeue``, ``sacct``, ``scancel``, ``scontrol``, ``sinfo``
and ``sacctmgr`` on PATH (:func:`install`), keeping job states in files under one directory.

``sbatch`` records its arguments (``sbatch.jsonl``), the most jobs ever queued or running at once
(``max_in_flight``), and starts a detached runner that waits for the job's ``afterok`` jobs, then
runs its ``--wrap`` line with ``bash -c`` in ``--chdir``, output appended to ``--output``. Like
Slurm with ``SBATCH_EXPORT=NONE`` (``--export=NONE``), the job then gets no variable of the
submitting shell but ``HOME`` and a system ``PATH`` (plus ``SLURM_*``); with
``FAKE_SLURM_NETNS=1`` the job runs in a network namespace of its own (``unshare -n``: no
interface but a down loopback, so no route anywhere). ``sinfo --format=%n`` lists this machine as
the one node (the jobs run here), or the host names in ``FAKE_SLURM_NODES`` (comma-separated). The
runners are detached: jobs outlive whoever submitted them, as on a cluster.

Faults are injected with :func:`inject` (``inject.json``), each rule used up once matched:

* ``{"refuse": n, "message": m}``: the next ``n`` ``sbatch`` calls fail as Slurm's do
  (``sbatch: error: Batch job submission failed: m``, exit 1);
* ``{"name": stage, "state": S, "after": s}``: the next job of that name is ended ``s`` seconds
  after it started (or, with ``"when": path``, once that file exists in its working directory; its
  command killed with SIGTERM, as Slurm does) in state ``S``: ``PREEMPTED``, ``NODE_FAIL``,
  ``BOOT_FAIL``, ``TIMEOUT``, ``OUT_OF_MEMORY``; or ``REQUEUED``: put back in the queue and started
  again under the same id (an administrator's ``scontrol requeue``);
* ``{"name": stage, "reason": R, "seconds": s}``: the next job of that name stays PENDING with
  reason ``R`` for ``s`` seconds (``JobHeldUser``, ``PartitionTimeLimit``, ...).

``sacctmgr`` prints ``sacctmgr.txt`` when it exists (else fails, as where accounting is off).
Every start of a job's command is noted in ``started.jsonl`` (a requeued job starts again)."""

from __future__ import annotations

import fcntl
import fnmatch
import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

ENDED = {"COMPLETED", "FAILED", "CANCELLED", "PREEMPTED", "NODE_FAIL", "BOOT_FAIL", "TIMEOUT", "OUT_OF_MEMORY"}
FAILED_DEPENDENCY = ENDED - {"COMPLETED"}


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


def _info(job: str) -> dict:
    path = _state_dir() / "jobs" / f"{job}.json"
    return json.loads(path.read_text()) if path.exists() else {}


def _set_info(job: str, **fields: object) -> None:
    path = _state_dir() / "jobs" / f"{job}.json"
    tmp = path.with_suffix(".json.tmp")
    tmp.write_text(json.dumps({**_info(job), **fields}))
    tmp.replace(path)


def _option(args: list[str], name: str) -> str | None:
    for arg in args:
        if arg.startswith(f"--{name}="):
            return arg.split("=", 1)[1]
    return None


def _locked():
    root = _state_dir()
    root.mkdir(parents=True, exist_ok=True)
    handle = open(root / "lock", "a")  # noqa: SIM115 (closed by the caller's with)
    fcntl.flock(handle, fcntl.LOCK_EX)
    return handle


def inject(state_dir: Path, *rules: dict) -> None:
    """Add fault rules (see the module doc)."""
    path = state_dir / "inject.json"
    state_dir.mkdir(parents=True, exist_ok=True)
    present = json.loads(path.read_text()) if path.exists() else []
    path.write_text(json.dumps([*present, *rules]))


def _take_rule(match) -> dict | None:
    """The first injected rule ``match`` accepts, used up (a refusal counts down)."""
    with _locked():
        path = _state_dir() / "inject.json"
        rules = json.loads(path.read_text()) if path.exists() else []
        for index, rule in enumerate(rules):
            if match(rule):
                if rule.get("refuse", 1) > 1:
                    rules[index] = {**rule, "refuse": rule["refuse"] - 1}
                else:
                    del rules[index]
                path.write_text(json.dumps(rules))
                return rule
    return None


def sbatch(args: list[str]) -> int:
    refusal = _take_rule(lambda rule: "refuse" in rule)
    if refusal is not None:
        with open(_state_dir() / "refused.jsonl", "a") as record:
            record.write(json.dumps({"args": args}) + "\n")
        print(f"sbatch: error: Batch job submission failed: {refusal.get('message', 'Socket timed out')}",
              file=sys.stderr)  # fmt: skip
        return 1
    root = _state_dir()
    (root / "jobs").mkdir(parents=True, exist_ok=True)
    with _locked():
        counter = root / "counter"
        job = str(int(counter.read_text()) + 1 if counter.exists() else 1)
        counter.write_text(job)
        in_flight = 1 + sum(1 for p in (root / "jobs").iterdir() if p.suffix == "" and _state(p.name) not in ENDED)
        top = root / "max_in_flight"
        top.write_text(str(max(in_flight, int(top.read_text()) if top.exists() else 0)))
        _set(job, "PENDING")
        name = _option(args, "job-name") or "wrap"
        _set_info(job, name=name, workdir=_option(args, "chdir") or os.getcwd(), submit=time.time(), reason="None")
        with open(root / "sbatch.jsonl", "a") as record:
            record.write(json.dumps({"job": job, "args": args, "in_flight": in_flight}) + "\n")
    subprocess.Popen([sys.executable, __file__, "run", job, json.dumps(args)], start_new_session=True,
                     stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)  # fmt: skip
    print(job)
    return 0


def _wait_to_start(job: str, after: list[str], held: dict | None) -> bool:
    """Wait for the job's dependencies (and an injected pending reason); False when it ends unstarted."""
    release = time.time() + held["seconds"] if held else 0.0
    if held:
        _set_info(job, reason=held["reason"])
    while True:
        if _state(job) == "CANCELLED":
            return False
        states = [_state(a) for a in after]
        if any(s in FAILED_DEPENDENCY for s in states):
            _set(job, "CANCELLED")
            _set_info(job, reason="DependencyNeverSatisfied")
            return False
        if time.time() >= release and all(s == "COMPLETED" for s in states):
            _set_info(job, reason="None")
            return True
        if not held or time.time() >= release:
            _set_info(job, reason="Dependency" if after else "None")
        time.sleep(0.1)


def _wait(process: subprocess.Popen, fault: dict | None, workdir: Path) -> int:
    """The command's exit code; TimeoutExpired when ``fault`` strikes first (its time, or its file)."""
    if fault is None:
        return process.wait()
    deadline = time.monotonic() + fault.get("after", 3600)
    while time.monotonic() < deadline and not ("when" in fault and (workdir / fault["when"]).exists()):
        code = process.poll()
        if code is not None:
            return code
        time.sleep(0.05)
    raise subprocess.TimeoutExpired(process.args, 0)


def run(job: str, args: list[str]) -> int:
    dependency = _option(args, "dependency") or ""
    after = dependency.split(":")[1:] if dependency.startswith("afterok:") else []
    name = _info(job).get("name", "")
    held = _take_rule(lambda rule: "reason" in rule and fnmatch.fnmatch(name, rule["name"]))
    restarts = 0
    while True:
        if not _wait_to_start(job, after, held):
            return 0
        held = None
        fault = _take_rule(lambda rule: "state" in rule and fnmatch.fnmatch(name, rule["name"]))
        _set(job, "RUNNING")
        with _locked(), open(_state_dir() / "started.jsonl", "a") as record:
            record.write(json.dumps({"job": job, "name": name, "at": time.time()}) + "\n")
        env = {"HOME": os.environ.get("HOME", "/root"), "PATH": "/usr/bin:/bin", "SLURM_JOB_ID": job,
               "SLURM_CPUS_PER_TASK": (_option(args, "cpus-per-task") or "1"),
               "SLURM_RESTART_COUNT": str(restarts)}  # fmt: skip
        command = ["bash", "-c", _option(args, "wrap") or "false"]
        if os.environ.get("FAKE_SLURM_NETNS") == "1":
            command = ["unshare", "-n", *command]
        with open(_option(args, "output") or os.devnull, "a") as log:
            process = subprocess.Popen(command, cwd=_option(args, "chdir"), env=env, stdout=log,
                                       stderr=subprocess.STDOUT, start_new_session=True)  # fmt: skip
            try:
                code = _wait(process, fault, Path(_option(args, "chdir") or "."))
                fault = None  # it ended first
            except subprocess.TimeoutExpired:
                os.killpg(process.pid, signal.SIGTERM)
                try:
                    code = process.wait(timeout=30)
                except subprocess.TimeoutExpired:
                    os.killpg(process.pid, signal.SIGKILL)
                    code = process.wait()
        if _state(job) == "CANCELLED":
            return 0
        if fault is not None and fault["state"] == "REQUEUED":
            _set(job, "PENDING")
            restarts += 1
            continue
        _set(job, fault["state"] if fault is not None else "COMPLETED" if code == 0 else "FAILED")
        return 0


def _jobs(args: list[str]) -> list[str]:
    listed = _option(args, "jobs") or ""
    return [j for j in listed.split(",") if j]


def _selected(args: list[str]) -> list[str]:
    """The jobs named by ``--jobs``, or else by ``--name`` (all of this stand-in's jobs match ``--me``)."""
    listed = _jobs(args)
    if listed:
        return listed
    names = (_option(args, "name") or "").split(",")
    jobs = sorted((p.name for p in (_state_dir() / "jobs").glob("*") if p.name.isdigit()), key=int)
    return [job for job in jobs if _option(args, "name") is None or _info(job).get("name") in names]


def _field(job: str, code: str) -> str:
    info = _info(job)
    fields = {"i": job, "T": _state(job), "r": info.get("reason", "None"), "j": info.get("name", ""),
              "Z": info.get("workdir", ""), "V": str(int(info.get("submit", 0)))}  # fmt: skip
    return fields.get(code, "")


def _squeue_line(job: str, form: str) -> str:
    out, index = [], 0
    while index < len(form):
        if form[index] == "%" and index + 1 < len(form):
            out.append(_field(job, form[index + 1]))
            index += 2
        else:
            out.append(form[index])
            index += 1
    return "".join(out)


SACCT_FIELDS = {"JobID": "i", "State": "T", "JobName": "j", "WorkDir": "Z", "Reason": "r"}


def main(argv: list[str]) -> int:
    command, args = Path(argv[0]).name, argv[1:]
    if command == "run":
        return run(args[0], json.loads(args[1]))
    if command == "sbatch":
        return sbatch(args)
    (_state_dir() / "jobs").mkdir(parents=True, exist_ok=True)
    if command == "squeue":
        with open(_state_dir() / "squeue.calls", "a") as calls:
            calls.write(f"{time.time()}\n")
        form = _option(args, "format") or "%i %T"
        for job in _selected(args):
            if _state(job) in {"PENDING", "RUNNING"}:
                print(_squeue_line(job, form))
        return 0
    if command == "sacct":
        names = (_option(args, "format") or "JobID,State").split(",")
        for job in _selected(args):
            if _state(job) != "UNKNOWN":
                print("|".join(_field(job, SACCT_FIELDS.get(name.split("%")[0], "?")) for name in names))
        return 0
    if command == "scancel":
        for job in args:
            if _state(job) not in ENDED:
                _set(job, "CANCELLED")
        return 0
    if command == "sacctmgr":
        table = _state_dir() / "sacctmgr.txt"
        if not table.exists():
            print("sacctmgr: error: Problem talking to the database: Connection refused", file=sys.stderr)
            return 1
        print(table.read_text(), end="")
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
    for name in ("sbatch", "squeue", "sacct", "scancel", "sinfo", "scontrol", "sacctmgr"):
        script = bin_dir / name
        script.write_text(f"#!{sys.executable}\nimport sys\nsys.path.insert(0, {str(Path(__file__).parent)!r})\n"
                          f"from fake_slurm import main\nsys.exit(main([{name!r}, *sys.argv[1:]]))\n")  # fmt: skip
        script.chmod(0o755)
    state_dir.mkdir(parents=True, exist_ok=True)
    return {"FAKE_SLURM_DIR": str(state_dir), "PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}"}


def started(state_dir: Path) -> list[dict]:
    """Every start of a job's command: ``{"job", "name", "at"}``."""
    path = state_dir / "started.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def submitted(state_dir: Path) -> list[dict]:
    """Every ``sbatch`` call: ``{"job", "args", "in_flight"}``."""
    path = state_dir / "sbatch.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
