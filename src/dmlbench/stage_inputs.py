"""A stage's inputs manifest: the code files and ``params.yaml`` keys one DVC stage reads, hashed.

``dvc status`` cost grows with what every stage declares: DVC re-reads ``params.yaml`` for each
stage with a ``params:`` entry (~15 ms a parse of ours, plus a key search) and checks each file
dependency's hash (~57 code files per training). So a stage's DVC dependency for its code and
params is one file, ``artifacts/inputs/<stage>.json``, written by the ``validate`` stage
(:mod:`dmlbench.pipeline.manifests`, what each stage reads derived from the source by
:mod:`dmlbench.pipeline.reads`), which depends on ``stages/``, ``src/dmlbench`` and the whole of
``params.yaml``. The manifest holds the md5 of every code file and the value of every key, nothing
else: editing a loss module or ``losses.<name>`` changes only that loss's manifests, so only its
stages re-run; the stage's ``dvc.lock`` entry carries one md5 for all of it, the manifest itself
(content-addressed in DVC's cache) the values.

:func:`check_manifest` runs in every stage before and after its work (:func:`dmlbench.cli.main`,
when DVC or the runners name the stage in ``DVC_STAGE``): a manifest that no longer matches the
code or ``params.yaml`` (an edit that validate has not seen yet, e.g. ``dvc repro --force
--single-item``, or an edit while the stage ran) fails the stage in one line, so a lock entry
never says that results came from inputs they did not. :func:`inputs_fingerprint` keys what a stage
keeps between runs (a training checkpoint, a tuning study) on the code its manifest lists.
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Iterable, Mapping
from functools import lru_cache
from pathlib import Path
from typing import Any

import yaml

from dmlbench.errors import ConfigError
from dmlbench.io import md5_file

MANIFEST_DIR = Path("artifacts/inputs")
PARAMS_FILE = "params.yaml"
MANIFEST_WRITERS = frozenset({"validate"})  # the stage that writes the manifests has none of its own
WHOLE_FILE = PARAMS_FILE  # the params key of a stage that reads all of params.yaml
PACKAGE_DIR = Path(__file__).resolve().parent


def manifest_path(stage: str, root: Path = Path(".")) -> Path:
    """Where the manifest of DVC stage ``stage`` (e.g. ``train@glyphs-tiny_cnn-triplet-32-0``) lives."""
    return root / MANIFEST_DIR / f"{stage}.json"


def code_files(entries: Iterable[str], root: Path) -> list[str]:
    """The code files, relative to ``root``, sorted; :class:`ConfigError` naming a missing one."""
    for entry in entries:
        if not (root / entry).is_file():
            raise ConfigError(f"{entry}: a code input of the pipeline is missing")
    return sorted(set(entries))


def lookup(params: Mapping[str, Any], key: str) -> Any:
    """The value at dotted ``key`` (``protocols.demo.augment``); a name holding a dot
    (``timm_convnext_tiny.fb_in1k``) is matched whole. KeyError when absent."""
    if key == WHOLE_FILE:
        return params
    parts = key.split(".")
    node: Any = params
    i = 0
    while i < len(parts):
        if not isinstance(node, Mapping):
            raise KeyError(key)
        for j in range(len(parts), i, -1):  # the longest name first
            name = ".".join(parts[i:j])
            if name in node:
                node, i = node[name], j
                break
        else:
            raise KeyError(key)
    return node


def normalised(value: Any) -> Any:
    """``value`` as JSON gives it back (mapping keys as strings), so that manifests compare exactly."""
    return json.loads(_canonical(value))


def build_manifest(stage: str, code: Iterable[str], keys: Iterable[str], params: Mapping[str, Any],
                   root: Path, md5s: dict[str, str] | None = None) -> dict[str, Any]:  # fmt: skip
    """The manifest of ``stage``: ``{"stage", "code": {file: md5}, "params": {key: value}}``
    (``md5s``: a cache shared between stages)."""
    md5s = {} if md5s is None else md5s
    hashes = {}
    for name in code_files(code, root):
        if name not in md5s:
            md5s[name] = md5_file(root / name)
        hashes[name] = md5s[name]
    values = {}
    for key in keys:
        try:
            values[key] = normalised(lookup(params, key))
        except KeyError:
            missing = f"stage {stage} reads params key {key!r}, which {PARAMS_FILE} lacks"
            raise ConfigError(missing) from None
    return {"stage": stage, "code": hashes, "params": values}


def manifest_text(manifest: Mapping[str, Any]) -> str:
    """The bytes a manifest is written as: sorted keys, one entry per line (stable md5, readable diff)."""
    return json.dumps(manifest, indent=1, sort_keys=True) + "\n"


def check_manifest(stage: str, root: Path = Path("."), after_run: bool = False) -> None:
    """Refuse (one-line :class:`ConfigError`) when the manifest of ``stage`` is missing or no longer
    matches the code files and ``params.yaml`` keys it lists (compared as the manifest's JSON text);
    ``validate``, which writes the manifests, has none, nor has any stage of a pipeline without
    manifests (no ``artifacts/inputs/``). ``after_run``: the check after the stage ran."""
    path = manifest_path(stage, root)
    fix = "run `dvc repro` (or `make repro`), which runs the validate stage first"
    if not path.exists():
        if stage in MANIFEST_WRITERS or not (root / MANIFEST_DIR).is_dir():  # a pipeline without manifests
            return
        raise ConfigError(f"{path}: missing: the validate stage writes every stage's inputs manifest; {fix}")
    manifest = json.loads(path.read_text())
    when = "while the stage ran (its outputs are not recorded)" if after_run else "after the validate stage wrote it"
    for name, md5 in manifest["code"].items():
        if not (root / name).is_file() or md5_file(root / name) != md5:
            raise ConfigError(f"{path}: {name} changed {when}; {fix}")
    if manifest["params"]:
        current = yaml.safe_load((root / PARAMS_FILE).read_text()) or {}
        for key, value in manifest["params"].items():
            try:
                now = _canonical(lookup(current, key))
            except KeyError:
                now = None  # absent: differs from every stored value, null included
            if now != _canonical(value):
                raise ConfigError(f"{path}: {PARAMS_FILE} key {key!r} changed {when}; {fix}")


@lru_cache(maxsize=1)
def package_fingerprint() -> str:
    """Hash of every ``.py`` file of the dmlbench package: the code version a run records."""
    digest = hashlib.sha256()
    for path in sorted(PACKAGE_DIR.rglob("*.py")):
        digest.update(path.relative_to(PACKAGE_DIR).as_posix().encode())
        digest.update(path.read_bytes())
    return digest.hexdigest()[:16]


def inputs_fingerprint(stage: str | None = None, root: Path | None = None) -> str:
    """What a stage keeps between runs is keyed on (a training checkpoint, a finished fold model, a
    tuning study's name): the md5 of the code part of the stage's inputs manifest, so an edit of code
    the stage does not read (a report caption) keeps them and an edit of code it reads discards them.
    ``stage``/``root``: default ``DVC_STAGE``/``DVC_ROOT`` (as DVC and the runners set them). Run
    outside DVC (no stage named) or with no manifest, :func:`package_fingerprint`: any code edit then
    discards them, as does moving between the two."""
    stage = stage if stage is not None else os.environ.get("DVC_STAGE")
    root = root if root is not None else Path(os.environ.get("DVC_ROOT") or ".")
    path = manifest_path(stage, root) if stage else None
    if path is None or not path.is_file():
        return package_fingerprint()
    code = json.loads(path.read_text())["code"]
    return hashlib.md5(json.dumps(code, sort_keys=True).encode()).hexdigest()[:16]


def _canonical(value: Any) -> str:
    """The JSON text of a value as a manifest stores it (``1``, ``1.0`` and ``true`` differ)."""
    return json.dumps(value, sort_keys=True, default=str)
