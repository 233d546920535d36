"""The ``validate`` stage's second job: one inputs manifest per pipeline stage (:mod:`dmlbench.stage_inputs`).

What each stage reads is declared per ``dvc.yaml`` entry in ``stages/reads.yaml`` (``code``, ``params``:
DVC's templates such as ``src/dmlbench/losses/${item.loss}.py``). Not in ``dvc.yaml`` itself: DVC
refuses ``dvc.yaml`` as a dependency, and the validate stage must re-run when a list changes (it
depends on ``stages/``). Each list is set as the entry's ``meta.reads`` (which DVC ignores) and every
stage of ``dvc.yaml`` is resolved by DVC's own parser (``dvc.parsing.DataResolver``, as ``dvc stage
list`` does, ``foreach``/``matrix`` items against ``params.yaml``), so a template means for a manifest
exactly what it meant as a DVC dep. Each such stage gets ``artifacts/inputs/<stage>.json``, which must
be one of its deps. Written all at once into a fresh folder renamed over the old one: a crash leaves
the previous manifests whole.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

import yaml

from dmlbench.errors import ConfigError
from dmlbench.io import atomic_dir
from dmlbench.params.files import read_params_file
from dmlbench.stage_inputs import MANIFEST_DIR, PARAMS_FILE, build_manifest, manifest_path, manifest_text, params_keys

PIPELINE_FILE = "dvc.yaml"
READS_FILE = Path("stages/reads.yaml")


def pipeline_definition(root: Path = Path(".")) -> dict[str, Any]:
    """``dvc.yaml`` as a mapping, each entry's ``stages/reads.yaml`` lists set as its ``meta.reads``
    (entries of stages not in this ``dvc.yaml`` are left out: a pipeline cut down to some stages; a
    stage that depends on its manifest without an entry is refused by :func:`stage_reads`)."""
    definition = yaml.safe_load((root / PIPELINE_FILE).read_text())
    reads = yaml.safe_load((root / READS_FILE).read_text()) or {}
    entries = definition.get("stages") or {}
    for group, lists in reads.items():
        if group not in entries:
            continue
        body = entries[group].get("do", entries[group])
        body["meta"] = {**(body.get("meta") or {}), "reads": lists}
    return definition


def resolved_stages(root: Path = Path("."), definition: dict[str, Any] | None = None) -> dict[str, dict[str, Any]]:
    """Every stage of ``root``'s pipeline (:func:`pipeline_definition`, unless given) as DVC generates
    it: name -> resolved definition."""
    from dvc.parsing import DataResolver
    from dvc.repo import Repo

    definition = pipeline_definition(root) if definition is None else definition
    with Repo(str(root)) as repo:
        resolved = DataResolver(repo, str(root), definition).resolve()
    return dict(resolved.get("stages", {}))


def stage_reads(name: str, stage: Mapping[str, Any]) -> tuple[list[str], list[str]] | None:
    """``(code entries, params keys)`` a resolved stage declares under ``meta.reads``; None when it
    declares none. :class:`ConfigError` when its manifest is not among its deps, or is with no reads."""
    meta = stage.get("meta") or {}
    reads = meta.get("reads") if isinstance(meta, Mapping) else None
    expected = manifest_path(name).as_posix()
    depends = expected in [str(dep) for dep in stage.get("deps") or []]
    if reads is None:
        if depends:
            raise ConfigError(
                f"{PIPELINE_FILE}: stage {name} depends on {expected}, but {READS_FILE} has no entry for it"
            )
        return None
    if not depends:
        raise ConfigError(f"{PIPELINE_FILE}: stage {name} must depend on {expected} (what {READS_FILE} says it reads)")
    return list(reads.get("code") or []), params_keys(reads.get("params") or [])


def write_manifests(root: Path = Path("."), params: Mapping[str, Any] | None = None) -> int:
    """Write every stage's manifest under ``root/artifacts/inputs`` (the folder replaced whole);
    the number written. ``params``: the values (default: ``root/params.yaml``, the file DVC resolves
    the stages from and the stages check their manifests against)."""
    if params is None:
        params = read_params_file(root / PARAMS_FILE)
    md5s: dict[str, str] = {}
    manifests = {}
    for name, stage in resolved_stages(root).items():
        reads = stage_reads(name, stage)
        if reads is not None:
            manifests[name] = build_manifest(name, reads[0], reads[1], params, root, md5s)
    with atomic_dir(root / MANIFEST_DIR) as folder:
        for name, manifest in manifests.items():
            (folder / manifest_path(name, Path(".")).name).write_text(manifest_text(manifest))
    return len(manifests)
