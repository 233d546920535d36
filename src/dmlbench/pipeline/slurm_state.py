"""The state file of a run on Slurm, ``artifacts/logs/slurm-run.json``: what is in Slurm's hands.

The submitting process may die at any moment (an ssh drop, a login node's reboot, ``kill -9``) or
be told to detach; the jobs go on. What a later run needs to take them over without running
anything twice is written here, one entry per stage whose job is queued or running:

* ``job``: its Slurm job id; ``null`` while its ``sbatch`` runs (the entry is written **before**
  the submission, so a crash between ``sbatch`` and the write leaves an entry without an id, which
  :func:`dmlbench.pipeline.slurm_queries.find_jobs` resolves by job name, working directory and
  submission time);
* ``snapshot``: its command and the hashes of its inputs at submission (its inputs manifest among
  them, :meth:`StageBook.snapshot <dmlbench.pipeline.record.StageBook.snapshot>`): a job that
  COMPLETED while nobody watched is recorded only when they are the same now
  (:meth:`StageBook.adopt <dmlbench.pipeline.record.StageBook.adopt>`);
* ``attempts`` and ``progress`` (its checkpoint's fingerprint when submitted,
  :func:`dmlbench.pipeline.checkpoints.progress`): retries stay bounded across restarts;
* ``weight``: the jobs it stands for (a tune job that runs its workers as an array: 1 + workers).

An entry leaves once its stage ended (recorded, or failed and reported). Every change rewrites the
file in one rename (a kill leaves the old or the new file); it holds at most ``max_jobs`` entries.
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
