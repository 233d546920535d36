"""A training's tracking records, written to a local spool first and sent from a thread of their own.

Why: a training lasts days and MLflow's client rides out about 4 minutes of a server outage before
raising into it. Records are appended and ``fsync``-ed to ``records.jsonl``; a sender thread sends
them in order with backoff (:data:`RETRY_SECONDS`), never dropped or duplicated
(:mod:`dmlbench.tracking.spool_ops`); what a bounded end flush leaves is replayed later
(:mod:`dmlbench.tracking.replay`). Refused records go to ``refused.jsonl``. Details: docs/tracking.md.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import sys
import threading
import time
import uuid
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from dmlbench.io import read_json, write_json
from dmlbench.tracking.spool_ops import LoggedSteps, UnknownRun, execute, transient
from dmlbench.tracking.store import configure_background_client, restore_client_environment

RECORDS, STATE, REFUSED_FILE, FILES, LOCK = "records.jsonl", "state.json", "refused.jsonl", "files", "lock"
RETRY_SECONDS = (1.0, 30.0)  # the sender's wait after a failed send: doubled each time up to the second
FLUSH_VARIABLE, FLUSH_SECONDS = "DMLBENCH_TRACKING_FLUSH_SECONDS", 60.0
LOCK_NOTICE_SECONDS = 5.0
JOIN_SECONDS = 5.0  # how long closing waits for a sender inside a request


def flush_seconds() -> float:
    """How long a training's end waits for its records: ``$DMLBENCH_TRACKING_FLUSH_SECONDS`` or the default."""
    return float(os.environ.get(FLUSH_VARIABLE) or FLUSH_SECONDS)


def failure_summary(exc: BaseException) -> str:
    """``Type: message start``, plus the system's reason (``[Errno 111] ...``) where the message buries it."""
    text = str(exc).splitlines()[0] if str(exc) else ""
    reason = re.search(r"\[Errno -?\d+\][^\"')]*", text)
    short = text[:120] + ("..." if len(text) > 120 else "")
    return f"{type(exc).__name__}: {short}" + (f" ({reason[0].strip()})" if reason and reason[0] not in short else "")


def _warn(message: str) -> None:
    print(f"tracking: {message}", file=sys.stderr, flush=True)


class Spool:
    """The spool of one training (one DVC stage's runs) in ``directory``; :meth:`open` takes it (its
    lock) and starts the sender, :meth:`close` flushes with a bounded wait and lets it go."""

    def __init__(self, directory: Path, sender: bool = True):
        self.directory = Path(directory)
        self.session = uuid.uuid4().hex[:12]
        self.with_sender = sender
        self.records: list[dict[str, Any]] = []  # not yet sent, in order
        self.runs: dict[str, str] = {}
        self.acked = 0
        self.next_seq = 1
        self.failed: set[int] = set()  # records a send of which failed: uncertain
        self.error: str | None = None  # the last transient failure, while it lasts
        self.condition = threading.Condition()
        self.stopping = False
        self.lock: Any = None
        self.thread: threading.Thread | None = None
        self.logged = LoggedSteps()
        self.on_open: dict[str, Any] = {}  # handle -> callback(run_id) once its open record is sent
        self.on_answer: list[Any] = []  # callbacks once the store answers again after failures

    def _load(self) -> None:
        state = read_json(self.directory / STATE) if (self.directory / STATE).exists() else {}
        self.acked, self.runs = int(state.get("acked", 0)), dict(state.get("runs", {}))
        path, good, records = self.directory / RECORDS, 0, []
        if path.exists():
            data = path.read_bytes()
            for line in data.splitlines(keepends=True):
                try:
                    record = json.loads(line)
                except ValueError:
                    break  # a line torn by a kill: it and anything after it never counted
                if not line.endswith(b"\n"):
                    break
                good += len(line)
                records.append(record)
            if good < len(data):
                with open(path, "r+b") as handle:
                    handle.truncate(good)
        self.records = [r for r in records if r["seq"] > self.acked]
        self.next_seq = max([self.acked, *(r["seq"] for r in records)]) + 1

    def _save_state(self) -> None:
        write_json(self.directory / STATE, {"acked": self.acked, "runs": self.runs})

    def pending(self) -> int:
        with self.condition:
            return len(self.records)

    def open(self, wait: bool = True) -> bool:
        """Take the spool (its lock; ``wait``: until free, else give up at once) and start the sender
        on what an earlier process left; False when another process holds it and ``wait`` is False."""
        from filelock import FileLock, Timeout

        self.directory.mkdir(parents=True, exist_ok=True)
        self.lock = FileLock(str(self.directory / LOCK))
        try:
            self.lock.acquire(timeout=LOCK_NOTICE_SECONDS if wait else 0)
        except Timeout:
            if not wait:
                return False
            _warn(f"waiting for {self.directory} (another process is sending these records)")
            self.lock.acquire()
        self._load()
        if self.records:
            _warn(f"{len(self.records)} record(s) left in {self.directory} by an earlier process: sending them first")
        configure_background_client()
        if self.with_sender:
            self.thread = threading.Thread(target=self._send_loop, name=f"spool {self.directory.name}", daemon=True)
            self.thread.start()
        return True

    def append(self, op: str, **fields: Any) -> None:
        """Add a record (written and synced before this returns; sent by the sender thread)."""
        with self.condition:
            record = {"seq": self.next_seq, "session": self.session, "op": op, **fields}
            self.next_seq += 1
            line = json.dumps(record, sort_keys=True) + "\n"
            with open(self.directory / RECORDS, "a") as handle:
                handle.write(line)
                handle.flush()
                os.fsync(handle.fileno())
            self.records.append(json.loads(line))
            self.condition.notify_all()

    def keep_file(self, path: Path) -> str:
        """A copy of ``path`` in the spool (the original may be gone before it is sent); its name there."""
        name = f"{self.next_seq}/{Path(path).name}"
        target = self.directory / FILES / name
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(path, target)
        return name

    def flush(self, timeout: float) -> bool:
        """Wait up to ``timeout`` seconds for every record to be sent; whether all were."""
        deadline = time.monotonic() + timeout
        with self.condition:
            while self.records and self.thread is not None and self.thread.is_alive():
                left = deadline - time.monotonic()
                if left <= 0:
                    break
                self.condition.wait(min(left, 0.5))
            return not self.records

    def close(self, timeout: float, quiet: bool = False) -> int:
        """Flush (bounded wait), stop the sender, let the spool go; how many records are left (unless
        ``quiet``, one line says where they wait). A sender inside a request keeps the lock until exit."""
        self.flush(timeout)
        with self.condition:
            self.stopping = True
            self.condition.notify_all()
        if self.thread is not None:
            self.thread.join(timeout=JOIN_SECONDS)
        left = self.pending()
        if left:
            why = f" ({self.error})" if self.error else ""
            if not quiet:
                _warn(
                    f"{left} record(s) not yet sent{why}: they wait in {self.directory} and are sent by the next "
                    "stage of this cell, the next make repro, or python -m dmlbench.tracking.replay"
                )
        elif (self.directory / RECORDS).exists():  # all sent: the spool starts empty next time
            (self.directory / RECORDS).unlink()
            shutil.rmtree(self.directory / FILES, ignore_errors=True)
        if self.lock is not None and not (self.thread is not None and self.thread.is_alive()):
            self.lock.release()
        restore_client_environment()
        return left

    def _next(self, deadline: float, drain: bool) -> dict[str, Any] | None:
        """The first record not yet sent; None when told to stop, at ``deadline``, or (``drain``)
        when none is left; without ``drain`` it waits for the next one."""
        with self.condition:
            while not self.records and not drain and not self.stopping and time.monotonic() < deadline:
                self.condition.wait(0.5)
            if self.stopping or not self.records or time.monotonic() >= deadline:
                return None
            return self.records[0]

    def send_pending(self, deadline: float, drain: bool = False) -> None:
        """Send records in order until told to stop, ``deadline`` (monotonic) passes or, with ``drain``,
        none is left; a failed send is retried after :data:`RETRY_SECONDS`."""
        from dmlbench.tracking.store import client as make_client

        client, delay = None, RETRY_SECONDS[0]
        while (record := self._next(deadline, drain)) is not None:
            uncertain = record["session"] != self.session or record["seq"] in self.failed
            try:
                client = client or make_client()
                execute(client, record, self.runs, uncertain, self.logged, self.directory / FILES)
            except Exception as exc:
                if transient(exc) and not isinstance(exc, UnknownRun):
                    self._failed(record, exc)
                    with self.condition:
                        self.condition.wait(max(0.0, min(delay, deadline - time.monotonic())))
                    delay = min(RETRY_SECONDS[1], delay * 2)
                    continue
                self._refuse(record, exc)
            delay = RETRY_SECONDS[0]
            self._sent(record)

    def _send_loop(self) -> None:
        try:
            self.send_pending(deadline=float("inf"))
        except BaseException as exc:  # a bug here must not pass unnoticed (the training goes on)
            _warn(f"the sender of {self.directory} stopped: {type(exc).__name__}: {exc}")
            with self.condition:
                self.condition.notify_all()

    def _failed(self, record: Mapping[str, Any], exc: BaseException) -> None:
        first = self.error is None
        self.error = failure_summary(exc)
        self.failed.add(record["seq"])
        if first:
            _warn(f"the tracking store does not answer ({self.error}); the training goes on, its records wait "
                  f"in {self.directory}")  # fmt: skip

    def _refuse(self, record: Mapping[str, Any], exc: BaseException) -> None:
        _warn(f"record {record['seq']} ({record['op']}) refused: {type(exc).__name__}: {exc}"[:400])
        with open(self.directory / REFUSED_FILE, "a") as handle:
            handle.write(json.dumps({**record, "error": f"{type(exc).__name__}: {exc}"}) + "\n")

    def _sent(self, record: Mapping[str, Any]) -> None:
        recovered = self.error is not None
        with self.condition:
            self.records.pop(0)
            self.acked = record["seq"]
            self._save_state()
            self.failed.discard(record["seq"])
            if self.error is not None:
                _warn(f"the tracking store answers again: sending the {len(self.records) + 1} delayed record(s)")
                self.error = None
            self.condition.notify_all()
        if record["op"] == "artifact":
            shutil.rmtree(self.directory / FILES / str(record["file"]).split("/")[0], ignore_errors=True)
        opened = record["op"].startswith("open_") and record["session"] == self.session
        callback = self.on_open.get(record["run"]) if opened else None
        if callback is not None and record["run"] in self.runs:
            callback(self.runs[record["run"]])
        for answered in list(self.on_answer) if recovered else []:
            answered()


def replay(directory: Path, timeout: float) -> int | None:
    """Send what a spool holds, waiting at most ``timeout`` seconds for the store; how many records
    are left (0: all sent), or None when a running process holds it (it sends them itself)."""
    spool = Spool(directory, sender=False)
    if not spool.open(wait=False):
        return None
    try:
        spool.send_pending(deadline=time.monotonic() + timeout, drain=True)
    finally:
        left = spool.close(timeout=0, quiet=True)
    return left
