"""HTTP download with resume (Range), retries with exponential back-off, md5 check and atomic rename.

A download is written to ``.<name>.part`` next to its destination and renamed only after its
size and md5 match, so an interrupted or corrupt download never leaves a file that looks
valid. A connection that drops mid-file is resumed with ``Range: bytes=<have>-`` (a server
that ignores Range restarts the file); a wrong checksum deletes the partial file. Transient
failures (connection errors, timeouts, HTTP 408/429/5xx) are retried ``RETRIES`` times,
waiting ``BACKOFF_SECONDS * 2**attempt``; the partial file survives them, so the next run
resumes it.
"""

from __future__ import annotations

import http.client
import os
import re
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

from dmlbench import __version__
from dmlbench.errors import DataError
from dmlbench.io import md5_file

RETRIES = 5
BACKOFF_SECONDS = 2.0  # waits 2, 4, 8, 16, 32 s
TIMEOUT_SECONDS = 60.0  # per socket operation
CHUNK_BYTES = 1 << 20
RETRIABLE_HTTP = frozenset({408, 425, 429, 500, 502, 503, 504})


class TransientError(Exception):
    """A failure worth retrying (the partial file is kept)."""


def partial_path(dest: Path) -> Path:
    return dest.with_name(f".{dest.name}.part")


def _content_range_start(value: str | None) -> int | None:
    match = re.match(r"bytes (\d+)-\d+/(\d+|\*)", value or "")
    return int(match.group(1)) if match else None


def _transfer(url: str, part: Path, size: int | None) -> None:
    """Fetch what ``part`` lacks (all of it, or the rest with a Range request)."""
    from tqdm import tqdm

    have = part.stat().st_size if part.exists() else 0
    if size is not None and have > size:
        part.unlink()
        have = 0
    if size is not None and have == size:
        return
    headers = {"User-Agent": f"dmlbench/{__version__}"}
    if have:
        headers["Range"] = f"bytes={have}-"
    try:
        response = urllib.request.urlopen(urllib.request.Request(url, headers=headers), timeout=TIMEOUT_SECONDS)
    except urllib.error.HTTPError as exc:
        if exc.code == 416 and have:  # nothing left to send: the size/md5 check decides
            return
        if exc.code in RETRIABLE_HTTP:
            raise TransientError(f"HTTP {exc.code} {exc.reason}") from None
        raise DataError(f"{url}: HTTP {exc.code} {exc.reason}") from None
    except (urllib.error.URLError, OSError) as exc:
        raise TransientError(str(getattr(exc, "reason", exc))) from None
    with response:
        if have and response.status == 206 and _content_range_start(response.headers.get("Content-Range")) == have:
            mode = "ab"
        else:  # first request, or the server ignored the Range header: start over
            have, mode = 0, "wb"
        length = response.headers.get("Content-Length")
        total = have + int(length) if length is not None else size
        with (
            open(part, mode) as out,
            tqdm(total=total, initial=have, desc=part.name[1:-5], unit="B", unit_scale=True, mininterval=1.0) as bar,
        ):
            while True:
                try:
                    block = response.read(CHUNK_BYTES)
                except (http.client.HTTPException, OSError) as exc:
                    raise TransientError(f"connection lost ({type(exc).__name__})") from None
                if not block:
                    break
                out.write(block)
                bar.update(len(block))
    got = part.stat().st_size
    if total is not None and got < total:
        raise TransientError(f"connection closed after {got:,} of {total:,} bytes")


def download(
    url: str,
    dest: Path,
    md5: str | None = None,
    size: int | None = None,
    retries: int | None = None,
    backoff: float | None = None,
) -> str:
    """Download ``url`` to ``dest`` (resuming a partial file); verify size and md5; return the md5."""
    from tqdm import tqdm

    retries = RETRIES if retries is None else retries
    backoff = BACKOFF_SECONDS if backoff is None else backoff
    dest = Path(dest)
    dest.parent.mkdir(parents=True, exist_ok=True)
    part = partial_path(dest)
    for attempt in range(retries + 1):
        try:
            _transfer(url, part, size)
            break
        except TransientError as exc:
            if attempt == retries:
                raise DataError(
                    f"{url}: download failed after {retries + 1} attempts ({exc}); the partial file {part} is kept "
                    f"and the next run resumes it"
                ) from None
            wait = backoff * 2**attempt
            tqdm.write(f"{url}: {exc}; retry {attempt + 1}/{retries} in {wait:.0f} s", file=sys.stderr)
            time.sleep(wait)
    got_size = part.stat().st_size
    if size is not None and got_size != size:
        part.unlink()
        raise DataError(f"{url}: got {got_size:,} bytes, expected {size:,}; the download was deleted")
    got = md5_file(part, CHUNK_BYTES, progress=True)
    if md5 is not None and got != md5:
        part.unlink()
        raise DataError(f"{url}: md5 is {got}, expected {md5}; the download was deleted")
    os.replace(part, dest)
    return got
