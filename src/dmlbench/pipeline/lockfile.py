"""``dvc.lock`` edited as text: a stage's entry spliced in (or removed) with the others kept byte for
byte, the file replaced in one rename (:func:`write_lock_entries`, :func:`prune_lock`); used by
:class:`dmlbench.pipeline.record.StageBook` and the planner."""

from __future__ import annotations

import functools
import itertools
import os
import re
import tempfile
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from dmlbench.dvc_adapter import dump_yaml, parse_yaml


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
    # each entry dumped where it sits in the file (under ``stages:``), so that long strings fold at
    # the same columns as in DVC's full rewrite
    # the same objects can sit in several entries (params.yaml values DVC loaded once, YAML anchors
    # there): each entry is dumped from an unshared copy, so no anchor (``&id001``) is written twice
    indented = {
        name: dump_yaml({"stages": {name: _unshared(entry)}}).split("\n", 1)[1] for name, entry in entries.items()
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
    data = parse_yaml(text, "dvc.lock") or {}
    data.setdefault("schema", "2.0")
    data["stages"] = {**(data.get("stages") or {}), **entries}
    return dump_yaml(data)


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
        data = parse_yaml(text, str(lockfile)) or {}
        stages = data.get("stages") or {}
        orphans = [name for name in stages if name not in wanted]
        if orphans:
            data["stages"] = {name: entry for name, entry in stages.items() if name in wanted}
            _replace(lockfile, dump_yaml(data))
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
