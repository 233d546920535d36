"""Downloads over HTTP from a local server (resume, retries, checksums) and safe extraction."""

from __future__ import annotations

import shutil
import tarfile
import zipfile

import pytest
from helpers.archives import tar_of

from dmlbench.data import download as dl
from dmlbench.data.archives import ArchiveSourceParams, extract_archive, fetch_archives
from dmlbench.data.base import Archive
from dmlbench.errors import DataError
from dmlbench.io import md5_file


@pytest.fixture
def payload(file_server):
    """A 300 kB file on the server: (name, bytes, md5)."""
    import hashlib
    import os

    data = os.urandom(300_000)
    (file_server.root / "blob.bin").write_bytes(data)
    return "blob.bin", data, hashlib.md5(data).hexdigest()


def test_dropped_connection_is_resumed_with_a_range_request(tmp_path, file_server, payload, fast_retries):
    name, data, md5 = payload
    dest = tmp_path / "data" / name
    got = dl.download(f"{file_server.url}/drop/{name}", dest, md5=md5, size=len(data))
    assert got == md5 and dest.read_bytes() == data
    assert file_server.requests == [(f"/drop/{name}", None), (f"/drop/{name}", f"bytes={len(data) // 2}-")]
    assert not dl.partial_path(dest).exists()


def test_partial_file_from_an_earlier_run_is_resumed(tmp_path, file_server, payload):
    name, data, md5 = payload
    dest = tmp_path / name
    dl.partial_path(dest).write_bytes(data[:123_456])
    assert dl.download(f"{file_server.url}/{name}", dest, md5=md5) == md5
    assert file_server.requests == [(f"/{name}", "bytes=123456-")] and dest.read_bytes() == data


def test_server_ignoring_range_restarts_the_file(tmp_path, file_server, payload):
    name, data, md5 = payload
    dest = tmp_path / name
    dl.partial_path(dest).write_bytes(b"x" * 1000)  # stale bytes that must not survive
    assert dl.download(f"{file_server.url}/norange/{name}", dest, md5=md5) == md5
    assert dest.read_bytes() == data


def test_wrong_md5_leaves_no_file_that_looks_valid(tmp_path, file_server, payload):
    name, data, _ = payload
    dest = tmp_path / name
    with pytest.raises(DataError, match=r"md5 is [0-9a-f]{32}, expected 0{32}; the download was deleted"):
        dl.download(f"{file_server.url}/{name}", dest, md5="0" * 32)
    assert list(tmp_path.iterdir()) == [file_server.root]  # neither blob.bin nor .blob.bin.part


def test_wrong_size_is_rejected(tmp_path, file_server, payload):
    name, data, md5 = payload
    with pytest.raises(DataError, match=r"got 300,000 bytes, expected 300,001; the download was deleted"):
        dl.download(f"{file_server.url}/{name}", tmp_path / name, md5=md5, size=len(data) + 1)
    assert not (tmp_path / name).exists() and not dl.partial_path(tmp_path / name).exists()


def test_transient_errors_are_retried_with_backoff(tmp_path, file_server, payload, monkeypatch):
    name, data, md5 = payload
    waits = []
    monkeypatch.setattr(dl.time, "sleep", waits.append)
    assert dl.download(f"{file_server.url}/flaky/{name}", tmp_path / name, md5=md5, backoff=2.0) == md5
    assert waits == [2.0] and [p for p, _ in file_server.requests] == [f"/flaky/{name}"] * 2


def test_unreachable_server_fails_after_the_retries(tmp_path, monkeypatch):
    import socket

    waits = []
    monkeypatch.setattr(dl.time, "sleep", waits.append)
    with socket.socket() as probe:  # a port nobody listens on
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    with pytest.raises(DataError, match=r"download failed after 4 attempts .*next run resumes it"):
        dl.download(f"http://127.0.0.1:{port}/x.tgz", tmp_path / "x.tgz", retries=3, backoff=1.0)
    assert waits == [1.0, 2.0, 4.0] and not (tmp_path / "x.tgz").exists()


def test_http_404_is_not_retried(tmp_path, file_server, payload, monkeypatch):
    name, _, _ = payload
    monkeypatch.setattr(dl.time, "sleep", lambda s: pytest.fail("404 must not be retried"))
    with pytest.raises(DataError, match=r"/404/blob.bin: HTTP 404"):
        dl.download(f"{file_server.url}/404/{name}", tmp_path / name)
    assert len(file_server.requests) == 1


# --------------------------------------------------------------------------- extraction


@pytest.mark.parametrize(
    "entry, message",
    [
        ({"name": "../evil.txt"}, "would be written outside"),
        ({"name": "ok/../../evil.txt"}, "would be written outside"),
        ({"name": "/tmp/evil.txt"}, "absolute path"),
        ({"name": "link", "type": tarfile.SYMTYPE, "linkname": "../../etc"}, "is a link to '../../etc'"),
        ({"name": "inner", "type": tarfile.SYMTYPE, "linkname": "ok"}, "is a link"),
        ({"name": "hard", "type": tarfile.LNKTYPE, "linkname": "ok/a.txt"}, "is a link"),
        ({"name": "dev", "type": tarfile.CHRTYPE}, "device or fifo"),
    ],
)
def test_tar_extraction_rejects_unsafe_entries(tmp_path, entry, message):
    content = None if entry.get("type") in (tarfile.SYMTYPE, tarfile.LNKTYPE, tarfile.CHRTYPE) else b"x"
    archive = tar_of(tmp_path / "bad.tgz", [({"name": "ok/a.txt"}, b"fine"), (dict(entry), content)])
    target = tmp_path / "sandbox" / "out"
    with pytest.raises(DataError, match=message):
        extract_archive(archive, target)
    assert not (tmp_path / "sandbox" / "evil.txt").exists() and not (tmp_path / "evil.txt").exists()


def test_zip_extraction_rejects_traversal_and_symlinks(tmp_path):
    traversal = tmp_path / "traversal.zip"
    with zipfile.ZipFile(traversal, "w") as zf:
        zf.writestr("ok.txt", "fine")
        zf.writestr("../evil.txt", "bad")
    with pytest.raises(DataError, match=r"entry '../evil.txt' would be written outside"):
        extract_archive(traversal, tmp_path / "out")
    link = tmp_path / "link.zip"
    with zipfile.ZipFile(link, "w") as zf:
        info = zipfile.ZipInfo("escape")
        info.external_attr = 0o120777 << 16  # S_IFLNK
        zf.writestr(info, "/etc/passwd")
    with pytest.raises(DataError, match=r"entry 'escape' is a symbolic link"):
        extract_archive(link, tmp_path / "out2")
    assert not (tmp_path / "evil.txt").exists()
    not_an_archive = tmp_path / "x.tgz"
    not_an_archive.write_bytes(b"garbage" * 100)
    with pytest.raises(DataError, match="neither a zip nor a tar archive"):
        extract_archive(not_an_archive, tmp_path / "out3")


def test_fetch_with_an_unsafe_archive_leaves_no_raw_directory(tmp_path):
    archive = tar_of(tmp_path / "evil.tgz", [({"name": "good.txt"}, b"ok"), ({"name": "../../evil.txt"}, b"x")])
    dropbox = tmp_path / "data"
    dropbox.mkdir()
    shutil.copy(archive, dropbox / "evil.tgz")
    spec = (Archive(key="archive", filename="evil.tgz", url=None, md5=md5_file(archive)),)
    raw = tmp_path / "artifacts" / "raw" / "x"
    with pytest.raises(DataError, match="would be written outside"):
        fetch_archives("x", spec, ArchiveSourceParams(), raw, dropbox)
    assert not raw.exists() and list(raw.parent.iterdir()) == []  # the temporary directory is gone too
