"""One copy of a stage at a time, and a note that survives its runner: the command completed.

A runner killed with ``kill -9`` leaves its stages running and its last batch unwritten; started
again, it must neither run a second copy of a stage nor re-run a finished one.

* **Lock.** ``artifacts/logs/stages/<stage>.lock``, an ``flock`` taken by the runner and inherited
  by the stage's process (held until the last holder exits); a runner finding it taken waits
  (:func:`claim`). ``flock`` over NFS is an ``fcntl`` lock on Linux (``man 2 flock``); where the
  file system has none, stages run unguarded.
* **Note.** ``artifacts/logs/stages/<stage>.json``: ``running`` (command and dependency hashes,
  written by the runner), ``completed`` (by the stage's wrapper, ``python -m
  dmlbench.pipeline.guard``, once every command line exited 0), removed once in ``dvc.lock``. A
  ``completed`` stage whose command and dependencies are unchanged is recorded without running.

This module imports nothing of dmlbench (the wrapper starts in milliseconds).
"""

from __future__ import annotations

import errno
import fcntl
import json
import os
import re
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

STAGES_DIR = Path("artifacts/logs/stages")
RUNNING, COMPLETED = "running", "completed"


def stage_filename(stage: str, suffix: str = "") -> str:
    """A file name for ``stage`` (``train@cub-resnet50-arcface-512-0``): DVC's name with every character
    but letters, digits and ``_.@-`` (a ``/`` of a ``dvc.yaml`` in a subfolder, ``:``, a space of a
    matrix value) turned into ``_``, then ``suffix``. Every per-stage file (logs, job specs, notes)."""
    return re.sub(r"[^A-Za-z0-9_.@-]", "_", stage) + suffix


def _file(stage: str, suffix: str, root: Path) -> Path:
    return root / STAGES_DIR / stage_filename(stage, suffix)


def note_path(stage: str, root: Path = Path(".")) -> Path:
    return _file(stage, ".json", root)


def read_note(stage: str, root: Path = Path(".")) -> dict[str, Any] | None:
    try:
        return json.loads(note_path(stage, root).read_text())
    except (OSError, ValueError):
        return None


def write_note(path: Path, note: dict[str, Any]) -> None:
    """Replace the note in one rename: a kill leaves the old note or the new one."""
    path.parent.mkdir(parents=True, exist_ok=True)
    handle, temporary = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(handle, "w") as stream:
            json.dump(note, stream)
        os.replace(temporary, path)
    except BaseException:
        Path(temporary).unlink(missing_ok=True)
        raise


def clear_note(stage: str, root: Path = Path(".")) -> None:
    note_path(stage, root).unlink(missing_ok=True)


def claim(stage: str, root: Path = Path("."), *, on_wait: Callable[[int | None], None] | None = None,
          stop: Callable[[], bool] = lambda: False, poll: float = 0.5) -> int | None:  # fmt: skip
    """The stage's lock, taken: an open descriptor to hand to the stage's process (``pass_fds``) and
    close here once it started. While another copy holds it: ``on_wait(its pid or None)`` once, then
    wait. None when ``stop()`` turned true while waiting, or where the file system has no locks."""
    path = _file(stage, ".lock", root)
    path.parent.mkdir(parents=True, exist_ok=True)
    descriptor = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    told = False
    while True:
        try:
            fcntl.flock(descriptor, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return descriptor
        except OSError as exc:
            if exc.errno not in (errno.EAGAIN, errno.EACCES):  # ENOLCK, EOPNOTSUPP: no locks here
                os.close(descriptor)
                return None
        if not told and on_wait is not None:
            note = read_note(stage, root) or {}
            on_wait(note.get("pid"))
            told = True
        if stop():
            os.close(descriptor)
            return None
        time.sleep(poll)


def guarded_argv(note: Path, descriptor: int | None, lines: list[list[str]]) -> list[str]:
    """The wrapper's command line: run ``lines`` (each an argv) in order, holding the lock, and mark
    ``note`` completed when all exited 0."""
    held = "-" if descriptor is None else str(descriptor)
    return [sys.executable, "-m", "dmlbench.pipeline.guard", str(note.resolve()), held, json.dumps(lines)]


def _exit_code(code: int) -> int:
    return 128 - code if code < 0 else code  # killed by signal N: 128 + N, as a shell says


def main(argv: list[str]) -> int:
    """The wrapper (:func:`guarded_argv`). The runner's interrupt reaches the command's whole
    process group, this wrapper included: it waits for the command to stop at its checkpoint."""
    note, held, lines = Path(argv[0]), argv[1], json.loads(argv[2])
    keep = () if held == "-" else (int(held),)
    signal.signal(signal.SIGINT, lambda _signum, _frame: None)  # (a handler: the commands get SIGINT's default)
    if note.exists():  # who holds the lock, for a runner that finds it taken
        write_note(note, {**json.loads(note.read_text()), "pid": os.getpid()})
    code = 0
    for line in lines:
        code = _exit_code(subprocess.Popen(line, pass_fds=keep).wait())
        if code != 0:
            return code
    record = json.loads(note.read_text()) if note.exists() else {}
    write_note(note, {**record, "state": COMPLETED, "ended": time.time()})
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
