"""A stage's inputs manifest: the code files and ``params.yaml`` keys one DVC stage reads, hashed.

A stage's one DVC dependency for its code and params is ``artifacts/inputs/<stage>.json`` (written
by ``validate``): the md5 of every code file and the value of every key, nothing else, so ``dvc
status`` stays cheap and an edit re-runs only the stages that read it (docs/pipeline.md, "Inputs
manifests"). Registry packages are hashed per item: :func:`registry_projection`.
"""

from __future__ import annotations

import ast
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
from dmlbench.weights_lock import LOCK_ENV, LOCK_NAME, lock_path, read_lock

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


def registry_projection(path: Path, registry: str, keep: Iterable[str]) -> str | None:
    """The md5 of registry package ``__init__`` ``path`` projected onto the members ``keep``: every
    other member (a module the file imports from its own package) removed from the imports and from
    the collections in the value of the registry dict ``registry``, the rest ``ast.unparse``d
    (comments and layout do not count). None when the file still names a removed member elsewhere,
    or has no ``registry``: then the whole file counts."""
    tree = ast.parse(path.read_text())
    parts = path.resolve().parent.parts
    package = ".".join(parts[len(parts) - parts[::-1].index("src") :]) if "src" in parts else ""  # below the last src/
    keep = set(keep)
    removed: set[str] = set()
    for node in tree.body:
        if isinstance(node, ast.ImportFrom) and not node.level and node.module == package:
            members = [a for a in node.names if _is_module(path.parent, a.name)]
            removed |= {a.asname or a.name for a in members if a.name not in keep}
            node.names = [a for a in node.names if (a.asname or a.name) not in removed]
    tree.body = [n for n in tree.body if not (isinstance(n, ast.ImportFrom) and not n.names)]
    values = [value for value in (_assigned(n, registry) for n in tree.body) if value is not None]
    if not values:
        return None

    def names_removed(node: ast.AST) -> bool:
        return any(isinstance(n, ast.Name) and n.id in removed for n in ast.walk(node))

    for value in values:
        for inner in ast.walk(value):
            if isinstance(inner, (ast.Tuple, ast.List, ast.Set)):
                inner.elts = [e for e in inner.elts if not names_removed(e)]
            elif isinstance(inner, ast.Dict):
                pairs = [(k, v) for k, v in zip(inner.keys, inner.values, strict=True) if not names_removed(v)]
                inner.keys, inner.values = [k for k, _ in pairs], [v for _, v in pairs]
    if names_removed(tree):
        return None  # a removed member is used beyond its import and registry entry
    return hashlib.md5(ast.unparse(tree).encode()).hexdigest()


def _is_module(folder: Path, name: str) -> bool:
    return (folder / f"{name}.py").is_file() or (folder / name).is_dir()


def _assigned(node: ast.stmt, name: str) -> ast.expr | None:
    """The value ``node`` assigns to ``name``, if it is such an assignment."""
    if isinstance(node, ast.Assign) and any(isinstance(t, ast.Name) and t.id == name for t in node.targets):
        return node.value
    if isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name) and node.target.id == name:
        return node.value
    return None


def build_manifest(stage: str, code: Iterable[str], keys: Iterable[str], params: Mapping[str, Any],
                   root: Path, md5s: dict[str, str] | None = None,
                   projections: Mapping[str, Mapping[str, Any]] | None = None,
                   weights: Mapping[str, str] | None = None) -> dict[str, Any]:  # fmt: skip
    """The manifest of ``stage``: ``{"stage", "code": {file: md5}, "params": {key: value}}``
    (``md5s``: a cache shared between stages), plus ``"projected": {file: {"registry", "keep"}}``
    for each registry ``__init__`` of ``projections`` hashed as its projection
    (:func:`registry_projection`; a file that cannot be projected is hashed whole, unlisted), plus
    ``"weights": {lock key: "<sha256>@<commit>"}``, the weights lock's entries of the pretrained
    files its backbones load (a re-pinned file re-runs exactly the stages that load it)."""
    md5s = {} if md5s is None else md5s
    hashes = {}
    projected: dict[str, Any] = {}
    for name in code_files(code, root):
        spec = (projections or {}).get(name)
        digest = registry_projection(root / name, spec["registry"], spec["keep"]) if spec else None
        if digest is not None and spec is not None:
            hashes[name] = digest
            projected[name] = {"registry": spec["registry"], "keep": sorted(spec["keep"])}
            continue
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
    manifest: dict[str, Any] = {"stage": stage, "code": hashes, "params": values}
    if projected:
        manifest["projected"] = projected
    if weights:
        manifest["weights"] = dict(sorted(weights.items()))
    return manifest


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
    projected = manifest.get("projected", {})
    for name, md5 in manifest["code"].items():
        if not (root / name).is_file():
            raise ConfigError(f"{path}: {name} changed {when}; {fix}")
        spec = projected.get(name)
        now = registry_projection(root / name, spec["registry"], spec["keep"]) if spec else md5_file(root / name)
        if now != md5:
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
    if manifest.get("weights"):
        lock = read_lock()
        if lock_path().resolve() != (root / LOCK_NAME).resolve():  # dvc.yaml tracks weights.lock only
            fix = f"run `dvc repro --force validate` ({LOCK_ENV} names a lock DVC does not track), then `dvc repro`"
        for name, pin in manifest["weights"].items():
            entry = lock.get(name)
            if entry is None or f"{entry.sha256}@{entry.revision}" != pin:
                raise ConfigError(f"{path}: the entry {name} of {lock_path()} changed {when}; {fix}")


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
