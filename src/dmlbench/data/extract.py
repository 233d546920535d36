"""Safe extraction of a tar (any compression) or zip: absolute paths, ``..``, escapes, links and special
files are refused; PEP 706's ``data`` filter is a second line where ``tarfile`` has it, else only
contents are written (mode 0o644/0o755). A file that does not unpack says why in one line."""

from __future__ import annotations

import os
import shutil
import stat
import tarfile
import zipfile
from pathlib import Path, PurePosixPath

from dmlbench.errors import DataError

CHUNK_BYTES = 1 << 20
ZIP_MAGIC = (b"PK\x03\x04", b"PK\x05\x06")  # a local file header; an empty zip's end record
COMPRESSED_MAGIC = {b"\x1f\x8b": "gzip", b"BZh": "bzip2", b"\xfd7zXZ\x00": "xz"}


class EncryptedArchive(DataError):
    """A zip whose entries are encrypted (it needs a password this code does not have)."""


def _magic(archive: Path) -> bytes:
    with open(archive, "rb") as handle:
        return handle.read(8)


def _unreadable(archive: Path) -> DataError:
    """Why ``archive`` is neither a readable zip nor a readable tar, in one line."""
    head, size = _magic(archive), archive.stat().st_size
    if head.startswith(ZIP_MAGIC):
        return DataError(
            f"{archive}: truncated: it starts as a zip archive but its end (the central directory) is missing "
            f"({size:,} bytes; an interrupted download or copy): replace it with a complete copy"
        )
    for magic, kind in COMPRESSED_MAGIC.items():
        if head.startswith(magic):
            return DataError(
                f"{archive}: a {kind} stream ({size:,} bytes) that holds no readable tar archive: truncated or "
                "corrupt; replace it with a complete copy"
            )
    return DataError(f"{archive}: neither a zip nor a tar archive ({size:,} bytes, starting {head[:4]!r})")


def check_member_name(archive: Path, name: str, dest: Path) -> Path:
    """The path ``name`` extracts to, or a DataError if it is absolute or leaves ``dest``."""
    pure = PurePosixPath(name.replace("\\", "/"))
    if pure.is_absolute() or name.startswith(("/", "\\")) or (len(name) > 1 and name[1] == ":"):
        raise DataError(f"{archive}: entry {name!r} has an absolute path; refusing to extract")
    target = (dest / pure).resolve()
    if ".." in pure.parts or not target.is_relative_to(dest.resolve()):
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
        encrypted = [info.filename for info in zf.infolist() if info.flag_bits & 0x1]
        if encrypted:  # the zip format's "encrypted" flag (APPNOTE.TXT 4.4.4, bit 0)
            raise EncryptedArchive(
                f"{archive}: password-protected ({len(encrypted):,} of {len(zf.infolist()):,} entries encrypted, "
                f"e.g. {encrypted[0]})"
            )
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
        raise _unreadable(archive)
    with tqdm(desc=f"extract {archive.name}", unit="B", unit_scale=True, mininterval=1.0) as progress:
        try:
            extractor(archive, dest, progress)
        except EOFError as exc:  # a compressed stream that stops before its end marker
            raise DataError(
                f"{archive}: truncated: the compressed data stops before its end marker (an interrupted download or "
                f"copy; {type(exc).__name__}); replace it with a complete copy"
            ) from None
        except tarfile.ReadError as exc:
            what = "truncated" if "unexpected end of data" in str(exc) else "corrupt archive"
            raise DataError(f"{archive}: {what} (tarfile: {exc}); replace it with a complete copy") from None
        except (tarfile.TarError, zipfile.BadZipFile, zipfile.LargeZipFile) as exc:
            raise DataError(f"{archive}: corrupt archive ({type(exc).__name__}: {exc})") from None
