"""Local HTTP servers on 127.0.0.1 for the download code: :class:`FileServer` (Range support and
endpoints that misbehave on purpose) and :class:`StaticServer` (a directory, with redirects)."""

from __future__ import annotations

import http.server
import socket
import threading
from pathlib import Path

# urllib would send requests for 127.0.0.1 through these: tests that serve locally remove them
PROXY_VARIABLES = ("http_proxy", "https_proxy", "HTTP_PROXY", "HTTPS_PROXY", "all_proxy", "ALL_PROXY")


class _Served:
    """An HTTP server on 127.0.0.1 (a free port) in a daemon thread: ``url``, ``close()``."""

    def _serve(self, handler: type[http.server.BaseHTTPRequestHandler]) -> None:
        self._server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
        self.url = f"http://127.0.0.1:{self._server.server_address[1]}"
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)
        self._thread.start()

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()


class FileServer(_Served):
    """Files under ``root`` served at ``url``: ``/<name>`` (Range -> 206), ``/drop/<name>`` (the
    first request without Range announces the whole file, sends half and closes the connection),
    ``/flaky/<name>`` (503 on the first request), ``/norange/<name>`` (ignores Range: always 200 and
    the whole file), ``/404/<name>``. ``requests``: (path, Range header) of every request."""

    def __init__(self, root: Path):
        self.root = root
        self.requests: list[tuple[str, str | None]] = []
        self._served: set[str] = set()
        server_state = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def log_message(self, *args):  # keep pytest output clean
                pass

            def do_GET(self):
                byte_range = self.headers.get("Range")
                server_state.requests.append((self.path, byte_range))
                parts = self.path.strip("/").split("/")
                mode, name = (parts[0], parts[1]) if len(parts) == 2 else ("plain", parts[0])
                file = server_state.root / name
                first_time = (mode, name) not in server_state._served
                server_state._served.add((mode, name))
                if mode == "404" or not file.exists():
                    self.send_error(404)
                    return
                if mode == "flaky" and first_time:
                    self.send_error(503)
                    return
                data = file.read_bytes()
                if mode == "norange":
                    byte_range = None
                start = int(byte_range.split("=")[1].split("-")[0]) if byte_range else 0
                if start >= len(data) and byte_range:
                    self.send_response(416)
                    self.send_header("Content-Range", f"bytes */{len(data)}")
                    self.end_headers()
                    return
                self.send_response(206 if byte_range else 200)
                if byte_range:
                    self.send_header("Content-Range", f"bytes {start}-{len(data) - 1}/{len(data)}")
                self.send_header("Content-Length", str(len(data) - start))
                self.send_header("Accept-Ranges", "bytes")
                self.end_headers()
                if mode == "drop" and not byte_range:
                    self.wfile.write(data[: len(data) // 2])
                    self.wfile.flush()
                    self.close_connection = True
                    self.connection.shutdown(socket.SHUT_RDWR)
                    return
                self.wfile.write(data[start:])

        self._serve(Handler)


class StaticServer(_Served):
    """The files under ``root`` served at ``url``; ``/moved/<name>`` redirects (302) to ``/<name>``.
    ``requests``: (method, path) of every request."""

    def __init__(self, root: Path):
        self.root = root
        self.requests: list[tuple[str, str]] = []
        requests = self.requests

        class Handler(http.server.SimpleHTTPRequestHandler):
            def __init__(self, *args, **kwargs):
                super().__init__(*args, directory=str(root), **kwargs)

            def log_message(self, *args):
                pass

            def send_head(self):
                requests.append((self.command, self.path))
                if self.path.startswith("/moved/"):
                    self.send_response(302)
                    self.send_header("Location", self.path[len("/moved") :])
                    self.end_headers()
                    return None
                return super().send_head()

        self._serve(Handler)
