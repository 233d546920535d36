"""Dataset archives: their declaration, params overrides, safe extraction, and the shared ``fetch``.

A dataset module declares its files as :class:`Archive` entries (file name, published URL or
none, md5, size) and gets its ``fetch`` from :func:`archive_fetcher`. For every archive the
fetch looks in the drop-box ``data/`` first (verifying the md5), else downloads it into
``data/`` (:mod:`dmlbench.data.download`), so that ``dvc add data && dvc push`` shares it;
then it extracts (or copies) everything into ``artifacts/raw/<dataset>/`` atomically.
Extraction rejects entries that would land outside the target directory, absolute paths,
links of any kind and device files (no dataset archive has them).
"""

from __future__ import annotations

import shutil
import stat
import sys
import tarfile
import zipfile
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import Callable

from pydantic import Field

from dmlbench.data.base import Archive, DatasetParams, SourceParams
from dmlbench.data.download import CHUNK_BYTES, download
from dmlbench.errors import DataError
from dmlbench.io import atomic_dir, md5_file, write_json
from dmlbench.schema import StrictModel

ARCHIVES_RECORD = "archives.json"
MD5_PATTERN = r"^[0-9a-f]{32}$"
URL_PATTERN = r"^https?://\S+$"


class ArchiveSource(StrictModel):
    """A mirror for one archive: ``url`` (http or https) and/or ``md5`` replace the published ones."""

    url: str | None = Field(None, pattern=URL_PATTERN)
    md5: str | None = Field(None, pattern=MD5_PATTERN)


class ArchiveSourceParams(SourceParams):
    """Source of an archive dataset: one optional :class:`ArchiveSource` per archive key."""


@dataclass(frozen=True)
class ResolvedArchive:
    """An archive with the params overrides applied."""

    archive: Archive
    url: str | None
    md5: str | None

    @property
    def filename(self) -> str:
        return self.archive.filename

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
        resolved.append(ResolvedArchive(archive, override.url or archive.url, override.md5 or archive.md5))
    return resolved


# --------------------------------------------------------------------------- extraction


def _check_member_name(archive: Path, name: str, dest: Path) -> Path:
    """The path ``name`` extracts to, or a DataError if it is absolute or leaves ``dest``."""
    pure = PurePosixPath(name.replace("\\", "/"))
    if pure.is_absolute() or name.startswith(("/", "\\")) or (len(name) > 1 and name[1] == ":"):
        raise DataError(f"{archive}: entry {name!r} has an absolute path; refusing to extract")
    if ".." in pure.parts:
        raise DataError(f"{archive}: entry {name!r} would be written outside {dest}; refusing to extract")
    target = (dest / pure).resolve()
    if not target.is_relative_to(dest.resolve()):
        raise DataError(f"{archive}: entry {name!r} would be written outside {dest}; refusing to extract")
    return target


def _extract_tar(archive: Path, dest: Path, progress) -> None:
    with tarfile.open(archive, mode="r:*") as tar:
        for member in tar:  # streamed: a .tgz is decompressed once
            _check_member_name(archive, member.name, dest)
            if member.issym() or member.islnk():
                raise DataError(
                    f"{archive}: entry {member.name!r} is a link to {member.linkname!r}; refusing to extract"
                )
            if not (member.isfile() or member.isdir()):
                raise DataError(f"{archive}: entry {member.name!r} is a device or fifo; refusing to extract")
            tar.extract(member, dest, filter="data")  # second line of defence (PEP 706)
            progress.update(member.size)


def _extract_zip(archive: Path, dest: Path, progress) -> None:
    with zipfile.ZipFile(archive) as zf:
        for info in zf.infolist():
            _check_member_name(archive, info.filename, dest)
            mode = info.external_attr >> 16
            if stat.S_ISLNK(mode):
                raise DataError(f"{archive}: entry {info.filename!r} is a symbolic link; refusing to extract")
            zf.extract(info, dest)
            progress.update(info.file_size)


def extract_archive(archive: Path, dest: Path) -> None:
    """Unpack a tar (any compression) or zip ``archive`` into ``dest``, rejecting unsafe entries."""
    from tqdm import tqdm

    dest.mkdir(parents=True, exist_ok=True)
    if zipfile.is_zipfile(archive):
        extractor = _extract_zip
    elif tarfile.is_tarfile(archive):
        extractor = _extract_tar
    else:
        raise DataError(f"{archive}: neither a zip nor a tar archive")
    with tqdm(desc=f"extract {archive.name}", unit="B", unit_scale=True, mininterval=1.0) as progress:
        try:
            extractor(archive, dest, progress)
        except (tarfile.TarError, zipfile.BadZipFile, EOFError) as exc:
            raise DataError(f"{archive}: corrupt archive ({type(exc).__name__}: {exc})") from None


# --------------------------------------------------------------------------- fetch


def missing_archives_error(dataset: str, missing: list[ResolvedArchive], dropbox: Path) -> DataError:
    """One line naming every file the user must place in the drop-box, with md5 and where to get it."""
    files = "; ".join(
        f"{item.describe()}" + (f": {item.archive.how_to_get}" if item.archive.how_to_get else "") for item in missing
    )
    keys = ", ".join(f"datasets.{dataset}.source.{item.archive.key}.url" for item in missing)
    return DataError(
        f"{dataset}: no public download works for {len(missing)} file(s); place them in {dropbox}/ "
        f"and re-run (or set {keys} to a mirror): {files}"
    )


def ensure_archive(dataset: str, item: ResolvedArchive, dropbox: Path) -> tuple[Path, str]:
    """``dropbox/<filename>`` verified against the md5 (downloaded there first if absent): (path, md5)."""
    from tqdm import tqdm

    local = Path(dropbox) / item.filename
    fix = (
        f"replace it with an intact copy (or set datasets.{dataset}.source.{item.archive.key}.md5 for another release)"
    )
    if local.exists():
        if item.size is not None and local.stat().st_size != item.size:
            raise DataError(f"{local}: {local.stat().st_size:,} bytes, expected {item.size:,}; {fix}")
        got = md5_file(local, CHUNK_BYTES, progress=True)
        if item.md5 is not None and got != item.md5:
            raise DataError(f"{local}: md5 is {got}, expected {item.md5}; {fix}")
    elif item.url is None:
        raise missing_archives_error(dataset, [item], Path(dropbox))
    else:
        try:
            got = download(item.url, local, item.md5, item.size)
        except DataError as exc:
            raise DataError(f"{dataset}: {exc}; or place {item.describe()} in {dropbox}/") from None
    if item.md5 is None:
        tqdm.write(
            f"{dataset}: {item.filename} has no published md5; its md5 {got} is recorded in archives.json "
            f"(pin it with datasets.{dataset}.source.{item.archive.key}.md5)",
            file=sys.stderr,
        )
    return local, got


def fetch_archives(dataset: str, archives: tuple[Archive, ...], source: SourceParams, raw_dir: Path, dropbox: Path):
    """Make every archive available in ``dropbox`` (verified), then unpack all into ``raw_dir`` atomically."""
    resolved = resolve(archives, source)
    missing = [item for item in resolved if item.url is None and not (dropbox / item.filename).exists()]
    if missing:  # fail before any download starts
        raise missing_archives_error(dataset, missing, dropbox)
    local = [(item, *ensure_archive(dataset, item, dropbox)) for item in resolved]
    with atomic_dir(raw_dir) as tmp:
        for item, path, _ in local:
            if item.archive.extract:
                extract_archive(path, tmp)
            else:
                shutil.copyfile(path, tmp / item.filename)
        write_json(tmp / ARCHIVES_RECORD, [{"filename": i.filename, "md5": md5, "url": i.url} for i, _, md5 in local])


def archive_fetcher(dataset: str, archives: tuple[Archive, ...]) -> Callable[[DatasetParams, Path, Path], None]:
    """The ``fetch`` of a dataset made of ``archives`` (see :func:`fetch_archives`)."""

    def fetch(params: DatasetParams, raw_dir: Path, dropbox: Path) -> None:
        fetch_archives(dataset, archives, params.source, Path(raw_dir), Path(dropbox))

    fetch.__doc__ = f"Fetch {', '.join(a.filename for a in archives)} and unpack them into the raw directory."
    return fetch
