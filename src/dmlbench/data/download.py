"""HTTP download into ``.<name>.part``, resumed with ``Range``, retried with exponential back-off on
transient failures, renamed once size and md5 match (docs/datasets.md, "Download"). Google Drive's
virus-scan page is followed through its form or ``/uc?export=download`` link with its cookies (as
gdown's ``get_url_from_gdrive_confirmation``). ``DMLBENCH_OFFLINE=1``: nothing is downloaded.
"""

from __future__ import annotations

import http.client
import http.cookiejar
import os
import re
import sys
import time
import urllib.error
import urllib.parse
import urllib.request
from html.parser import HTMLParser
from pathlib import Path

from dmlbench import __version__
from dmlbench.errors import DataError
from dmlbench.io import md5_file

RETRIES = 5
BACKOFF_SECONDS = 2.0  # waits 2, 4, 8, 16, 32 s
TIMEOUT_SECONDS = 60.0  # per socket operation
CHUNK_BYTES = 1 << 20
RETRIABLE_HTTP = frozenset({408, 425, 429, 500, 502, 503, 504})
DRIVE_HOSTS = frozenset({"drive.google.com", "drive.usercontent.google.com", "docs.google.com"})
DRIVE_PAGES = 3  # confirmation pages followed before giving up
PAGE_BYTES = 1 << 20


OFFLINE = "DMLBENCH_OFFLINE"


def offline() -> bool:
    """``DMLBENCH_OFFLINE`` set (not empty, not 0): this process must not touch the network."""
    return os.environ.get(OFFLINE, "").strip() not in ("", "0")


def offline_error(name: str, folder: Path) -> DataError:
    """``name`` is not in ``folder`` and this process must not download it."""
    return DataError(
        f"{name} is not in {folder}/ and this job runs offline ({OFFLINE}=1): run `make fetch` where the internet "
        "is (the login node), then run again"
    )


class TransientError(Exception):
    """A failure worth retrying (the partial file is kept)."""


def partial_path(dest: Path) -> Path:
    return dest.with_name(f".{dest.name}.part")


def drive_url(file_id: str, resource_key: str | None = None) -> str:
    """The direct download URL of a Google Drive file (``confirm=t`` skips the virus-scan page)."""
    key = f"&resourcekey={resource_key}" if resource_key else ""
    return f"https://drive.usercontent.google.com/download?id={file_id}&export=download&confirm=t{key}"


def drive_view_url(file_id: str, resource_key: str | None = None) -> str:
    """The page of a Google Drive file, to download it in a browser."""
    key = f"?resourcekey={resource_key}" if resource_key else ""
    return f"https://drive.google.com/file/d/{file_id}/view{key}"


class _DrivePage(HTMLParser):
    """The download form (action and hidden inputs), ``/uc?export=download`` link and error text of a Drive page."""

    def __init__(self):
        super().__init__()
        self.action: str | None = None
        self.inputs: dict[str, str] = {}
        self.link: str | None = None
        self.error: list[str] = []
        self._in_form = self._in_error = False

    def handle_starttag(self, tag, attrs):
        attrs = {name: value or "" for name, value in attrs}
        if tag == "form" and attrs.get("id") == "download-form":
            self.action, self._in_form = attrs.get("action", ""), True
        elif tag == "input" and self._in_form and attrs.get("type") == "hidden" and attrs.get("name"):
            self.inputs[attrs["name"]] = attrs.get("value", "")
        elif tag == "a" and attrs.get("href", "").startswith("/uc?export=download") and self.link is None:
            self.link = attrs["href"]
        elif tag == "p" and "uc-error-subcaption" in attrs.get("class", "").split():
            self._in_error = True

    def handle_endtag(self, tag):
        if tag == "form":
            self._in_form = False
        elif tag == "p":
            self._in_error = False

    def handle_data(self, data):
        if self._in_error:
            self.error.append(data)


def drive_confirmed_url(url: str, page: str) -> str:
    """The URL that a Drive confirmation ``page`` (fetched from ``url``) points to, keeping ``url``'s query."""
    parser = _DrivePage()
    parser.feed(page)
    if parser.action is None and parser.link is None:
        message = " ".join("".join(parser.error).split()) or "no download link on it"
        host = urllib.parse.urlsplit(url).netloc
        raise DataError(f"{host}: Google Drive sent a page, not the file ({message})")
    query = dict(urllib.parse.parse_qsl(urllib.parse.urlsplit(url).query))
    target = urllib.parse.urljoin(url, parser.link if parser.action is None else parser.action)
    query.update(urllib.parse.parse_qsl(urllib.parse.urlsplit(target).query))
    query.update(parser.inputs)  # the form's hidden fields (none without a form)
    return urllib.parse.urlunsplit(urllib.parse.urlsplit(target)._replace(query=urllib.parse.urlencode(query)))


_COOKIES = http.cookiejar.CookieJar()  # the cookies Drive sets with its confirmation page, for this process


def _open(url: str, headers: dict[str, str]):
    """The response that carries the file: Drive's confirmation pages are followed (see the module doc)."""
    opener = urllib.request.build_opener(urllib.request.HTTPCookieProcessor(_COOKIES))
    drive = urllib.parse.urlsplit(url).hostname in DRIVE_HOSTS
    for _ in range(DRIVE_PAGES + 1):
        response = opener.open(urllib.request.Request(url, headers=headers), timeout=TIMEOUT_SECONDS)
        if not (drive and response.headers.get_content_type() == "text/html"):
            return response
        with response:
            page = response.read(PAGE_BYTES).decode("utf-8", errors="replace")
        url = drive_confirmed_url(url, page)
    raise DataError(f"{url}: Google Drive answered {DRIVE_PAGES + 1} pages, not the file")


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
        response = _open(url, headers)
    except urllib.error.HTTPError as exc:
        if exc.code == 416 and have:  # nothing left to send: the size/md5 check decides
            return
        if exc.code in RETRIABLE_HTTP:
            raise TransientError(f"HTTP {exc.code} {exc.reason}") from None
        raise DataError(f"{url}: HTTP {exc.code} {exc.reason}") from None
    except (urllib.error.URLError, OSError, http.client.HTTPException) as exc:
        raise TransientError(str(getattr(exc, "reason", exc))) from None
    with response:
        resumed = re.match(r"bytes (\d+)-\d+/(\d+|\*)", response.headers.get("Content-Range") or "")
        if have and response.status == 206 and resumed and int(resumed.group(1)) == have:
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
    if offline():
        raise offline_error(dest.name, dest.parent)
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
