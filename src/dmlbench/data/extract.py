"""Safe extraction of dataset archives (a tar of any compression, or a zip) into a directory.

Every entry is checked before anything is written: absolute paths, ``..``, entries resolving
outside the target, links of any kind and device files or fifos are refused (no dataset archive
has them). Where ``tarfile`` has the PEP 706 filters (Python >= 3.11.4, 3.12), the ``data``
filter runs as a second line of defence. Where it has not (Debian 12's system Python 3.11.2,
whose ``TarFile.extract`` raises ``TypeError`` on ``filter=``), this module writes the checked
regular files and directories itself: contents only, mode 0o644 (0o755 if executable by its
owner), never links, owners or set-id bits. The same archives are accepted and refused either way.
"""

from __future__ import annotations

import os
import shutil
import stat
import tarfile
import zipfile
from pathlib import Path, PurePosixPath

from dmlbench.errors import DataError

CHUNK_BYTES = 1 << 20


def check_member_name(archive: Path, name: str, dest: Path) -> Path:
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


def has_data_filter() -> bool:
    """Whether this Python's ``tarfile`` has the PEP 706 extraction filters."""
    return hasattr(tarfile, "data_filter")


def _write_member(tar: tarfile.TarFile, member: tarfile.TarInfo, target: Path) -> None:
    """Write one checked file or directory entry without ``tarfile``'s filters (never follows a link)."""
    if member.isdir():
        target.mkdir(parents=True, exist_ok=True)
        return
    target.parent.mkdir(parents=True, exist_ok=True)
    mode = 0o755 if member.mode & stat.S_IXUSR else 0o644
    flags = os.O_WRONLY | os.O_CREAT | os.O_TRUNC | getattr(os, "O_NOFOLLOW", 0)
    source = tar.extractfile(member)
    with source, os.fdopen(os.open(target, flags, mode), "wb") as out:
        shutil.copyfileobj(source, out, CHUNK_BYTES)
    os.chmod(target, mode)  # os.open's mode is masked by the umask and ignored for an existing file


def _extract_tar(archive: Path, dest: Path, progress) -> None:
    filters = has_data_filter()
    with tarfile.open(archive, mode="r:*") as tar:
        for member in tar:  # streamed: a .tgz is decompressed once
            target = check_member_name(archive, member.name, dest)
            if member.issym() or member.islnk():
                raise DataError(
                    f"{archive}: entry {member.name!r} is a link to {member.linkname!r}; refusing to extract"
                )
            if not (member.isfile() or member.isdir()):
                raise DataError(f"{archive}: entry {member.name!r} is a device or fifo; refusing to extract")
            if filters:
                tar.extract(member, dest, filter="data")  # second line of defence (PEP 706)
            else:
                _write_member(tar, member, target)
            progress.update(member.size)


def _extract_zip(archive: Path, dest: Path, progress) -> None:
    with zipfile.ZipFile(archive) as zf:
        for info in zf.infolist():
            check_member_name(archive, info.filename, dest)
            mode = info.external_attr >> 16
            if stat.S_ISLNK(mode):
                raise DataError(f"{archive}: entry {info.filename!r} is a symbolic link; refusing to extract")
            zf.extract(info, dest)
            progress.update(info.file_size)


def extract_archive(archive: Path, dest: Path) -> None:
    """Unpack a tar (any compression) or zip ``archive`` into ``dest``, rejecting unsafe entries."""
    from tqdm import tqdm

    archive, dest = Path(archive), Path(dest)
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
