"""What to run: the stale DVC stages and everything downstream of them, in dependency order."""

from __future__ import annotations

import contextlib
import subprocess
import sys
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from dmlbench import dvc_adapter as dvc
from dmlbench import paths
from dmlbench.pipeline.lockfile import prune_lock
from dmlbench.stage_inputs import manifest_path

VALIDATE = "validate"  # the stage that writes every other stage's inputs manifest (dmlbench.pipeline.manifests)


@dataclass(frozen=True)
class Plan:
    """Stages to run (topological order) and, for each, the planned stages it waits for."""

    order: list[str]
    waits_for: dict[str, set[str]]
    total: int = 0  # pipeline stages in dvc.yaml (order: the stale ones and what follows them)
    stale: frozenset[str] | None = None  # stale now (the others run only if still changed when reached)
    # validate must run before the rest can be planned: it is stale, or a stale stage's manifest is missing
    refresh_inputs: bool = False
    ran_first: tuple[str, ...] = ()  # run (and recorded) while planning, before ``order``


def make_plan(root: Path = Path(".")) -> Plan:
    """Stale pipeline stages and all their descendants, from DVC's own graph and status."""
    import networkx as nx

    with contextlib.chdir(root), dvc.open_repo(".") as repo:  # stage names as DVC gives them in the root
        graph = dvc.stage_graph(repo)  # edges: dependent stage -> stage it depends on
        pipeline = [s for s in graph.nodes if dvc.is_pipeline_stage(s)]
        by_name = {s.addressing: s for s in pipeline if not s.frozen}  # frozen: never run, as by dvc repro
        stale = [name for name in dvc.stale_stages(repo) if name in by_name]
        todo: set[str] = set()
        for name in stale:
            todo.add(name)
            todo.update(s.addressing for s in nx.ancestors(graph, by_name[name]) if s.addressing in by_name)
        waits_for = {
            name: {dep.addressing for dep in graph.successors(by_name[name]) if dep.addressing in todo} for name in todo
        }
        order = [s.addressing for s in reversed(list(nx.topological_sort(graph))) if s.addressing in todo]
        missing = [name for name in stale if _reads_manifest(by_name[name]) and not manifest_path(name).exists()]
        refresh = VALIDATE in by_name and (VALIDATE in stale or bool(missing))
        prune_orphans(repo, pipeline)
    return Plan(order, waits_for, len(pipeline), frozenset(stale), refresh)


def _reads_manifest(stage: Any) -> bool:
    """Whether a DVC stage depends on its own inputs manifest (every stage of dvc.yaml but validate)."""
    own = manifest_path(stage.addressing).as_posix()
    return any(dep.def_path == own for dep in stage.deps)


def prune_orphans(repo: Any, stages: Iterable[Any]) -> None:
    """Drop the lock entries of stages removed from ``dvc.yaml`` (DVC keeps them forever:
    treeverse/dvc#5293), one line saying how many."""
    names_by_lock: dict[Path, set[str]] = {}
    for stage in stages:
        names_by_lock.setdefault(dvc.lock_file(stage), set()).add(stage.name)
    with repo.lock:
        for lockfile, names in names_by_lock.items():
            orphans = prune_lock(lockfile, names)
            if orphans:
                print(f"{lockfile.name}: removed {len(orphans)} entries of stages no longer in dvc.yaml "
                      f"({orphans[0]}{', ...' if len(orphans) > 1 else ''})")  # fmt: skip


def record_empty_dropbox(root: Path) -> None:
    """``data.dvc`` tracks the archive drop-box ``data/``, committed empty; a fresh clone has neither the
    folder nor its (empty) cache entry, so ``dvc status`` would call it "not in cache" forever. While
    ``data/`` is missing or empty, create it and ``dvc commit`` it: the hash stays the committed one and
    ``data.dvc`` is unchanged. A drop-box holding archives is the user's to ``dvc add`` (docs/datasets.md)."""
    dropbox = root / paths.DROPBOX
    if not (root / "data.dvc").exists() or (dropbox.exists() and any(dropbox.iterdir())):
        return
    dropbox.mkdir(exist_ok=True)
    subprocess.run([sys.executable, "-m", "dvc", "commit", "--force", "--quiet", "data.dvc"], cwd=root, check=False)
