"""The state file of a run on Slurm, ``artifacts/logs/slurm-run.json``: what is in Slurm's hands.

One entry per stage whose job is queued or running, written **before** its ``sbatch`` (an entry
without a ``job`` id is resolved by :func:`dmlbench.pipeline.slurm_queries.find_jobs`), with the
command and input hashes at submission (``snapshot``: a job that COMPLETED while nobody watched is
recorded only when they are the same now), ``attempts`` and ``progress`` (retries stay bounded
across restarts) and ``weight`` (a tune job with a worker array: 1 + workers). An entry leaves once
its stage ended; every change is one rename (a kill leaves the old or the new file).
"""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from dmlbench.io import read_json, write_json

STATE_FILE = "slurm-run.json"  # in the runner's log folder (artifacts/logs)
VERSION = 1


@dataclass
class Entry:
    """One stage in Slurm's hands (see the module doc)."""

    stage: str
    job: str | None
    snapshot: dict[str, Any] = field(default_factory=dict)
    submitted: float = 0.0  # time.time() just before its sbatch
    attempts: int = 1
    progress: str | None = None
    weight: int = 1


class RunState:
    """The entries of ``path`` (none when it does not exist), saved on every change (``path`` None:
    kept in memory only)."""

    def __init__(self, path: Path | None) -> None:
        self.path = path
        self.entries: dict[str, Entry] = {}
        if path is not None and path.exists():
            try:
                data = read_json(path)
            except ValueError:  # (written in one rename: only a hand edit breaks it)
                data = {}
            if data.get("version") == VERSION:
                self.entries = {name: Entry(**entry) for name, entry in data.get("jobs", {}).items()}

    def save(self) -> None:
        if self.path is None:  # (a submission that keeps no file)
            return
        write_json(self.path, {"version": VERSION, "jobs": {name: asdict(e) for name, e in self.entries.items()}})

    def submitting(self, stage: str, snapshot: dict[str, Any], attempts: int, progress: str | None,
                   weight: int = 1) -> Entry:  # fmt: skip
        """The entry of a stage about to be submitted, saved before its ``sbatch`` runs."""
        entry = Entry(stage, None, snapshot, time.time(), attempts, progress, weight)
        self.entries[stage] = entry
        self.save()
        return entry

    def submitted(self, stage: str, job: str) -> None:
        self.entries[stage].job = job
        self.save()

    def forget(self, *stages: str) -> None:
        """The stages left Slurm's hands (ended, or never submitted after all)."""
        removed = [self.entries.pop(stage) for stage in stages if stage in self.entries]
        if removed:
            self.save()
