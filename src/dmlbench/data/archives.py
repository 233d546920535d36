"""Dataset archives: params overrides, mirrors, first-use checksums, the shared ``fetch``, pre-flight.
Each archive comes from the drop-box ``data/`` (verified) or is downloaded there, then is unpacked into
``artifacts/raw/<dataset>/`` atomically once its content check passes; one without md5 is trusted on
first use (its sha256 in ``data/<file>.sha256``: docs/datasets.md, "Checksums recorded on first use")."""

from __future__ import annotations

import hashlib
import os
import shutil
import sys
import urllib.parse
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from pydantic import Field

from dmlbench.data.base import Archive, Counts, DatasetParams, DatasetSpec, SourceParams, UrlCheck
from dmlbench.data.content import ReadAnnotations, content_check
from dmlbench.data.download import CHUNK_BYTES, download, offline, offline_error
from dmlbench.data.extract import EncryptedArchive, extract_archive
from dmlbench.errors import DataError
from dmlbench.io import atomic_dir, atomic_path, md5_file, write_json
from dmlbench.schema import StrictModel

__all__ = ["ArchiveSource", "ArchiveSourceParams", "archive_fetcher", "extract_archive", "fetch_archives"]

ARCHIVES_RECORD = "archives.json"
MD5_PATTERN = r"^[0-9a-f]{32}$"
URL_PATTERN = r"^https?://\S+$"


class ArchiveSource(StrictModel):
    """A mirror for one archive: ``url`` (http or https) and/or ``md5`` replace the published ones."""

    url: str | None = Field(None, pattern=URL_PATTERN)
    md5: str | None = Field(None, pattern=MD5_PATTERN)


class ArchiveSourceParams(SourceParams):
    """Source of an archive dataset: an :class:`ArchiveSource` per archive key; ``allow_subset``: accept
    fewer images or classes than published (said in info.json and the report), else refused."""

    allow_subset: bool = False


@dataclass(frozen=True)
class ResolvedArchive:
    """An archive with the params overrides applied (a ``url`` replaces the published URL and mirrors)."""

    archive: Archive
    url: str | None
    md5: str | None
    mirrors: tuple[str, ...] = ()

    @property
    def filename(self) -> str:
        return self.archive.filename

    @property
    def urls(self) -> tuple[str, ...]:
        """Where to download it, in order."""
        return ((self.url,) if self.url else ()) + self.mirrors

    @property
    def size(self) -> int | None:
        """Expected size in bytes; unknown once the md5 is overridden (another file)."""
        return self.archive.size if self.md5 == self.archive.md5 else None

    def describe(self) -> str:
        checksum = f"md5 {self.md5}" if self.md5 else "md5 not published"
        size = f", {self.size:,} bytes" if self.size else ""
        return f"{self.filename} ({checksum}{size})"


def resolve(archives: tuple[Archive, ...], source: SourceParams) -> list[ResolvedArchive]:
    """Apply ``datasets.<name>.source.<key>.url`` / ``.md5`` to the published values."""
    resolved = []
    for archive in archives:
        override = getattr(source, archive.key, None) or ArchiveSource()
        mirrors = () if override.url else archive.mirrors
        resolved.append(ResolvedArchive(archive, override.url or archive.url, override.md5 or archive.md5, mirrors))
    return resolved


def sidecar(path: Path) -> Path:
    """Where the sha256 of an archive without md5 is recorded on first use: ``<file>.sha256``."""
    return path.with_name(f"{path.name}.sha256")


def file_digests(path: Path) -> tuple[str, str]:
    """(md5, sha256) of a file, in one pass with a progress bar."""
    from tqdm import tqdm

    md5, sha256 = hashlib.md5(), hashlib.sha256()
    with (
        open(path, "rb") as handle,
        tqdm(
            total=path.stat().st_size, desc=f"checksum {path.name}", unit="B", unit_scale=True, mininterval=1.0
        ) as bar,
    ):
        for block in iter(lambda: handle.read(CHUNK_BYTES), b""):
            md5.update(block)
            sha256.update(block)
            bar.update(len(block))
    return md5.hexdigest(), sha256.hexdigest()


def tree_sha256(root: Path) -> str:
    """sha256 of a directory: of the ``sha256sum`` lines (``<sha256>  <relative path>``) of its files
    (links followed), sorted by relative path."""
    digest = hashlib.sha256()
    files = [Path(top) / name for top, _, names in os.walk(root, followlinks=True) for name in names]
    for file in sorted(files, key=lambda file: file.relative_to(root).as_posix()):
        with open(file, "rb") as handle:
            line = f"{hashlib.file_digest(handle, 'sha256').hexdigest()}  {file.relative_to(root).as_posix()}\n"
        digest.update(line.encode())
    return digest.hexdigest()


def check_recorded(path: Path, sha256: str) -> None:
    """Refuse ``path`` when its sha256 differs from the one recorded on first use (if any)."""
    record = sidecar(path)
    if record.exists():
        recorded = (record.read_text().split() or [""])[0]
        if recorded != sha256:
            raise DataError(
                f"{path}: sha256 {sha256} differs from {recorded or 'nothing'} recorded on first use in {record}; "
                f"restore that copy, or delete {record} to accept this one"
            )


def record_first_use(dataset: str, path: Path, sha256: str, md5: str | None = None, key: str = "") -> None:
    """Write ``path``'s sha256 to its ``.sha256`` file unless one is there (call once the files proved good)."""
    from tqdm import tqdm

    record = sidecar(path)
    if record.exists():
        return
    with atomic_path(record) as tmp:
        tmp.write_text(f"{sha256}  {path.name}{'/' if path.is_dir() else ''}\n")
    if md5 is None:
        message = f"{dataset}: {path}/ has no published checksum; its sha256 is recorded in {record}"
    else:
        pin = f" (pin it with datasets.{dataset}.source.{key}.md5)" if key else ""
        message = (
            f"{dataset}: {path.name} has no published md5; its md5 is {md5}{pin} and its sha256 is recorded in {record}"
        )
    tqdm.write(message, file=sys.stderr)


def record_archives(dataset: str, local: list[tuple[ResolvedArchive, Path, dict]]) -> None:
    """Record the sha256 of every archive without md5 that has none recorded yet."""
    for item, path, record in local:
        if "sha256" in record:
            record_first_use(dataset, path, record["sha256"], record["md5"], item.archive.key)


def missing_line(dataset: str, item: ResolvedArchive, dropbox: Path) -> str:
    """One short line: this archive is not in the drop-box and nothing can download it."""
    how = f" ({item.archive.how_to_get})" if item.archive.how_to_get else ""
    return f"{dataset}: {item.describe()} is not in {dropbox}/ and has no public download{how}"


def missing_archives_error(dataset: str, missing: list[ResolvedArchive], dropbox: Path) -> DataError:
    """One line per file the user must place in the drop-box."""
    return DataError("\n".join(missing_line(dataset, item, Path(dropbox)) for item in missing))


def ensure_archive(dataset: str, item: ResolvedArchive, dropbox: Path) -> tuple[Path, dict]:
    """``dropbox/<filename>``, verified (downloaded there first if absent): (path, its archives.json record)."""
    local = Path(dropbox) / item.filename
    fix = (
        f"replace it with an intact copy (or set datasets.{dataset}.source.{item.archive.key}.md5 for another release)"
    )
    used = item.url
    if local.exists():
        if item.size is not None and local.stat().st_size != item.size:
            raise DataError(f"{local}: {local.stat().st_size:,} bytes, expected {item.size:,}; {fix}")
        if item.md5 is not None:
            got = md5_file(local, CHUNK_BYTES, progress=True)
            if got != item.md5:
                raise DataError(f"{local}: md5 is {got}, expected {item.md5}; {fix}")
    elif not item.urls:
        raise missing_archives_error(dataset, [item], Path(dropbox))
    elif offline():  # said once, not once per URL
        raise offline_error(f"{dataset}: {item.filename}", dropbox)
    else:
        failures = []
        for url in item.urls:  # the published URL, then the mirrors: the md5 decides
            try:
                download(url, local, item.md5, item.size)
                used = url
                break
            except DataError as exc:
                failures.append(str(exc))
        else:
            how = f" (from {item.archive.how_to_get})" if item.archive.how_to_get else ""
            raise DataError(f"{dataset}: {'; '.join(failures)}; or place {item.describe()} in {dropbox}/{how}")
    record = {"filename": item.filename, "url": used, "md5": item.md5}
    if item.md5 is None:  # trusted on first use: see record_archives
        record["md5"], record["sha256"] = file_digests(local)
        check_recorded(local, record["sha256"])
    return local, record


def unpack(item: ResolvedArchive, path: Path, dest: Path) -> None:
    """Extract an archive into ``dest`` (or copy a plain file there)."""
    if not item.archive.extract:
        shutil.copyfile(path, dest / item.filename)
        return
    try:
        extract_archive(path, dest)
    except EncryptedArchive as exc:
        if not item.archive.encrypted_hint:
            raise
        raise DataError(f"{exc}: {item.archive.encrypted_hint}") from None


ContentCheck = Callable[[Path, str], dict]  # (unpacked root, the files' names) -> what was found


def fetch_archives(
    dataset: str,
    archives: tuple[Archive, ...],
    source: SourceParams,
    raw_dir: Path,
    dropbox: Path,
    check: ContentCheck | None = None,
) -> None:
    """Make every archive available in ``dropbox`` (verified), unpack all, run ``check`` on what they
    hold, then replace ``raw_dir`` atomically and record the sha256 of files without md5."""
    resolved = resolve(archives, source)
    missing = [item for item in resolved if not item.urls and not (dropbox / item.filename).exists()]
    if missing:  # fail before any download starts
        raise missing_archives_error(dataset, missing, dropbox)
    local = [(item, *ensure_archive(dataset, item, dropbox)) for item in resolved]
    found: dict = {}
    with atomic_dir(raw_dir) as tmp:
        for item, path, _ in local:
            unpack(item, path, tmp)
        if check is not None:  # a refused copy leaves no raw_dir and no record
            found = check(tmp, " + ".join(item.filename for item in resolved))
        write_json(tmp / ARCHIVES_RECORD, [record for _, _, record in local])
    if not found.get("missing"):
        record_archives(dataset, local)


def archive_fetcher(
    dataset: str,
    archives: tuple[Archive, ...],
    read: ReadAnnotations | None = None,
    counts: Counts | None = None,
) -> Callable[[DatasetParams, Path, Path], None]:
    """The ``fetch`` of a dataset made of ``archives`` (see :func:`fetch_archives`), whose content is
    checked with its annotation reader ``read`` against its published ``counts``."""

    def fetch(params: DatasetParams, raw_dir: Path, dropbox: Path) -> None:
        check = content_check(dataset, read, counts, params) if read is not None else None
        fetch_archives(dataset, archives, params.source, Path(raw_dir), Path(dropbox), check)

    fetch.__doc__ = f"Fetch {', '.join(a.filename for a in archives)} and unpack them into the raw directory."
    return fetch


def archive_problems(
    dataset: str, archives: tuple[Archive, ...], source: SourceParams, dropbox: Path, unreachable: UrlCheck
) -> list[str]:
    """One line per archive that is neither in ``dropbox`` nor downloadable now (no URL of it answers;
    the line names each URL's host and why, the download stage names the whole URLs)."""
    lines = []
    for item in resolve(archives, source):
        if (Path(dropbox) / item.filename).exists():
            continue
        if not item.urls:
            lines.append(missing_line(dataset, item, Path(dropbox)))
            continue
        failures = []
        for url in item.urls:
            reason = unreachable(url)
            if reason is None:
                break
            failures.append((urllib.parse.urlsplit(url).netloc or url, reason))
        else:
            hosts, reasons = zip(*failures, strict=True)
            if len(set(reasons)) == 1:
                detail = f"{', '.join(hosts)}: {reasons[0]}"
            else:
                detail = "; ".join(f"{host}: {reason}" for host, reason in failures)
            lines.append(
                f"{dataset}: {item.filename} cannot be downloaded ({detail}); place it in {dropbox}/ "
                f"(or set datasets.{dataset}.source.{item.archive.key}.url to a mirror)"
            )
    return lines


def dataset_problems(spec: DatasetSpec, params: DatasetParams, dropbox: Path, unreachable: UrlCheck) -> list[str]:
    """The pre-flight lines of one dataset: its own check (``spec.preflight``) or :func:`archive_problems`."""
    if spec.preflight is not None:
        return spec.preflight(params, Path(dropbox), unreachable)
    return archive_problems(spec.name, spec.archives, params.source, Path(dropbox), unreachable)
