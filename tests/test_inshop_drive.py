"""In-Shop from Google Drive (the file ids with their resource keys, the confirmation page Drive
shows instead of a large file), SOP's Drive mirror after the Stanford URL (the md5 decides), the
md5s and sha256s of files without a published checksum recorded on first use, and one short line
when Drive refuses. A fake Drive on 127.0.0.1 answers as drive.usercontent.google.com does."""

from __future__ import annotations

import dataclasses
import hashlib
import http.cookiejar
import http.server
import shutil
import threading
import urllib.parse
from pathlib import Path

import pytest
from helpers.archives import build_inshop

from dmlbench.data import download as dl
from dmlbench.data import inshop, sop
from dmlbench.data.archives import fetch_archives, resolve
from dmlbench.data.cache import PreparedDataset
from dmlbench.data.prepare import prepare_dataset
from dmlbench.errors import DataError
from dmlbench.io import md5_file, read_json

DRIVE = "https://drive.usercontent.google.com"
QUOTA = "Too many users have viewed or downloaded this file recently. Please try accessing the file again later."


class FakeDrive:
    """``/download?id=..``: a registered file, through a virus-scan page (a form whose hidden
    ``uuid`` and a ``download_warning`` cookie must come back) when ``confirm``; the file only
    with its resource key; ``quota`` ids answer Drive's quota page. ``requests``: the query and
    Cookie header of each request."""

    def __init__(self):
        self.files: dict[str, dict] = {}
        self.requests: list[tuple[dict, str | None]] = []
        drive = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def log_message(self, *args):
                pass

            def do_GET(self):
                url = urllib.parse.urlsplit(self.path)
                query = dict(urllib.parse.parse_qsl(url.query))
                drive.requests.append((query, self.headers.get("Cookie")))
                entry = drive.files.get(query.get("id"))
                if url.path != "/download" or entry is None:
                    return self.send_error(404)
                if entry.get("quota"):
                    return self._html(f'<html><p class="uc-error-subcaption">{QUOTA}</p></html>')
                if entry["key"] and query.get("resourcekey") != entry["key"]:
                    return self.send_error(404)  # what Drive answers without the resource key
                confirmed = query.get("uuid") == "u-1" and "download_warning=t" in (self.headers.get("Cookie") or "")
                if entry["confirm"] and not confirmed:
                    return self._html(
                        '<html><title>Google Drive - Virus scan warning</title><p class="uc-warning-subcaption">'
                        "can't scan this file for viruses</p>"
                        f'<form id="download-form" action="{drive.url}/download" method="get">'
                        '<input type="submit" id="uc-download-link" value="Download anyway"/>'
                        f'<input type="hidden" name="id" value="{query["id"]}">'
                        '<input type="hidden" name="export" value="download">'
                        '<input type="hidden" name="confirm" value="t">'
                        '<input type="hidden" name="uuid" value="u-1"></form></html>',
                        cookie="download_warning=t; Path=/",
                    )
                data = entry["data"]
                start = int(self.headers["Range"].split("=")[1].split("-")[0]) if self.headers.get("Range") else 0
                self.send_response(206 if start else 200)
                self.send_header("Content-Type", "application/octet-stream")
                self.send_header("Content-Disposition", f'attachment; filename="{entry["name"]}"')
                self.send_header("Content-Length", str(len(data) - start))
                if start:
                    self.send_header("Content-Range", f"bytes {start}-{len(data) - 1}/{len(data)}")
                self.end_headers()
                self.wfile.write(data[start:])

            def _html(self, page: str, cookie: str | None = None):
                body = page.encode()
                self.send_response(200)
                self.send_header("Content-Type", "text/html; charset=utf-8")
                if cookie:
                    self.send_header("Set-Cookie", cookie)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

        self._server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self._server.server_address[1]}"
        threading.Thread(target=self._server.serve_forever, daemon=True).start()

    def add(self, file_id: str, path: Path, key: str | None = None, confirm: bool = True) -> None:
        self.files[file_id] = {"data": path.read_bytes(), "name": path.name, "key": key, "confirm": confirm}

    def local(self, url: str) -> str:
        """A published drive.usercontent.google.com URL, pointed at this server."""
        assert url.startswith(f"{DRIVE}/download?")
        return self.url + url[len(DRIVE) :]


@pytest.fixture
def drive(monkeypatch):
    """The fake Drive, with 127.0.0.1 handled as a Drive host and a fresh cookie jar."""
    for name in ("http_proxy", "https_proxy", "HTTP_PROXY", "HTTPS_PROXY", "all_proxy", "ALL_PROXY"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setattr(dl, "DRIVE_HOSTS", dl.DRIVE_HOSTS | {"127.0.0.1"})
    monkeypatch.setattr(dl, "_COOKIES", http.cookiejar.CookieJar())
    server = FakeDrive()
    yield server
    server._server.shutdown()
    server._server.server_close()


@pytest.fixture(scope="module")
def inshop_files(tmp_path_factory) -> dict[str, Path]:
    built = build_inshop(tmp_path_factory.mktemp("inshop"))
    return {path.name: path for path in built["files"]}


def inshop_params(source: dict) -> inshop.InshopParams:
    split = {"scheme": "standard"}
    source = {"allow_subset": True, **source}  # 46 images of the 52,712
    return inshop.InshopParams.model_validate({"source": source, "image_size": 16, "split": split})


def test_the_published_urls_carry_the_resource_keys():
    assert inshop.IMAGES.url == (
        f"{DRIVE}/download?id=0B7EVK8r0v71pS2YxRE1QTFZzekU&export=download&confirm=t"
        "&resourcekey=0-2n-dbZygJiZdm0UbEaFRTA"
    )
    assert inshop.PARTITION_FILE.url.endswith("id=0B7EVK8r0v71pYVBqLXpRVjhHeWM&export=download&confirm=t"
                                              "&resourcekey=0-rxJ2QcImN-IRo_Bv9QSXmg")  # fmt: skip
    assert "resourcekey=0-4R4v6zl4CWhHTsUGOsTstw" in inshop.DRIVE_FOLDER
    assert sop.ARCHIVE.mirrors == (f"{DRIVE}/download?id=1TclrpQOF_ullUP99wk_gjGN8pKvtErG8&export=download&confirm=t",)


def test_inshop_through_the_confirmation_page_then_prepared(tmp_path, drive, inshop_files, capsys):
    images_id, images_key = inshop.IMAGES_DRIVE
    partition_id, partition_key = inshop.PARTITION_DRIVE
    drive.add(images_id, inshop_files["img.zip"], key=images_key)  # large: the virus-scan page first
    drive.add(partition_id, inshop_files["list_eval_partition.txt"], key=partition_key, confirm=False)
    source = {
        "images": {"url": drive.local(inshop.IMAGES.url)},
        "partition": {"url": drive.local(inshop.PARTITION_FILE.url)},
    }
    params, dropbox, raw = inshop_params(source), tmp_path / "data", tmp_path / "raw"
    inshop.SPEC.fetch(params, raw, dropbox)

    # img.zip: the page (no uuid, no cookie), then the form's URL with the cookie and the resource key
    (page, _), (confirmed, cookie), (partition, _) = drive.requests
    assert page == {"id": images_id, "export": "download", "confirm": "t", "resourcekey": images_key}
    assert confirmed == {**page, "uuid": "u-1"} and cookie == "download_warning=t"
    assert partition["resourcekey"] == partition_key
    for name, path in inshop_files.items():
        assert md5_file(dropbox / name) == md5_file(path)
        sha256 = hashlib.sha256(path.read_bytes()).hexdigest()
        assert (dropbox / f"{name}.sha256").read_text() == f"{sha256}  {name}\n"
    err = capsys.readouterr().err
    assert f"inshop: img.zip has no published md5; its md5 is {md5_file(inshop_files['img.zip'])} " in err
    assert "(pin it with datasets.inshop.source.images.md5)" in err
    records = {r["filename"]: r for r in read_json(raw / "archives.json")}
    assert records["img.zip"]["url"] == source["images"]["url"] and len(records["img.zip"]["sha256"]) == 64

    prepare_dataset(inshop.SPEC, params, raw, tmp_path / "prepared", workers=1)
    manifest = PreparedDataset.load(tmp_path / "prepared").manifest
    assert set(manifest.split) == {"train", "query", "gallery"}
    assert set(manifest.label[manifest.split == "query"]) == set(range(9, 17))

    # from the drop-box now: no request, the recorded sha256 checked, nothing said
    drive.requests.clear()
    inshop.SPEC.fetch(params, raw, dropbox)
    assert drive.requests == [] and "no published md5" not in capsys.readouterr().err


def test_drive_refusing_is_one_line_naming_the_page_to_download_from(tmp_path, drive, inshop_files):
    images_id, images_key = inshop.IMAGES_DRIVE
    drive.files[images_id] = {"quota": True}
    drive.add(inshop.PARTITION_DRIVE[0], inshop_files["list_eval_partition.txt"], key=inshop.PARTITION_DRIVE[1])
    source = {"images": {"url": drive.local(inshop.IMAGES.url)}}
    with pytest.raises(DataError) as error:
        inshop.SPEC.fetch(inshop_params(source), tmp_path / "raw", tmp_path / "data")
    message = str(error.value)
    assert "\n" not in message and len(drive.requests) == 1  # not retried: Drive said no
    host = drive.url.removeprefix("http://")
    assert message.startswith(f"inshop: {host}: Google Drive sent a page, not the file ({QUOTA})")
    assert f"({QUOTA})" in message
    assert message.endswith(
        f"; or place img.zip (md5 not published) in {tmp_path / 'data'}/ "
        f"(from https://drive.google.com/file/d/{images_id}/view?resourcekey={images_key})"
    )
    assert not (tmp_path / "raw").exists() and not list((tmp_path / "data").glob("*img.zip*"))


def test_a_changed_copy_of_a_file_without_md5_is_refused(tmp_path, inshop_files):
    dropbox = tmp_path / "data"
    dropbox.mkdir()
    for path in inshop_files.values():
        shutil.copy(path, dropbox / path.name)
    params = inshop_params({})
    inshop.SPEC.fetch(params, tmp_path / "raw", dropbox)
    partition = dropbox / "list_eval_partition.txt"
    partition.write_text(partition.read_text().replace("gallery", "query", 1))
    with pytest.raises(DataError, match=rf"^{partition}: sha256 [0-9a-f]{{64}} differs from [0-9a-f]{{64}} recorded"):
        inshop.SPEC.fetch(params, tmp_path / "raw", dropbox)
    # a pinned md5 is the judge instead of the record
    pinned = inshop_params({"partition": {"md5": md5_file(partition)}})
    inshop.SPEC.fetch(pinned, tmp_path / "raw", dropbox)


def test_sop_falls_back_to_its_drive_mirror_and_the_md5_decides(tmp_path, drive, file_server, real_format_archives):
    zip_path = real_format_archives["sop"]["files"][0]
    md5 = real_format_archives["sop"]["md5"][zip_path.name]
    drive.add("sop-id", zip_path)  # no resource key; through the virus-scan page
    mirror = f"{drive.url}/download?id=sop-id&export=download&confirm=t"
    (file_server.root / zip_path.name).write_bytes(b"an HTML error page, not the archive")
    for primary in (f"{file_server.url}/404/{zip_path.name}", f"{file_server.url}/{zip_path.name}"):  # 404, wrong md5
        archive = dataclasses.replace(sop.ARCHIVE, url=primary, md5=md5, size=None, mirrors=(mirror,))
        dropbox, raw = tmp_path / primary.split("/")[-2] / "data", tmp_path / primary.split("/")[-2] / "raw"
        fetch_archives("sop", (archive,), sop.SopSource(), raw, dropbox)
        assert md5_file(dropbox / zip_path.name) == md5 and read_json(raw / "archives.json")[0]["url"] == mirror
        assert (raw / "Stanford_Online_Products" / "Ebay_train.txt").exists()
    # a URL set in params.yaml replaces the published one and its mirrors
    (item,) = resolve((sop.ARCHIVE,), sop.SopSource.model_validate({"archive": {"url": primary}}))
    assert item.urls == (primary,)
    assert resolve((sop.ARCHIVE,), sop.SopSource())[0].urls == (sop.ARCHIVE.url, *sop.ARCHIVE.mirrors)


def test_every_url_failing_names_each_in_one_line(tmp_path, file_server, monkeypatch):
    monkeypatch.setattr(dl.time, "sleep", lambda s: None)
    archive = dataclasses.replace(
        sop.ARCHIVE, url=f"{file_server.url}/404/a.zip", mirrors=(f"{file_server.url}/404/b.zip",)
    )
    with pytest.raises(DataError) as error:
        fetch_archives("sop", (archive,), sop.SopSource(), tmp_path / "raw", tmp_path / "data")
    message = str(error.value)
    assert "\n" not in message
    assert message.startswith(f"sop: {file_server.url}/404/a.zip: HTTP 404 ")
    assert f"; {file_server.url}/404/b.zip: HTTP 404 " in message
    assert message.endswith(f"in {tmp_path / 'data'}/ (from https://cvgl.stanford.edu/projects/lifted_struct/)")
