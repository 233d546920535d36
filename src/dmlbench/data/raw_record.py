"""The download stage's record ``artifacts/downloaded/<dataset>.json`` (archive md5s, a digest of the
extracted tree), which DVC tracks instead of the scratch ``artifacts/raw/<dataset>/`` (terms seldom
allow pushing images); ``prepare`` re-creates a missing or stale extraction and checks it.
"""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Any

from dmlbench.data.archives import ARCHIVES_RECORD
from dmlbench.data.base import DatasetParams, DatasetSpec
from dmlbench.errors import DataError
from dmlbench.io import md5_file, read_json, write_json

MARKER = ".extracted.json"  # in the extraction: the digest it was made with, written last
SKIPPED = frozenset({MARKER, ARCHIVES_RECORD})  # the fetch's note says where each archive came from


def tree_digest(root: Path) -> tuple[str, int]:
    """md5 over every file under ``root`` (its relative path and md5, sorted by path), and the
    number of files; the marker and the fetch's source note are left out."""
    digest = hashlib.md5()
    files = sorted(p for p in Path(root).rglob("*") if p.is_file() and p.relative_to(root).as_posix() not in SKIPPED)
    for path in files:
        digest.update(f"{path.relative_to(root).as_posix()}\0{md5_file(path)}\n".encode())
    return digest.hexdigest(), len(files)


def record_download(spec: DatasetSpec, raw_dir: Path, record: Path) -> dict[str, Any]:
    """Write ``record`` for the freshly extracted ``raw_dir`` and its marker; the record."""
    digest, count = tree_digest(raw_dir)
    notes = read_json(raw_dir / ARCHIVES_RECORD) if (raw_dir / ARCHIVES_RECORD).is_file() else []
    content = {
        "dataset": spec.name,
        "archives": {note["filename"]: note["md5"] for note in notes if "filename" in note and "md5" in note},
        "files": count,
        "digest": digest,
    }
    write_json(raw_dir / MARKER, {"digest": digest})
    write_json(record, content)
    return content


def ensure_extracted(spec: DatasetSpec, params: DatasetParams, raw_dir: Path, record: Path, dropbox: Path) -> None:
    """Make ``raw_dir`` the extraction ``record`` describes (kept, or re-created from ``dropbox``).

    Raises:
        DataError: the record is missing, an archive is not in ``dropbox``, or the re-created
            files differ from the record.
    """
    if not record.is_file():
        raise DataError(f"{record}: missing: run the download@{spec.name} stage first (`dvc repro`)")
    wanted = read_json(record)["digest"]
    marker = raw_dir / MARKER
    if marker.is_file() and read_json(marker).get("digest") == wanted:
        return
    absent = [a.filename for a in spec.archives if not (dropbox / a.filename).exists()]
    if spec.archives and len(absent) == len(spec.archives):
        raise DataError(
            f"{raw_dir}: missing, and {', '.join(absent)} not in {dropbox}/ to re-create it: "
            f"`dvc pull data.dvc` (or place the archives there), or `dvc repro -f download@{spec.name}` to fetch them"
        )
    print(f"{spec.name}: re-creating {raw_dir} from {dropbox}/ (scratch, not a DVC output)", flush=True)
    spec.fetch(params, raw_dir, dropbox)
    digest, _ = tree_digest(raw_dir)
    if digest != wanted:
        raise DataError(
            f"{raw_dir}: re-created from {dropbox}/ with digest {digest}, but {record} records {wanted} "
            f"(other archives or another renderer): run `dvc repro -f download@{spec.name}` to record these files"
        )
    write_json(marker, {"digest": digest})
