"""The weights lock (``weights.lock`` at the repository root, committed like ``dvc.lock``): the Hub
commit and sha256 of every pinned Hub weights file, ``files: {<repo>/<file>: {sha256, url,
revision}}``; torchvision's files are pinned in code (:mod:`dmlbench.models.weights`). Below the
models, so that the inputs manifests read the pins without importing a backbone; outside the
package, so that pinning a file changes no code hash. ``make fetch``, the pre-flight and
``validate`` pin what the grid needs (stages only read it). Writes are atomic under a file lock
(``.weights.lock.lock``); an entry is never replaced (remove it by hand to re-pin).
``DMLBENCH_WEIGHTS_LOCK`` names another lock file.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

import yaml

from dmlbench.errors import WeightsError

LOCK_ENV = "DMLBENCH_WEIGHTS_LOCK"
LOCK_NAME = "weights.lock"
HEADER = (
    "# The Hugging Face Hub commit and sha256 of each pinned pretrained weights file, recorded when\n"
    "# it was first pinned (make fetch, the pre-flight) and checked at every load. Commit this file.\n"
)
WRITE_TIMEOUT = 120.0  # s to wait for another writer's file lock


@dataclass(frozen=True)
class LockEntry:
    """What was recorded for one file: its digest, where it came from and at which Hub commit."""

    sha256: str
    url: str
    revision: str


def lock_path() -> Path:
    """The lock file in use: ``$DMLBENCH_WEIGHTS_LOCK``, else ``weights.lock`` at the project root
    (DVC's root when DVC runs the stage, else the current directory)."""
    override = os.environ.get(LOCK_ENV, "").strip()
    if override:
        return Path(override).expanduser()
    return Path(os.environ.get("DVC_ROOT") or Path.cwd()) / LOCK_NAME


def read_lock(path: Path | None = None) -> dict[str, LockEntry]:
    """The recorded files by name (empty when the lock does not exist yet); a malformed lock: WeightsError."""
    path = path or lock_path()
    if not path.is_file():
        return {}
    try:
        data = yaml.safe_load(path.read_text()) or {}
        files = data.get("files") or {}
        return {name: LockEntry(str(e["sha256"]), str(e["url"]), str(e["revision"])) for name, e in files.items()}
    except (yaml.YAMLError, AttributeError, KeyError, TypeError) as exc:
        raise WeightsError(f"{path}: not a weights lock ({type(exc).__name__}: {exc}); restore it from git") from None


def locked(name: str, path: Path | None = None) -> LockEntry | None:
    """The entry recorded for ``name`` (``<hub repo>/<file name>``), or None."""
    return read_lock(path).get(name)


def ensure_lock(path: Path | None = None) -> Path:
    """The lock file, written empty (``files: {}``) when it does not exist: the validate stage
    depends on it, so it must exist before ``dvc repro`` even when no file is pinned."""
    path = path or lock_path()
    if not path.exists():
        _write(path, {})
    return path


def _write(path: Path, files: dict[str, LockEntry]) -> None:
    """Replace the lock's text by ``files`` (a temporary file renamed over it)."""
    text = yaml.safe_dump({"files": {k: vars(v) for k, v in sorted(files.items())}}, sort_keys=True)
    temporary = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    temporary.write_text(HEADER + text)
    temporary.replace(path)


def record(name: str, entry: LockEntry, path: Path | None = None) -> LockEntry:
    """Add ``name`` to the lock, under its file lock, unless another writer recorded it first;
    the entry the lock now holds. Written to a temporary file, then renamed over the lock."""
    from filelock import FileLock, Timeout

    path = path or lock_path()
    path.parent.mkdir(parents=True, exist_ok=True)
    guard = path.with_name(f".{path.name}.lock")
    try:
        with FileLock(str(guard), timeout=WRITE_TIMEOUT):
            files = read_lock(path)
            if name in files:  # pinned by another process meanwhile: theirs stands
                return files[name]
            files[name] = entry
            _write(path, files)
    except Timeout:
        raise WeightsError(
            f"{path}: another process has held its file lock {guard} for {WRITE_TIMEOUT:.0f} s; if none runs, "
            "delete that file"
        ) from None
    except OSError as exc:  # a read-only checkout
        raise WeightsError(
            f"{path}: cannot record {name} ({exc.strerror or exc}); run `make fetch` in a writable checkout, or "
            f"set {LOCK_ENV} to a writable copy of the lock"
        ) from None
    return entry
