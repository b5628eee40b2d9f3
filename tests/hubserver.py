"""A loopback HTTP server speaking the part of the Hugging Face Hub protocol that huggingface_hub uses.

Endpoints, as huggingface_hub (1.x) calls them (see `HfApi.model_info`, `HfApi.list_repo_tree`,
`file_download.get_hf_file_metadata` / `http_get`):
- `GET /api/models/{repo}[/revision/{rev}]?blobs=true` → `{id, sha, siblings: [{rfilename, size, blobId}]}`
- `GET /api/models/{repo}/tree/{rev}[/{path}]?recursive=...` → `[{type, path, size, oid}]`
- `HEAD|GET /{repo}/resolve/{rev}/{file}` with `Range: bytes=a-b` → 206 + `Content-Range`; headers
  `X-Repo-Commit`, `ETag`, `Content-Length`, `Accept-Ranges`. Unknown repo → 404 with `X-Error-Code`.

Every body byte sent is counted (`bytes_served`, per file in `served`), so tests can assert that a remote
lint read only headers and JSON files. Binds 127.0.0.1 on an ephemeral port only.
"""

from __future__ import annotations

import hashlib
import json
import re
import threading
import time
from collections import defaultdict
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import unquote, urlsplit

_RESOLVE = re.compile(r"^/(?P<repo>[^/]+/[^/]+)/resolve/(?P<rev>[^/]+)/(?P<file>.+)$")
_INFO = re.compile(r"^/api/models/(?P<repo>[^/]+/[^/]+?)(?:/revision/(?P<rev>[^/]+))?$")
_TREE = re.compile(r"^/api/models/(?P<repo>[^/]+/[^/]+)/tree/(?P<rev>[^/]+)(?:/(?P<path>.+))?$")


class HubServer:
    def __init__(self) -> None:
        self.repos: dict[str, tuple[str, Path]] = {}  # repo id → (commit, directory)
        self.bytes_served = 0
        self.served: dict[str, int] = defaultdict(int)
        self.requests: list[str] = []
        self.authorization: list[str] = []  # the Authorization header of each request that carried one
        self.latency = 0.0  # seconds added to every request (a benchmark's stand-in for a network round trip)
        self._lock = threading.Lock()
        server = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args: object) -> None:  # quiet
                pass

            def do_HEAD(self) -> None:
                server._handle(self, head=True)

            def do_GET(self) -> None:
                server._handle(self, head=False)

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.httpd.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"
        self._thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)

    # ---- lifecycle ----------------------------------------------------------------------------------
    def start(self) -> HubServer:
        self._thread.start()
        return self

    def stop(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()
        self._thread.join(timeout=10)

    def add(self, repo_id: str, directory: Path) -> str:
        """Serve `directory` as `repo_id`; returns the commit sha it is served at."""
        commit = hashlib.sha1(f"{repo_id}:{directory}".encode()).hexdigest()
        self.repos[repo_id] = (commit, directory)
        return commit

    def reset_counts(self) -> None:
        with self._lock:
            self.bytes_served = 0
            self.served.clear()
            self.requests.clear()

    # ---- protocol -----------------------------------------------------------------------------------
    def _files(self, directory: Path) -> dict[str, Path]:
        return {p.relative_to(directory).as_posix(): p for p in sorted(directory.rglob("*")) if p.is_file()}

    def _repo(self, handler: BaseHTTPRequestHandler, repo: str, rev: str | None) -> tuple[str, Path] | None:
        found = self.repos.get(repo)
        if found is None or (rev not in (None, "main", found[0])):
            code = "RepoNotFound" if found is None else "RevisionNotFound"
            self._send(handler, 404, b'{"error": "not found"}', {"X-Error-Code": code}, head=False)
            return None
        return found

    def _handle(self, handler: BaseHTTPRequestHandler, *, head: bool) -> None:
        parts = urlsplit(handler.path)
        path, query = unquote(parts.path), parts.query
        with self._lock:
            self.requests.append(f"{handler.command} {handler.path} {handler.headers.get('Range', '')}")
            if handler.headers.get("Authorization"):
                self.authorization.append(handler.headers["Authorization"])
        if self.latency:
            time.sleep(self.latency)
        if m := _TREE.match(path):
            found = self._repo(handler, m["repo"], m["rev"])
            if found is None:
                return
            sub = (m["path"] or "").strip("/")
            rows = [
                {"type": "file", "path": name, "size": p.stat().st_size, "oid": _oid(p)}
                for name, p in self._files(found[1]).items()
                if not sub or name.startswith(sub + "/")
            ]
            self._send(handler, 200, json.dumps(rows).encode(), {"Content-Type": "application/json"}, head)
            return
        if m := _INFO.match(path):
            found = self._repo(handler, m["repo"], m["rev"])
            if found is None:
                return
            blobs = "blobs=true" in query.lower() or "blobs=1" in query
            siblings = [
                {"rfilename": name, **({"size": p.stat().st_size, "blobId": _oid(p)} if blobs else {})}
                for name, p in self._files(found[1]).items()
            ]
            doc = {"id": m["repo"], "modelId": m["repo"], "sha": found[0], "siblings": siblings, "private": False}
            self._send(handler, 200, json.dumps(doc).encode(), {"Content-Type": "application/json"}, head)
            return
        if m := _RESOLVE.match(path):
            found = self._repo(handler, m["repo"], m["rev"])
            if found is None:
                return
            commit, directory = found
            file = self._files(directory).get(m["file"])
            if file is None:
                self._send(handler, 404, b"{}", {"X-Error-Code": "EntryNotFound", "X-Repo-Commit": commit}, head)
                return
            self._send_file(handler, file, m["file"], commit, head)
            return
        self._send(handler, 404, b"{}", {}, head)

    def _send_file(self, handler: BaseHTTPRequestHandler, file: Path, name: str, commit: str, head: bool) -> None:
        size = file.stat().st_size
        headers = {"X-Repo-Commit": commit, "ETag": f'"{_oid(file)}"', "Accept-Ranges": "bytes"}
        rng = handler.headers.get("Range")
        start, end, status = 0, size - 1, 200
        if rng:
            m = re.fullmatch(r"bytes=(\d+)-(\d*)", rng.strip())
            if m is None or int(m[1]) >= size:
                headers["Content-Range"] = f"bytes */{size}"
                self._send(handler, 416, b"", headers, head)
                return
            start = int(m[1])
            end = min(int(m[2]) if m[2] else size - 1, size - 1)
            status = 206
            headers["Content-Range"] = f"bytes {start}-{end}/{size}"
        length = end - start + 1
        headers["Content-Length"] = str(length)
        handler.send_response(status)
        for key, value in headers.items():
            handler.send_header(key, value)
        handler.end_headers()
        if head:
            return
        with open(file, "rb") as fh:
            fh.seek(start)
            left = length
            while left:
                chunk = fh.read(min(left, 1 << 20))
                if not chunk:
                    break
                # Counted before the write: the client may finish (and a test read the counts) before this
                # thread gets past the write.
                with self._lock:
                    self.bytes_served += len(chunk)
                    self.served[name] += len(chunk)
                try:
                    handler.wfile.write(chunk)
                except (BrokenPipeError, ConnectionResetError):
                    with self._lock:
                        self.bytes_served -= len(chunk)
                        self.served[name] -= len(chunk)
                    break
                left -= len(chunk)

    def _send(
        self, handler: BaseHTTPRequestHandler, status: int, body: bytes, headers: dict[str, str], head: bool
    ) -> None:
        handler.send_response(status)
        for key, value in {**headers, "Content-Length": str(len(body))}.items():
            handler.send_header(key, value)
        handler.end_headers()
        if not head:
            with self._lock:  # before the write, as above
                self.bytes_served += len(body)
            handler.wfile.write(body)


def _oid(path: Path) -> str:
    st = path.stat()
    return hashlib.sha1(f"{path}:{st.st_size}:{st.st_mtime_ns}".encode()).hexdigest()
