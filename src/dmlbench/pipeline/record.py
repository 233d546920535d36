"""DVC's bookkeeping around stage commands, done once for many stages: what ``dvc repro`` does for
each stage (``Stage.run``, ``dvc/stage/__init__.py``), with the ``dvc.lock`` write batched.

``dvc repro`` rewrites the whole lock per stage, so a grid's bookkeeping grows with its square
(treeverse/dvc#10629). :class:`StageBook` loads DVC's index once and holds the repository lock for
the run; :meth:`~StageBook.start` removes a stage's non-persistent outputs and hashes its
dependencies, :meth:`~StageBook.finish` hashes and caches (``Stage.save`` + ``Stage.commit``) and
queues DVC's own lock entry (a dependency changed meanwhile: unrecordable), :meth:`~StageBook.flush`
writes the queued entries in one lock write renamed over ``dvc.lock`` (as ``dvc commit``,
``dvc/repo/commit.py``). Thread-safe; no run cache. Guarantees: docs/pipeline.md.
"""

from __future__ import annotations

import contextlib
import os
import threading
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from dmlbench import dvc_adapter as dvc
from dmlbench.errors import DmlbenchError
from dmlbench.pipeline.lockfile import write_lock_entries
from dmlbench.stage_inputs import manifest_path


class RecordError(DmlbenchError):
    """A stage's outputs could not be recorded."""


@dataclass(frozen=True)
class Command:
    """How to run one stage's command as ``dvc repro`` would: shell argv per line, working
    directory and environment (with DVC_ROOT and DVC_STAGE)."""

    stage: str
    lines: list[list[str]]
    cwd: str
    env: dict[str, str]


class StageBook:
    """DVC's bookkeeping for one run of many stages (see the module docstring).

    Use as a context manager: entering loads DVC's index and takes the repository lock, leaving
    flushes the queued lock entries and releases it."""

    def __init__(self, root: str | Path = "."):
        self.root = Path(root)
        self.repo = dvc.open_repo(root)
        with contextlib.chdir(self.root):  # names as DVC prints them in the repository's root
            self.stages: dict[str, Any] = dvc.pipeline_stages(self.repo)
        self._guard = threading.RLock()  # DVC's objects are not thread-safe
        self._write_guard = threading.Lock()  # one lock-file write at a time
        self._queued: dict[str, tuple[Path, dict[str, Any]]] = {}  # stage -> (lock file, entry)
        self._deps_before: dict[str, dict[str, dict[str, str]]] = {}  # stage -> path -> hash (to_dict)
        self._outputs: list[str] | None = None
        self.recorded: list[str] = []
        self.writes = 0
        # called with the names of each batch once it is in dvc.lock (e.g. to drop their completion notes)
        self.on_written: Callable[[list[str]], None] | None = None

    def __enter__(self) -> StageBook:
        self.repo.lock.lock()
        return self

    def __exit__(self, *exc: object) -> None:
        try:
            self.flush()
        finally:
            self.repo.lock.unlock()
            self.repo.close()

    def is_changed(self, name: str) -> bool:
        """Whether ``name`` would run under ``dvc repro`` now (its dependencies, outputs or
        command differ from its lock entry): False for a stage whose upstream re-ran to the same
        outputs."""
        with self._guard:
            return bool(self.stages[name].changed())

    def start(self, name: str, env: dict[str, str] | None = None) -> Command:
        """Prepare ``name``'s run: remove its non-persistent outputs, hash its dependencies;
        return the command to run."""
        with self._guard:
            stage = self.stages[name]
            dvc.remove_outputs(stage)
            self._deps_before[name] = dvc.hash_dependencies(stage)
            cwd, run_env = dvc.run_environment(stage, env)
        commands = stage.cmd if isinstance(stage.cmd, list) else stage.cmd.splitlines()
        lines = [_shell_argv(_executable(), line) for line in commands if line.strip()]
        return Command(name, lines, cwd, run_env)

    def job_spec(self, name: str) -> dict[str, Any]:
        """What a job on another machine needs to run ``name`` as ``dvc repro`` would, without DVC:
        its command lines, working directory, the DVC variables of its environment, and the
        non-persistent outputs to remove first (:func:`run_job_spec`). Written by the Slurm
        executor at submission; the stage is recorded here, by :meth:`finish`, once its job
        completed."""
        with self._guard:
            stage = self.stages[name]
            # the inputs no stage produces (data, and validate's code and params) and the stage's own
            # inputs manifest (validate ran before submission) are hashed now: :meth:`finish` refuses
            # to record the stage if they changed before its job completed
            own = manifest_path(name).as_posix()
            external = [dep for dep in stage.deps if dep.def_path == own or not self._produced(dep.fs_path)]
            hashes = {str(dep): dvc.hash_dependency(dep) for dep in external}
            # (one not there yet: nothing to compare it with)
            self._deps_before[name] = {path: found for path, found in hashes.items() if found is not None}
            lines = stage.cmd if isinstance(stage.cmd, list) else stage.cmd.splitlines()
            return {
                "stage": name,
                "lines": [line for line in lines if line.strip()],
                "cwd": os.path.abspath(stage.wdir),
                "env": {"DVC_ROOT": os.path.abspath(self.repo.root_dir), "DVC_STAGE": name},
                # absolute, links not followed: a symlinked output is removed, not the cache file it points to
                "remove": [os.path.abspath(out.fs_path) for out in stage.outs if not out.persist],
                # what it resumes from (:mod:`dmlbench.pipeline.checkpoints`)
                "keep": [os.path.abspath(out.fs_path) for out in stage.outs if out.persist],
                "unprotect": [os.path.abspath(out.fs_path) for out in stage.outs if out.persist and out.use_cache],
            }

    def _produced(self, path: str) -> bool:
        """Whether ``path`` is, holds or lies inside some stage's output (a folder of outputs, e.g.
        the embeddings of every seed, is produced by the stages that write them)."""
        if self._outputs is None:
            self._outputs = [out.fs_path for stage in self.stages.values() for out in stage.outs]
        inside = path.rstrip(os.sep) + os.sep
        return any(
            path == out or path.startswith(out.rstrip(os.sep) + os.sep) or out.startswith(inside)
            for out in self._outputs
        )

    def finish(self, name: str) -> None:
        """Record a successful run of ``name``: hash dependencies and outputs, move the outputs
        into the cache, queue its lock entry. :class:`RecordError` (nothing queued) when a
        dependency changed during the run or an output is missing."""
        with self._guard:
            stage = self.stages[name]
            before = self._deps_before.pop(name, None)
            try:
                dvc.save_stage(stage)
            except dvc.DvcFailure as exc:
                raise RecordError(f"{name}: {exc}") from None
            if before is not None:
                after = dvc.dependency_hashes(stage.deps)
                moved = [path for path, info in before.items() if after.get(path) != info]
                if moved:
                    raise RecordError(
                        f"{name}: {moved[0]} changed while the stage ran; not recorded (the stage stays stale "
                        "and runs again next time)"
                    )
            try:
                dvc.commit_stage(stage)
            except dvc.DvcFailure as exc:
                raise RecordError(f"{name}: {exc}") from None
            self._queued[name] = (dvc.lock_file(stage), dvc.lock_entry(stage))

    def snapshot(self, name: str) -> dict[str, Any]:
        """What :meth:`adopt` needs to record ``name``'s run later, from another process: its command
        and the hashes of its dependencies taken by :meth:`start` or :meth:`job_spec` (plain JSON)."""
        with self._guard:
            stage = self.stages[name]
            return {"cmd": stage.cmd, "deps": dict(self._deps_before.get(name, {}))}

    def matches(self, name: str, snapshot: dict[str, Any]) -> bool:
        """Whether ``name``'s command and the dependencies hashed in ``snapshot`` (:meth:`snapshot`) are
        the same now: a job submitted by an earlier run still runs what the pipeline asks for."""
        wanted = snapshot.get("deps") or {}
        with self._guard:
            stage = self.stages[name]
            if snapshot.get("cmd") != stage.cmd:
                return False
            # (a dependency DVC cannot hash now: None, never equal to a hash taken then)
            return all(dvc.hash_dependency(dep) == wanted[str(dep)] for dep in stage.deps if str(dep) in wanted)

    def expect(self, name: str, snapshot: dict[str, Any]) -> None:
        """Take over a run started by an earlier process: :meth:`finish` compares its dependencies with
        those of ``snapshot`` (:meth:`snapshot`)."""
        with self._guard:
            self._deps_before[name] = dict(snapshot.get("deps") or {})

    def adopt(self, name: str, snapshot: dict[str, Any]) -> None:
        """Record a run of ``name`` whose command completed while no runner watched it (the runner
        was killed, or a Slurm job ended meanwhile), as :meth:`finish` would have: only when its
        command is the one that ran and every dependency hashed then (``snapshot``) is the same now;
        else :class:`RecordError` (nothing queued: the stage runs again)."""
        with self._guard:
            if snapshot.get("cmd") != self.stages[name].cmd:
                raise RecordError(f"{name}: its command changed since it ran; not recorded")
            self.expect(name, snapshot)
        self.finish(name)

    @property
    def pending(self) -> int:
        with self._guard:
            return len(self._queued)

    def flush(self) -> int:
        """Write every queued entry: one rewrite per lock file. Returns the number of entries."""
        with self._write_guard:
            with self._guard:
                batch, self._queued = self._queued, {}
            if not batch:
                return 0
            by_file: dict[Path, dict[str, Any]] = {}
            for _name, (lockfile, entry) in batch.items():
                by_file.setdefault(lockfile, {}).update(entry)
            try:
                for lockfile, entries in by_file.items():
                    write_lock_entries(lockfile, entries)
                    self.writes += 1
            except BaseException:
                with self._guard:  # kept for the next flush (entries queued since then win)
                    self._queued = {**batch, **self._queued}
                raise
            self.recorded.extend(batch)
            if self.on_written is not None:
                self.on_written(list(batch))
            return len(batch)


def run_job_spec(spec: dict[str, Any], env: dict[str, str], **popen: Any) -> Any:
    """Start the command of a :meth:`StageBook.job_spec` as ``dvc repro`` would: non-persistent
    outputs removed, cached persistent ones unprotected (links to the cache replaced by copies);
    returns the ``subprocess.Popen``. Several lines run one after the other, each in a subshell of
    its own (as DVC starts one shell per line), the first failure stopping them."""
    import shutil
    import subprocess

    for path in map(Path, spec["remove"]):
        if path.is_dir() and not path.is_symlink():
            shutil.rmtree(path)
        else:
            path.unlink(missing_ok=True)
    for path in map(Path, spec.get("unprotect", [])):
        if not path.exists() and not path.is_symlink():  # not produced yet (a first run)
            continue
        files = [path] if not path.is_dir() else [p for p in path.rglob("*") if p.is_file() or p.is_symlink()]
        for file in files:
            if file.is_symlink() or file.stat().st_nlink > 1:
                copy = file.with_name(f".{file.name}.unprotect")
                shutil.copyfile(file, copy)
                os.replace(copy, file)
    script = " && ".join(f"(\n{line}\n)" for line in spec["lines"])
    argv = _shell_argv(_executable(), script)
    return subprocess.Popen(argv, cwd=spec["cwd"], env={**env, **spec["env"]}, **popen)


def _executable() -> str:
    """The shell DVC runs commands with on POSIX (``dvc.stage.run.get_executable``)."""
    return os.getenv("SHELL") or "/bin/sh"


def _shell_argv(executable: str, line: str) -> list[str]:
    """The argv DVC runs one command line with (``dvc.stage.run``: the shell without its rc files)."""
    name = os.path.basename(executable).lower()
    options = {"zsh": ["--no-rcs"], "bash": ["--noprofile", "--norc"]}.get(name, [])
    return [executable, *options, "-c", line]
