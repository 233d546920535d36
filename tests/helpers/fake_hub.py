"""A stand-in for the Hugging Face Hub's file endpoint on 127.0.0.1, answering as the Hub does.

``HEAD|GET /<org>/<name>/resolve/<revision>/<file>`` (``revision``: ``main`` or the repo's commit)
answers ``302`` with the Hub's headers: ``X-Repo-Commit`` (the commit ``revision`` resolves to),
``X-Linked-Etag`` (the LFS object id, the file's sha256, quoted), ``X-Linked-Size``, an ``ETag``
(the LFS pointer's git blob id) and ``Location``: the CDN, on another host name (``localhost``), as
the Hub's CDN is on another host, so huggingface_hub reads the metadata from this answer and
downloads from the CDN. Unknown repo, revision or file: ``404`` with the Hub's ``X-Error-Code``.
Switches make it misbehave: ``omit_commit`` (no ``X-Repo-Commit``), ``etag`` (another
``X-Linked-Etag``), ``tamper`` (the CDN serves other bytes than the published sha256's).
"""

from __future__ import annotations

import hashlib
import http.server
import threading
from dataclasses import dataclass, field


@dataclass
class Repo:
    commit: str
    files: dict[str, bytes] = field(default_factory=dict)


class FakeHub:
    def __init__(self) -> None:
        self.repos: dict[str, Repo] = {}
        self.requests: list[tuple[str, str]] = []  # (method, path)
        self.omit_commit = False
        self.etag: str | None = None
        self.tamper = False
        hub = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def log_message(self, *args):
                pass

            def do_HEAD(self):
                hub.answer(self, body=False)

            def do_GET(self):
                hub.answer(self, body=True)

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.port = self.server.server_address[1]
        self.url = f"http://127.0.0.1:{self.port}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def add(self, repo: str, filename: str, data: bytes, commit: str | None = None) -> tuple[str, str]:
        """Publish ``data`` as ``repo/filename`` (at ``commit``, default a fixed one); (commit, sha256)."""
        commit = commit or hashlib.sha1(repo.encode()).hexdigest()
        self.repos.setdefault(repo, Repo(commit)).files[filename] = data
        self.repos[repo].commit = commit
        return commit, hashlib.sha256(data).hexdigest()

    def answer(self, handler: http.server.BaseHTTPRequestHandler, body: bool) -> None:
        self.requests.append((handler.command, handler.path))
        parts = handler.path.split("?")[0].strip("/").split("/")
        if parts[0] == "cdn" and len(parts) == 2:
            data = next((d for r in self.repos.values() for d in r.files.values()
                         if hashlib.sha256(d).hexdigest() == parts[1]), None)  # fmt: skip
            if data is None:
                return self.error(handler, 404, "EntryNotFound")
            data = bytes([data[0] ^ 0xFF]) + data[1:] if self.tamper else data
            handler.send_response(200)
            handler.send_header("Content-Length", str(len(data)))
            handler.send_header("Content-Type", "application/octet-stream")
            handler.end_headers()
            if body:
                handler.wfile.write(data)
            return None
        if len(parts) < 5 or parts[2] != "resolve":
            return self.error(handler, 404, "RepoNotFound")
        repo, revision, filename = f"{parts[0]}/{parts[1]}", parts[3], "/".join(parts[4:])
        if repo not in self.repos:
            return self.error(handler, 404, "RepoNotFound")
        entry = self.repos[repo]
        if revision not in ("main", entry.commit):
            return self.error(handler, 404, "RevisionNotFound")
        if filename not in entry.files:
            return self.error(handler, 404, "EntryNotFound")
        data = entry.files[filename]
        sha256 = hashlib.sha256(data).hexdigest()
        pointer = f"version https://git-lfs.github.com/spec/v1\noid sha256:{sha256}\nsize {len(data)}\n".encode()
        handler.send_response(302)
        if not self.omit_commit:
            handler.send_header("X-Repo-Commit", entry.commit)
        handler.send_header("X-Linked-Etag", f'"{self.etag or sha256}"')
        handler.send_header("X-Linked-Size", str(len(data)))
        handler.send_header("ETag", f'"{hashlib.sha1(pointer).hexdigest()}"')
        handler.send_header("Location", f"http://localhost:{self.port}/cdn/{sha256}")
        handler.send_header("Content-Length", "0")
        handler.end_headers()
        return None

    @staticmethod
    def error(handler: http.server.BaseHTTPRequestHandler, code: int, kind: str) -> None:
        handler.send_response(code)
        handler.send_header("X-Error-Code", kind)
        handler.send_header("Content-Length", "0")
        handler.end_headers()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()
