"""A workspace of its own for a preset: ``artifacts/presets/<name>/``, a detached git worktree of the
main checkout's HEAD (DVC reads only ``params.yaml`` and keeps one ``dvc.lock`` per workspace).

It has its own ``params.yaml`` (the preset over params.yaml), ``dvc.lock``, report and
``artifacts/``; the main checkout's DVC cache (``.dvc/config.local``) and ``data/`` drop-box (a
link). It runs HEAD's committed code (its ``src/`` first on ``PYTHONPATH``); when HEAD moved, the
worktree follows it and keeps its ``dvc.lock``, so only stale stages run. See docs/presets.md.
"""

from __future__ import annotations

import os
import subprocess
from dataclasses import dataclass
from pathlib import Path

from dmlbench import dvc_adapter
from dmlbench.errors import ConfigError
from dmlbench.io import atomic_path

WORKSPACES = Path("artifacts") / "presets"
CODE_PATHS = ("src", "stages", "dvc.yaml")  # what a preset workspace runs: HEAD's version of these


@dataclass(frozen=True)
class Workspace:
    """Where a preset runs and where its results land (absolute paths)."""

    name: str
    root: Path  # the worktree
    commit: str  # the main checkout's HEAD it runs

    @property
    def report(self) -> Path:
        return self.root / "reports" / "report.md"

    @property
    def logs(self) -> Path:
        return self.root / "artifacts" / "logs"


def _git(args: list[str], cwd: Path) -> str:
    result = subprocess.run(["git", *args], cwd=cwd, capture_output=True, text=True, check=False)
    if result.returncode != 0:
        message = (result.stderr.strip().splitlines() or ["(no output)"])[-1]
        raise ConfigError(f"git {' '.join(args)} failed in {cwd}: {message}")
    return result.stdout.strip()


def workspace_dir(main: Path, name: str) -> Path:
    return Path(main).resolve() / WORKSPACES / name


def uncommitted_code(main: Path) -> list[str]:
    """Tracked files of the code a preset runs that differ from HEAD in the main checkout."""
    out = _git(["status", "--porcelain", "--untracked-files=no", "--", *CODE_PATHS], Path(main))
    return [line[3:] for line in out.splitlines() if line.strip()]


def _write(path: Path, text: str) -> None:
    if path.is_file() and path.read_text() == text:
        return
    with atomic_path(path) as tmp:
        tmp.write_text(text)


def _link_dropbox(main: Path, root: Path) -> None:
    """``<workspace>/data`` -> the main checkout's ``data/`` (created if absent)."""
    target = main / "data"
    target.mkdir(exist_ok=True)
    link = root / "data"
    if link.is_symlink() and Path(os.readlink(link)) == target:
        return
    if link.is_symlink() or link.is_file():
        link.unlink()
    elif link.exists():
        raise ConfigError(f"{link}: a directory, not a link to {target}; move its files to {target}/ and remove it")
    link.symlink_to(target, target_is_directory=True)


def _link_weights_lock(main: Path, root: Path) -> None:
    """``<workspace>/weights.lock`` -> the main checkout's, the lock its stages load through
    (:func:`environment`), so that a re-pin there re-runs the workspace's validate stage, which
    depends on it."""
    link, target = root / "weights.lock", main / "weights.lock"
    if link.is_symlink() and Path(os.readlink(link)) == target:
        return
    link.unlink(missing_ok=True)
    link.symlink_to(target)


def prepare_workspace(main: Path, name: str, params_yaml: str) -> Workspace:
    """Create (or bring to HEAD) the preset's worktree, share the DVC cache and the drop-box, and
    write its ``params.yaml`` (via a temporary file). Cheap: no stage runs here."""
    main = Path(main).resolve()
    commit = _git(["rev-parse", "HEAD"], main)
    root = workspace_dir(main, name)
    if not (root / ".git").exists():
        if root.exists() and any(root.iterdir()):
            raise ConfigError(f"{root}: exists but is not a preset workspace (no .git); remove it and re-run")
        _git(["worktree", "prune"], main)  # forget a workspace that was deleted by hand
        _git(["worktree", "add", "--quiet", "--detach", str(root), commit], main)
        (root / "dvc.lock").unlink(missing_ok=True)  # the demo's: the preset's stages start unrecorded
    elif _git(["rev-parse", "HEAD"], root) != commit:
        lock = root / "dvc.lock"
        kept = lock.read_bytes() if lock.exists() else None
        _git(["checkout", "--quiet", "--force", "--detach", commit], root)
        if kept is None:
            lock.unlink(missing_ok=True)
        else:
            lock.write_bytes(kept)
    _write(root / ".dvc" / "config.local", f"[cache]\n    dir = {dvc_adapter.cache_dir(main)}\n")
    _link_dropbox(main, root)
    _link_weights_lock(main, root)
    _write(root / "params.yaml", params_yaml)
    return Workspace(name, root, commit)


def environment(workspace: Workspace, main: Path, base: dict[str, str] | None = None) -> dict[str, str]:
    """The environment of a preset run: the worktree's code first on ``PYTHONPATH``, MLflow in the
    main checkout's store unless ``MLFLOW_TRACKING_URI`` says otherwise, and the main checkout's
    weights lock (the one to commit) unless ``DMLBENCH_WEIGHTS_LOCK`` names another."""
    env = dict(os.environ if base is None else base)
    env.pop("DVC_ROOT", None)
    env["PYTHONPATH"] = os.pathsep.join([str(workspace.root / "src"), *filter(None, [env.get("PYTHONPATH")])])
    env.setdefault("DMLBENCH_WEIGHTS_LOCK", str(Path(main).resolve() / "weights.lock"))  # one lock per project
    env.setdefault("MLFLOW_TRACKING_URI", f"sqlite:///{Path(main).resolve() / 'mlflow.db'}")
    return env
