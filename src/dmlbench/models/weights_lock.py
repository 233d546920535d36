"""A committed lock of sha256 digests for weights files that publish none (trust on first use).

torchvision's files carry a sha256 prefix in their name and OpenAI's CLIP URLs the full digest,
so those are pinned in code (:mod:`dmlbench.models.weights`). The DINO and DINOv2 releases
(``dl.fbaipublicfiles.com``) and the Hugging Face Hub files timm loads publish no digest next to
the file, so the first download records one here, in ``weights_lock.yaml`` beside this module
(``files: {<repo>/<file>: {sha256, url, revision}}``, ``revision`` the Hub commit the file was
fetched at), and every later load is checked against it: a file whose bytes changed is refused in
one line. Commit the lock after a first download, as one commits ``dvc.lock`` or ``poetry.lock``.
``DMLBENCH_WEIGHTS_LOCK`` names another lock file (tests, read-only checkouts).
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

import yaml

from dmlbench.models.weights import WeightsError, sha256_file

LOCK_ENV = "DMLBENCH_WEIGHTS_LOCK"
DEFAULT_LOCK = Path(__file__).with_name("weights_lock.yaml")
HEADER = (
    "# sha256 of pretrained weights files that publish no digest, recorded at their first download\n"
    "# (dmlbench.models.weights_lock) and checked on every later load. Commit this file.\n"
)


@dataclass(frozen=True)
class LockEntry:
    """What was recorded for one file: its digest, where it came from and at which Hub revision."""

    sha256: str
    url: str
    revision: str


def lock_path() -> Path:
    """The lock file in use: ``$DMLBENCH_WEIGHTS_LOCK``, else ``weights_lock.yaml`` beside this module."""
    override = os.environ.get(LOCK_ENV, "").strip()
    return Path(override).expanduser() if override else DEFAULT_LOCK


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


def record(name: str, entry: LockEntry, path: Path | None = None) -> None:
    """Add ``name`` to the lock (written to a temporary file, then moved into place)."""
    path = path or lock_path()
    files = {key: vars(value) for key, value in read_lock(path).items()}
    files[name] = vars(entry)
    path.parent.mkdir(parents=True, exist_ok=True)
    temporary = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    temporary.write_text(HEADER + yaml.safe_dump({"files": dict(sorted(files.items()))}, sort_keys=True))
    temporary.replace(path)


def verify_or_record(backbone: str, name: str, file: Path, url: str, revision: str) -> str:
    """The sha256 of ``file``, checked against the lock's entry for ``name``; recorded there when
    there is none yet (first use). A different digest: one-line :class:`WeightsError`."""
    actual = sha256_file(file)
    entry = locked(name)
    if entry is None:
        record(name, LockEntry(actual, url, revision))
        return actual
    if actual != entry.sha256:
        raise WeightsError(
            f"backbones.{backbone}: {file} has sha256 {actual}, but {lock_path()} recorded {entry.sha256} for "
            f"{name} ({entry.url}); delete the file and download it again, or remove its lock entry to trust "
            "the new file knowingly"
        )
    return actual
