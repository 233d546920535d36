"""Hugging Face Hub weights files, pinned by the weights lock (:mod:`dmlbench.weights_lock`).

Files live in huggingface_hub's cache (``$HF_HUB_CACHE``, ``$HF_HOME/hub`` or
``~/.cache/huggingface/hub``), where timm looks too; ``HF_ENDPOINT`` names a mirror.
:func:`pin` records the commit ``main`` points at (``X-Repo-Commit``) and the published sha256
(``X-Linked-Etag``, the LFS object id) via ``get_hf_file_metadata``, or from the cache without a
request (``refs/main``, the blob's name); no commit or a non-sha256 ETag is refused in one line.
:func:`download` fetches at the locked commit and checks the sha256 (a mismatch deletes the file);
:func:`pinned_file` checks it once per process. ``DMLBENCH_OFFLINE=1`` or ``HF_HUB_OFFLINE=1``:
no request at all, a missing file fails in one line naming ``make fetch``."""

from __future__ import annotations

import os
import re
from pathlib import Path

from dmlbench.errors import WeightsError
from dmlbench.models.base import HubFile
from dmlbench.models.weights import OFFLINE_FIX, offline, sha256_file, url_check_skipped
from dmlbench.weights_lock import LockEntry, lock_path, locked, record

HUB = "https://huggingface.co"
ENDPOINT_ENV = "HF_ENDPOINT"
HEAD_TIMEOUT = 10.0  # s
COMMIT = re.compile(r"^[0-9a-f]{40}$")
SHA256 = re.compile(r"^[0-9a-f]{64}$")
_verified: dict[tuple[str, int, int], str] = {}  # (path, size, mtime_ns) -> sha256, this process


def endpoint() -> str:
    """The Hub's address: ``$HF_ENDPOINT`` (huggingface_hub's variable: a mirror), else huggingface.co."""
    return os.environ.get(ENDPOINT_ENV, "").strip().rstrip("/") or HUB


def hub_offline() -> bool:
    """No request to the Hub: ``DMLBENCH_OFFLINE`` or huggingface_hub's ``HF_HUB_OFFLINE`` set."""
    return offline() or os.environ.get("HF_HUB_OFFLINE", "").strip().lower() not in ("", "0", "false", "no")


def cache_dir() -> Path:
    """huggingface_hub's cache, resolved as it resolves it (read now, so a changed variable counts)."""
    if value := os.environ.get("HF_HUB_CACHE", "").strip():
        return Path(value).expanduser()
    if value := os.environ.get("HF_HOME", "").strip():
        return Path(value).expanduser() / "hub"
    xdg = os.environ.get("XDG_CACHE_HOME", "").strip() or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(xdg) / "huggingface" / "hub"


def url(hub: HubFile, revision: str) -> str:
    """Where the Hub serves ``hub`` at ``revision``."""
    return f"{endpoint()}/{hub.repo}/resolve/{revision}/{hub.filename}"


def repo_folder(hub: HubFile) -> Path:
    return cache_dir() / f"models--{hub.repo.replace('/', '--')}"


def snapshot_path(hub: HubFile, commit: str) -> Path:
    """Where huggingface_hub keeps the file of ``commit``."""
    return repo_folder(hub) / "snapshots" / commit / hub.filename


def cached_commit(hub: HubFile) -> str | None:
    """The commit of the cached copy: ``refs/main``'s when its snapshot holds the file, else the one
    snapshot that holds it; None when none (or several, with no ref to choose) does."""
    folder = repo_folder(hub)
    ref = folder / "refs" / "main"
    if ref.is_file():
        commit = ref.read_text().strip()
        if COMMIT.match(commit) and snapshot_path(hub, commit).is_file():
            return commit
    snapshots = folder / "snapshots"
    holding = [p.name for p in snapshots.iterdir() if COMMIT.match(p.name) and (p / hub.filename).is_file()] if (
        snapshots.is_dir()
    ) else []  # fmt: skip
    return holding[0] if len(holding) == 1 else None


def cached_etag(path: Path) -> str | None:
    """The sha256 the Hub published for a cached file: its blob's name (huggingface_hub links the
    snapshot entry to ``blobs/<ETag>``); None for a copy that is not such a link."""
    if not path.is_symlink():
        return None
    name = Path(os.readlink(path)).name
    return name if SHA256.match(name) else None


def published(backbone: str, hub: HubFile, revision: str = "main", timeout: float = HEAD_TIMEOUT) -> tuple[str, str]:
    """(commit, sha256) the Hub publishes now for ``hub`` at ``revision``; one-line WeightsError when
    it cannot be asked, names no commit, or publishes no sha256 (a file not in LFS)."""
    from huggingface_hub import get_hf_file_metadata, hf_hub_url

    address = hf_hub_url(hub.repo, hub.filename, revision=revision, endpoint=endpoint())
    try:
        meta = get_hf_file_metadata(address, timeout=timeout, endpoint=endpoint())
    except Exception as exc:  # noqa: BLE001 - HTTP errors (OSErrors), and httpx's own for no network or DNS
        reason = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
        raise WeightsError(
            f"backbones.{backbone}: cannot ask the Hub for {hub.name} ({type(exc).__name__}: {reason[:200]}); "
            f"run `make fetch` where {endpoint()} is reachable, or put it at {repo_folder(hub)} (a Hub cache copy)"
        ) from None
    if not meta.commit_hash or not COMMIT.match(meta.commit_hash):
        raise WeightsError(
            f"backbones.{backbone}: the Hub named no commit for {address} (X-Repo-Commit: {meta.commit_hash!r}), "
            "so the file cannot be pinned; try again later"
        )
    if not meta.etag or not SHA256.match(meta.etag):
        raise WeightsError(
            f"backbones.{backbone}: the Hub publishes no sha256 for {address} (X-Linked-Etag/ETag {meta.etag!r} is "
            "not an LFS object id), so its bytes cannot be verified; pin another file"
        )
    return meta.commit_hash, meta.etag


def _checked_sha256(path: Path) -> str:
    stat = path.stat()
    key = (str(path.resolve()), stat.st_size, stat.st_mtime_ns)
    if key not in _verified:
        _verified[key] = sha256_file(path)
    return _verified[key]


def pin(backbone: str, hub: HubFile, timeout: float = HEAD_TIMEOUT) -> LockEntry:
    """The lock's entry for ``hub``, recorded first when there is none: from the cache (commit from
    its refs/snapshots, published sha256 from its blob name, checked against the bytes), else from
    the Hub (:func:`published`). Offline without either: one-line WeightsError."""
    entry = locked(hub.name)
    if entry is not None:
        return entry
    commit = cached_commit(hub)
    if commit is not None:
        path = snapshot_path(hub, commit)
        actual = _checked_sha256(path)
        expected = cached_etag(path)
        if expected is None and not hub_offline():
            expected = published(backbone, hub, commit, timeout)[1]
        if expected is None:
            raise WeightsError(
                f"backbones.{backbone}: {path} is not linked to a blob named by its sha256, so its published sha256 "
                f"is unknown offline; {OFFLINE_FIX}"
            )
        if actual != expected:
            raise WeightsError(
                f"backbones.{backbone}: {path} has sha256 {actual}, but the Hub published {expected} for it; delete "
                f"{repo_folder(hub)} and run `make fetch`"
            )
        return record(hub.name, LockEntry(actual, url(hub, commit), commit))
    if hub_offline():
        raise WeightsError(
            f"backbones.{backbone}: {hub.name} is neither pinned in {lock_path()} nor in the Hub cache {cache_dir()}; "
            + OFFLINE_FIX
        )
    commit, sha256 = published(backbone, hub, "main", timeout)
    return record(hub.name, LockEntry(sha256, url(hub, commit), commit))


def download(backbone: str, hub: HubFile, entry: LockEntry) -> Path:
    """``hf_hub_download`` of ``hub`` at the locked commit into the cache, its sha256 checked against
    the lock (a mismatch deletes the download and fails in one line)."""
    from huggingface_hub import hf_hub_download

    try:
        path = Path(
            hf_hub_download(hub.repo, hub.filename, revision=entry.revision, cache_dir=cache_dir(), endpoint=endpoint())
        )
    except Exception as exc:  # noqa: BLE001 - HTTP errors (OSErrors), and httpx's own for no network or DNS
        reason = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
        raise WeightsError(
            f"backbones.{backbone}: cannot download {entry.url} ({type(exc).__name__}: {reason[:200]}); put the file "
            f"at {snapshot_path(hub, entry.revision)} or set backbones.{backbone}.weights_path to a copy"
        ) from None
    actual = sha256_file(path)
    if actual != entry.sha256:
        blob = path.resolve()
        path.unlink(missing_ok=True)
        blob.unlink(missing_ok=True)
        raise WeightsError(
            f"backbones.{backbone}: {entry.url} has sha256 {actual}, but {lock_path()} pins {entry.sha256} (the "
            "Hub's published digest at the first pin); the download was deleted"
        )
    return path


def verify(backbone: str, hub: HubFile, path: Path, entry: LockEntry) -> None:
    """One-line WeightsError when ``path``'s sha256 is not the lock's for ``hub``."""
    actual = _checked_sha256(path)
    if actual != entry.sha256:
        raise WeightsError(
            f"backbones.{backbone}: {path} has sha256 {actual}, but {lock_path()} pins {entry.sha256} for {hub.name} "
            f"({entry.url}); delete the file and run `make fetch` again"
        )


def pinned_file(backbone: str, hub: HubFile, weights_path: Path | None = None) -> Path:
    """A local copy of ``hub`` whose sha256 is the lock's (pinned first when not yet pinned):
    ``weights_path`` when given (never downloaded), else the Hub cache's file at the locked commit
    (downloaded there when missing and online)."""
    entry = pin(backbone, hub)
    if weights_path is not None:
        if not weights_path.is_file():
            raise WeightsError(
                f"backbones.{backbone}.weights_path: {weights_path} does not exist; download {entry.url} "
                f"(sha256 {entry.sha256}) there, or unset it to use the Hub cache"
            )
        path = weights_path
    else:
        path = snapshot_path(hub, entry.revision)
        if not path.is_file():
            if hub_offline():
                raise WeightsError(f"backbones.{backbone}: {hub.name} is not at {path}; " + OFFLINE_FIX)
            path = download(backbone, hub, entry)
    verify(backbone, hub, path, entry)
    return path


def hub_file_problem(
    backbone: str, hub: HubFile, weights_path: Path | None = None, fetch: bool = False, timeout: float = HEAD_TIMEOUT
) -> str | None:
    """The pre-flight's question for a Hub file (one line, or None when fine): pinned (pinning it now
    when it is not), and here with the locked sha256, or published at the locked commit with that
    sha256 (one HEAD request; none with ``DMLBENCH_SKIP_URL_CHECK=1``); ``fetch``: downloaded now."""
    try:
        entry = pin(backbone, hub, timeout)
        if fetch or weights_path is not None or hub_offline() or snapshot_path(hub, entry.revision).is_file():
            pinned_file(backbone, hub, weights_path)
        elif not url_check_skipped():
            sha256 = published(backbone, hub, entry.revision, timeout)[1]
            if sha256 != entry.sha256:
                return (
                    f"backbones.{backbone}: the Hub publishes sha256 {sha256} for {entry.url}, but {lock_path()} pins "
                    f"{entry.sha256}; remove its entry {hub.name} to re-pin it knowingly"
                )
    except WeightsError as exc:
        return str(exc)
    return None
