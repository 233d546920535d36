"""DVC's bookkeeping around stage commands, done once for many stages: what ``dvc repro`` does for
each stage, with the ``dvc.lock`` write batched.

``dvc repro --single-item <stage>`` per stage (the old runner) rebuilds DVC's index, then re-reads
and rewrites the whole ``dvc.lock`` under the repository lock: its cost grows with the grid, so a
grid's total grows with its square and is serialised whatever the number of workers
(treeverse/dvc#10629; measured in ``benchmarks/pipeline_scale.py``). :class:`StageBook` loads the
index once, holds the repository lock for the whole run (as ``dvc repro`` does), and around each
command does what ``Stage.run`` does (``dvc/stage/__init__.py``):

- before: remove the stage's non-persistent outputs and hash its dependencies
  (:meth:`StageBook.start`);
- after: hash dependencies and outputs again and move the outputs into DVC's cache
  (``Stage.save`` + ``Stage.commit``, :meth:`StageBook.finish`); a dependency that changed while
  the command ran makes the run unrecordable (the stage stays stale: nothing claims an output
  came from inputs it did not see; code and params, which a stage's inputs manifest stands for, are
  checked by the stage itself before and after its work, :func:`dmlbench.stage_inputs.check_manifest`).
  The stage's lock entry (``dvc.stage.serialize.to_lockfile``) is queued;
- :meth:`StageBook.flush` writes every queued entry in one rewrite of the lock file (as
  ``dvc commit`` of many stages does, ``dvc/repo/commit.py``), to a temporary file renamed over
  ``dvc.lock``: a run killed at any moment leaves the old or the new lock, never half of one.

A stage's entry is written only after its command succeeded and its outputs are in the cache, so a
killed run leaves the lock consistent: finished stages recorded (or, if killed before their batch,
stale and re-run next time), nothing recorded for an unfinished one. The entry is DVC's own: a
later ``dvc status``/``dvc repro`` reads it as if ``dvc repro`` had written it. Thread-safe: one
lock guards the DVC objects; the lock-file write runs outside it, so stages start and finish while
a batch is written. Run cache: not written (``dvc repro --no-run-cache``'s behaviour for outputs).
"""

from __future__ import annotations

import contextlib
import functools
import itertools
import os
import re
import tempfile
import threading
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from dmlbench.errors import DmlbenchError
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
        from dvc.repo import Repo
        from dvc.stage import PipelineStage

        self.root = Path(root)
        self.repo = Repo(str(root))
        with contextlib.chdir(self.root):  # names as DVC prints them in the repository's root
            self.stages: dict[str, Any] = {
                s.addressing: s for s in self.repo.index.stages if isinstance(s, PipelineStage)
            }
        self._guard = threading.RLock()  # DVC's objects are not thread-safe
        self._write_guard = threading.Lock()  # one lock-file write at a time
        self._queued: dict[str, tuple[Path, dict[str, Any]]] = {}  # stage -> (lock file, entry)
        self._deps_before: dict[str, dict[str, Any]] = {}
        self._outputs: list[str] | None = None
        self.recorded: list[str] = []
        self.writes = 0

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
        from dvc.stage.run import prepare_kwargs

        with self._guard:
            stage = self.stages[name]
            stage.remove_outs(ignore_remove=False, force=False)
            stage.save_deps()
            self._deps_before[name] = {str(dep): dep.hash_info for dep in stage.deps}
            kwargs = prepare_kwargs(stage, run_env=env)
        commands = stage.cmd if isinstance(stage.cmd, list) else stage.cmd.splitlines()
        lines = [_shell_argv(_executable(), line) for line in commands if line.strip()]
        return Command(name, lines, str(kwargs["cwd"]), dict(kwargs["env"]))

    def job_spec(self, name: str) -> dict[str, Any]:
        """What a job on another machine needs to run ``name`` as ``dvc repro`` would, without DVC:
        its command lines, working directory, the DVC variables of its environment, and the
        non-persistent outputs to remove first (:func:`run_job_spec`). Written by the Slurm
        executor at submission; the stage is recorded here, by :meth:`finish`, once its job
        completed."""
        from dvc.exceptions import DvcException

        with self._guard:
            stage = self.stages[name]
            # the inputs no stage produces (data, and validate's code and params) and the stage's own
            # inputs manifest (validate ran before submission) are hashed now: :meth:`finish` refuses
            # to record the stage if they changed before its job completed
            own = manifest_path(name).as_posix()
            external = [dep for dep in stage.deps if dep.def_path == own or not self._produced(dep.fs_path)]
            snapshot = {}
            for dep in external:
                try:
                    dep.save()
                except DvcException:  # not there yet: nothing to compare it with
                    continue
                snapshot[str(dep)] = dep.hash_info
            self._deps_before[name] = snapshot
            lines = stage.cmd if isinstance(stage.cmd, list) else stage.cmd.splitlines()
            return {
                "stage": name,
                "lines": [line for line in lines if line.strip()],
                "cwd": os.path.abspath(stage.wdir),
                "env": {"DVC_ROOT": os.path.abspath(self.repo.root_dir), "DVC_STAGE": name},
                # absolute, links not followed: a symlinked output is removed, not the cache file it points to
                "remove": [os.path.abspath(out.fs_path) for out in stage.outs if not out.persist],
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
        from dvc.exceptions import DvcException
        from dvc.stage.serialize import to_lockfile

        with self._guard:
            stage = self.stages[name]
            before = self._deps_before.pop(name, None)
            try:
                stage.save(run_cache=False)
            except DvcException as exc:
                raise RecordError(f"{name}: {exc}") from None
            if before is not None:
                after = {str(dep): dep.hash_info for dep in stage.deps}
                moved = [path for path, info in before.items() if after.get(path) != info]
                if moved:
                    raise RecordError(
                        f"{name}: {moved[0]} changed while the stage ran; not recorded (the stage stays stale "
                        "and runs again next time)"
                    )
            try:
                stage.commit()
            except DvcException as exc:
                raise RecordError(f"{name}: {exc}") from None
            lockfile = Path(stage.dvcfile.path).with_suffix(".lock")
            self._queued[name] = (lockfile, to_lockfile(stage))

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


def write_lock_entries(lockfile: Path, entries: dict[str, Any]) -> None:
    """Set ``entries`` (stage name -> DVC lock entry) in ``lockfile``, the other entries kept, written
    to a temporary file and renamed over it. Each new entry is dumped by DVC's own YAML dumper
    (``dvc.utils.serialize.dumps_yaml``) and spliced in place of the stage's old block (or appended):
    the file is byte for byte what DVC's full rewrite would give (``tests/test_record.py``), without
    re-serialising the unchanged entries, which is what made a write cost 130 s at 2,074 stages."""
    text = lockfile.read_text(encoding="utf-8") if lockfile.exists() else ""
    _replace(lockfile, splice_lock(text, entries))


def splice_lock(text: str, entries: dict[str, Any]) -> str:
    """``text`` (a ``dvc.lock`` as DVC writes it: ``schema``, then ``stages:`` with one block per stage
    at two spaces' indent) with the blocks of ``entries`` replaced or appended."""
    from dvc.utils.serialize import dumps_yaml

    # each entry dumped where it sits in the file (under ``stages:``), so that long strings fold at
    # the same columns as in DVC's full rewrite
    # the same objects can sit in several entries (params.yaml values DVC loaded once, YAML anchors
    # there): each entry is dumped from an unshared copy, so no anchor (``&id001``) is written twice
    indented = {
        name: dumps_yaml({"stages": {name: _unshared(entry)}}).split("\n", 1)[1] for name, entry in entries.items()
    }
    if not text.strip():
        return "schema: '2.0'\nstages:\n" + "".join(indented.values())
    layout = _blocks(text)
    if layout is None:  # not the layout DVC writes (hand edit, a merge, another section): DVC's full rewrite
        return _rewrite(text, entries)
    head, blocks = layout
    out, replaced = [head], set()
    for name, block in blocks:
        if name in indented:
            out.append(indented[name])
            replaced.add(name)
        else:
            out.append(block)
    out.extend(block for name, block in indented.items() if name not in replaced)
    return "".join(out)


def _blocks(text: str) -> tuple[str, list[tuple[str, str]]] | None:
    """``text`` as (everything up to ``stages:``, [(stage name, its block)]), or None when it is not
    exactly DVC's layout: ``schema`` then ``stages:`` last, each stage a block at two spaces'
    indent, no name twice."""
    marker = text.find("\nstages:\n")
    if not text.startswith("schema:") or marker < 0 or _TOP_LEVEL.search(text, marker + 1 + len("stages:\n")):
        return None
    body = marker + len("\nstages:\n")
    starts = [match.start() for match in _BLOCK_START.finditer(text, body)]
    if (starts[0] if starts else len(text)) != body:
        return None
    blocks: list[tuple[str, str]] = []
    for begin, end in itertools.pairwise([*starts, len(text)]):
        blocks.append((_block_name(text[begin : text.find("\n", begin)]), text[begin:end]))
    if len({name for name, _ in blocks}) != len(blocks):
        return None
    return text[:body], blocks


def _rewrite(text: str, entries: dict[str, Any]) -> str:
    """DVC's own full rewrite: parse, update, dump (``dvc/dvcfile.py``: ``Lockfile.dump_stages``)."""
    from dvc.utils.serialize import dumps_yaml, parse_yaml

    data = parse_yaml(text, "dvc.lock") or {}
    data.setdefault("schema", "2.0")
    data["stages"] = {**(data.get("stages") or {}), **entries}
    return dumps_yaml(data)


def _unshared(value: Any) -> Any:
    """``value`` with every dict and list copied afresh (``copy.deepcopy`` keeps shared ones shared)."""
    if isinstance(value, dict):
        return {key: _unshared(item) for key, item in value.items()}
    if isinstance(value, list):
        return [_unshared(item) for item in value]
    return value


# a stage's first line: a key at two spaces' indent (its body is indented further; ``stages`` is the
# last key DVC writes, so nothing at no indent follows)
_BLOCK_START = re.compile(r"^  [^ \n]", re.MULTILINE)
_TOP_LEVEL = re.compile(r"^[^ \n]", re.MULTILINE)  # a key at no indent


def prune_lock(lockfile: Path, keep: Iterable[str]) -> list[str]:
    """Remove the entries of stages no longer in the pipeline (DVC never does: treeverse/dvc#5293),
    the others kept byte for byte (a lock not in DVC's layout: DVC's full rewrite); returns the
    removed names."""
    if not lockfile.exists():
        return []
    text = lockfile.read_text(encoding="utf-8")
    wanted = set(keep)
    layout = _blocks(text)
    if layout is None:
        from dvc.utils.serialize import dumps_yaml, parse_yaml

        data = parse_yaml(text, str(lockfile)) or {}
        stages = data.get("stages") or {}
        orphans = [name for name in stages if name not in wanted]
        if orphans:
            data["stages"] = {name: entry for name, entry in stages.items() if name in wanted}
            _replace(lockfile, dumps_yaml(data))
        return orphans
    head, blocks = layout
    orphans = [name for name, _ in blocks if name not in wanted]
    if orphans:
        _replace(lockfile, head + "".join(block for name, block in blocks if name in wanted))
    return orphans


def _block_name(header: str) -> str:
    """The stage name of a block's first line (``  train@a-b:``, or quoted), read as DVC reads it."""
    parsed = _safe_yaml().load(header.strip() + " 0")
    return str(next(iter(parsed))) if isinstance(parsed, dict) and parsed else header.strip().rstrip(":")


@functools.cache
def _safe_yaml() -> Any:
    from ruamel.yaml import YAML

    return YAML(typ="safe")


def _current_umask() -> int:
    """The process's umask, read while importing (setting it to read it back is process-wide)."""
    umask = os.umask(0o022)
    os.umask(umask)
    return umask


_UMASK = _current_umask()


def _replace(path: Path, text: str) -> None:
    handle, temporary = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        mode = path.stat().st_mode & 0o777 if path.exists() else 0o666 & ~_UMASK
        os.fchmod(handle, mode)  # mkstemp's 0600 would hide the lock from the group of a shared checkout
        with os.fdopen(handle, "w", encoding="utf-8") as stream:
            stream.write(text)
        os.replace(temporary, path)
    except BaseException:
        Path(temporary).unlink(missing_ok=True)
        raise
