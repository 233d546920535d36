"""The pre-flight's reachability check (weights and dataset archives): an HTTP HEAD, and a GET of
the first byte where HEAD is refused (presigned S3/CDN URLs sign GET only and answer HEAD with
403); ``DMLBENCH_SKIP_URL_CHECK=1`` skips it. Against a local server on 127.0.0.1."""

from __future__ import annotations

import http.server
import socket
import threading
import urllib.request
from functools import partial

import pytest

from dmlbench.data import cub200
from dmlbench.data.archives import archive_problems
from dmlbench.models.base import WeightsFile
from dmlbench.models.weights import url_unreachable, weights_file_problem


@pytest.fixture
def presigned(tmp_path, monkeypatch):
    """A server like S3 behind a presigned URL: HEAD -> 403 (``/open/`` -> 200, ``/gone/`` -> 404,
    ``/locked/``: GET 403 too), GET -> the file (206 for a Range), ``/moved/<name>`` -> 302 to
    ``/<name>``. Yields (url, requests) with (method, path, Range header) of each request."""
    for name in ("http_proxy", "https_proxy", "HTTP_PROXY", "HTTPS_PROXY", "all_proxy", "ALL_PROXY"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.delenv("DMLBENCH_SKIP_URL_CHECK", raising=False)
    data = bytes(range(256)) * 4096  # 1 MiB
    requests: list[tuple[str, str, str | None]] = []

    class Handler(http.server.BaseHTTPRequestHandler):
        def log_message(self, *args):
            pass

        def _answer(self, body: bool) -> None:
            requests.append((self.command, self.path, self.headers.get("Range")))
            if self.path.startswith("/moved/"):
                self.send_response(302)
                self.send_header("Location", self.path[len("/moved") :])
                self.end_headers()
                return
            refused = self.path.startswith("/locked/") or (not body and not self.path.startswith("/open/"))
            if self.path.startswith("/gone/"):
                return self.send_error(404)
            if refused:
                return self.send_error(403, "SignatureDoesNotMatch")
            ranged = self.headers.get("Range") == "bytes=0-0"
            self.send_response(206 if ranged else 200)
            self.send_header("Content-Length", "1" if ranged else str(len(data)))
            if ranged:
                self.send_header("Content-Range", f"bytes 0-0/{len(data)}")
            self.end_headers()
            if body:
                self.wfile.write(data[:1] if ranged else data)

        def do_HEAD(self):
            self._answer(body=False)

        def do_GET(self):
            self._answer(body=True)

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_address[1]}", requests
    server.shutdown()
    server.server_close()


def test_head_refused_get_works_passes_with_a_ranged_get(presigned):
    url, requests = presigned
    assert url_unreachable(f"{url}/CUB_200_2011.tgz") is None
    assert requests == [("HEAD", "/CUB_200_2011.tgz", None), ("GET", "/CUB_200_2011.tgz", "bytes=0-0")]


def test_a_redirect_to_a_presigned_url(presigned):
    url, requests = presigned
    assert url_unreachable(f"{url}/moved/x.tgz") is None  # CaltechDATA -> S3, say
    assert requests == [
        ("HEAD", "/moved/x.tgz", None),
        ("HEAD", "/x.tgz", None),  # still a HEAD after the redirect
        ("GET", "/moved/x.tgz", "bytes=0-0"),
        ("GET", "/x.tgz", "bytes=0-0"),
    ]


def test_head_answering_needs_no_get_and_a_missing_file_is_not_retried(presigned):
    url, requests = presigned
    assert url_unreachable(f"{url}/open/x.tgz") is None
    assert url_unreachable(f"{url}/gone/x.tgz") == "HTTP 404 Not Found"
    assert url_unreachable(f"{url}/locked/x.tgz") == "HTTP 403 SignatureDoesNotMatch"
    assert [(method, path) for method, path, _ in requests] == [
        ("HEAD", "/open/x.tgz"),
        ("HEAD", "/gone/x.tgz"),
        ("HEAD", "/locked/x.tgz"),
        ("GET", "/locked/x.tgz"),
    ]


def test_weights_and_archives_pass_the_preflight_behind_a_presigned_url(presigned, tmp_path):
    url, _ = presigned
    file = WeightsFile("resnet50", tmp_path / "hub" / "resnet50-0676ba61.pth", f"{url}/resnet50-0676ba61.pth")
    assert weights_file_problem(file) is None and not file.path.exists()  # checked, not downloaded
    source = cub200.Cub200Source.model_validate({"archive": {"url": f"{url}/moved/CUB_200_2011.tgz"}})
    check = partial(url_unreachable, timeout=5.0)
    assert archive_problems("cub200", (cub200.ARCHIVE,), source, tmp_path / "data", check) == []
    locked = cub200.Cub200Source.model_validate({"archive": {"url": f"{url}/locked/CUB_200_2011.tgz"}})
    (line,) = archive_problems("cub200", (cub200.ARCHIVE,), locked, tmp_path / "data", check)
    host = url.removeprefix("http://")
    assert line.startswith(f"cub200: CUB_200_2011.tgz cannot be downloaded ({host}: HTTP 403 SignatureDoesNotMatch)")


@pytest.mark.parametrize("value", ["1", "yes"])
def test_the_check_can_be_skipped(monkeypatch, tmp_path, value):
    def refuse(*args, **kwargs):
        raise AssertionError("the skipped check used the network")

    monkeypatch.setattr(socket, "create_connection", refuse)
    monkeypatch.setattr(urllib.request.OpenerDirector, "open", refuse)
    monkeypatch.setenv("DMLBENCH_SKIP_URL_CHECK", value)
    assert url_unreachable("https://example.invalid/CUB_200_2011.tgz") is None
    file = WeightsFile("resnet50", tmp_path / "resnet50-0676ba61.pth", "https://example.invalid/resnet50.pth")
    assert weights_file_problem(file) is None
    monkeypatch.setenv("DMLBENCH_SKIP_URL_CHECK", "0")
    with pytest.raises(AssertionError, match="used the network"):
        url_unreachable("https://example.invalid/CUB_200_2011.tgz")
