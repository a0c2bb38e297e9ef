"""A Hugging Face Hub on 127.0.0.1 for the tests and the benchmark: the endpoints huggingface_hub
calls to judge a repo without downloading it, served from local directories.

Speaks the Hub's protocol for: model and revision info (``/api/models/{repo}[/revision/{rev}]``),
the tree (``/api/models/{repo}/tree/{rev}``, recursive), paths-info with LFS oids
(``POST /api/models/{repo}/paths-info/{rev}``), and ``/{repo}/resolve/{rev}/{file}`` (HEAD and
GET) with ``X-Repo-Commit``, ``ETag``, ``X-Linked-Size`` and Range → 206. Errors as the Hub sends
them (``X-Error-Code``: RepoNotFound, RevisionNotFound, EntryNotFound, GatedRepo; 429 with
``Retry-After``). Bounded: at most ``max_requests`` requests, each socket with a timeout; started
and stopped by its user (``with HubServer(...) as hub``). Every response closes its connection:
a client's pooled connection can never reach a stopped server that a new one replaced on the
same port. Counts requests and body bytes sent.
"""

from __future__ import annotations

import hashlib
import json
import os
import threading
import time
import urllib.parse
from collections.abc import Callable
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

LFS_SUFFIXES = (".safetensors", ".bin", ".pt", ".pth", ".gguf")


@dataclass
class Repo:
    """One served repo: its files (a directory), its one commit and the names that resolve to it."""

    root: Path
    commit: str
    branches: tuple[str, ...] = ("main",)
    oid: Callable[[Path], str] | None = None  # the LFS oid of a file (default: its SHA-256)
    _oids: dict[str, str] = field(default_factory=dict)

    def resolves(self, revision: str) -> bool:
        return revision == self.commit or revision in self.branches

    def files(self) -> list[tuple[str, Path]]:
        found = []
        for path in sorted(self.root.rglob("*")):
            if path.is_file():
                found.append((path.relative_to(self.root).as_posix(), path))
        return found

    def folders(self) -> list[str]:
        return sorted(p.relative_to(self.root).as_posix() for p in self.root.rglob("*") if p.is_dir())

    def lfs_oid(self, name: str, path: Path) -> str:
        if name not in self._oids:
            if self.oid is not None:
                self._oids[name] = self.oid(path)
            else:
                digest = hashlib.sha256()
                with open(path, "rb") as handle:
                    while chunk := handle.read(1 << 20):
                        digest.update(chunk)
                self._oids[name] = digest.hexdigest()
        return self._oids[name]

    def entry(self, name: str, path: Path) -> dict[str, Any]:
        size = path.stat().st_size
        item: dict[str, Any] = {"type": "file", "path": name, "size": size,
                                "oid": hashlib.sha1(name.encode()).hexdigest()}
        if name.endswith(LFS_SUFFIXES):
            item["lfs"] = {"oid": self.lfs_oid(name, path), "size": size, "pointerSize": 134}
        return item


@dataclass
class Fault:
    """What the server does instead of answering: an HTTP ``status`` (with ``X-Error-Code``
    ``code`` and ``headers``) or a ``delay`` in seconds, for requests whose path contains ``match``."""

    match: str = ""
    status: int | None = None
    code: str | None = None
    headers: dict[str, str] = field(default_factory=dict)
    delay: float = 0.0


class HubServer:
    """The server: ``repos`` by repo id; ``fault`` (optional) applied to matching requests."""

    def __init__(self, repos: dict[str, Repo], *, max_requests: int = 20_000, timeout: float = 10.0) -> None:
        self.repos = repos
        self.fault: Fault | None = None
        self.requests: list[tuple[str, str, str | None]] = []  # (method, path, Range)
        self.bytes_sent = 0
        self.max_requests = max_requests
        self._lock = threading.Lock()
        server = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def setup(self) -> None:
                self.timeout = timeout
                super().setup()

            def log_message(self, *args: Any) -> None:  # quiet
                return

            def do_GET(self) -> None:
                server._handle(self, "GET")

            def do_HEAD(self) -> None:
                server._handle(self, "HEAD")

            def do_POST(self) -> None:
                server._handle(self, "POST")

        class Server(ThreadingHTTPServer):
            def handle_error(self, request: Any, client_address: Any) -> None:
                pass  # a client that gave up (a timeout test) is not the server's failure

        self._httpd = Server(("127.0.0.1", 0), Handler)
        self._httpd.daemon_threads = True
        self._thread = threading.Thread(target=self._httpd.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)

    @property
    def endpoint(self) -> str:
        host, port = self._httpd.server_address[:2]
        return f"http://{host}:{port}"

    def __enter__(self) -> HubServer:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._httpd.shutdown()
        self._httpd.server_close()

        self._thread.join(timeout=5)

    def reset_counts(self) -> None:
        with self._lock:
            self.requests.clear()
            self.bytes_sent = 0

    # ------------------------------------------------------------------ protocol

    def _send(self, handler: BaseHTTPRequestHandler, status: int, body: bytes = b"", *, method: str = "GET",
              headers: dict[str, str] | None = None, content_type: str = "application/json") -> None:
        handler.send_response(status)
        handler.send_header("Connection", "close")
        handler.close_connection = True
        handler.send_header("Content-Type", content_type)
        handler.send_header("Content-Length", str(len(body)))
        for key, value in (headers or {}).items():
            handler.send_header(key, value)
        handler.end_headers()
        if method != "HEAD":
            handler.wfile.write(body)
            with self._lock:
                self.bytes_sent += len(body)

    def _error(self, handler: BaseHTTPRequestHandler, status: int, code: str | None, message: str, method: str,
               headers: dict[str, str] | None = None) -> None:
        extra = dict(headers or {})
        if code:
            extra["X-Error-Code"] = code
        extra["X-Error-Message"] = message
        self._send(handler, status, json.dumps({"error": message}).encode(), method=method, headers=extra)

    def _handle(self, handler: BaseHTTPRequestHandler, method: str) -> None:
        parsed = urllib.parse.urlsplit(handler.path)
        path = urllib.parse.unquote(parsed.path)
        with self._lock:
            self.requests.append((method, path, handler.headers.get("Range")))
            over = len(self.requests) > self.max_requests
        if over:
            self._error(handler, 503, None, "request budget of the test server spent", method)
            return
        body = b""
        if method == "POST":
            body = handler.rfile.read(int(handler.headers.get("Content-Length") or 0))
        fault = self.fault
        if fault is not None and fault.match in path:
            if fault.delay:
                time.sleep(fault.delay)
            if fault.status is not None:
                self._error(handler, fault.status, fault.code, f"fault {fault.status}", method, fault.headers)
                return
        if path.startswith("/api/models/"):
            self._api(handler, method, path[len("/api/models/"):], parsed.query, body)
        elif "/resolve/" in path:
            self._resolve(handler, method, path.lstrip("/"))
        else:
            self._error(handler, 404, None, "not found", method)

    def _repo(self, handler: BaseHTTPRequestHandler, method: str, rest: str) -> tuple[str, Repo, str] | None:
        parts = rest.split("/", 2)
        repo_id = "/".join(parts[:2])
        repo = self.repos.get(repo_id)
        if repo is None:
            self._error(handler, 404 if "private" not in repo_id else 401, "RepoNotFound", "Repository not found",
                        method)
            return None
        return repo_id, repo, parts[2] if len(parts) > 2 else ""

    def _api(self, handler: BaseHTTPRequestHandler, method: str, rest: str, query: str, body: bytes) -> None:
        found = self._repo(handler, method, rest)
        if found is None:
            return
        repo_id, repo, tail = found
        action, _, revision_and_path = tail.partition("/")
        revision, _, sub = revision_and_path.partition("/")
        if not action:
            action, revision = "revision", "main"
        if not repo.resolves(revision):
            self._error(handler, 404, "RevisionNotFound", f"Invalid rev id: {revision}", method)
            return
        if action == "revision":
            document: Any = {"id": repo_id, "modelId": repo_id, "sha": repo.commit, "private": False,
                             "siblings": [{"rfilename": name} for name, _ in repo.files()]}
        elif action == "tree":
            recursive = "recursive=true" in query.lower() or "recursive=1" in query
            prefix = f"{sub}/" if sub else ""
            entries = [repo.entry(name, p) for name, p in repo.files() if name.startswith(prefix)]
            entries += [{"type": "directory", "path": d, "oid": hashlib.sha1(d.encode()).hexdigest()}
                        for d in repo.folders() if d.startswith(prefix)]
            if not recursive:
                depth = prefix.count("/")
                entries = [e for e in entries if e["path"].count("/") == depth]
            document = sorted(entries, key=lambda e: e["path"])
        elif action == "paths-info" and method == "POST":
            wanted = _posted_paths(body, handler.headers.get("Content-Type", ""))
            files = dict(repo.files())
            folders = set(repo.folders())
            document = [repo.entry(name, files[name]) for name in wanted if name in files]
            document += [{"type": "directory", "path": name, "oid": "0" * 40} for name in wanted if name in folders]
        else:
            self._error(handler, 404, None, f"no endpoint {action}", method)
            return
        self._send(handler, 200, json.dumps(document).encode(), method=method)

    def _resolve(self, handler: BaseHTTPRequestHandler, method: str, rest: str) -> None:
        found = self._repo(handler, method, rest)
        if found is None:
            return
        _, repo, tail = found
        revision, _, name = tail.removeprefix("resolve/").partition("/")
        if not repo.resolves(revision):
            self._error(handler, 404, "RevisionNotFound", f"Invalid rev id: {revision}", method)
            return
        files = dict(repo.files())
        if name not in files:
            self._error(handler, 404, "EntryNotFound", f"{name} does not exist", method)
            return
        file = files[name]
        size = file.stat().st_size
        lfs = name.endswith(LFS_SUFFIXES)
        etag = repo.lfs_oid(name, file) if lfs else hashlib.sha1(name.encode()).hexdigest()
        headers = {"X-Repo-Commit": repo.commit, "ETag": f'"{etag}"', "Accept-Ranges": "bytes"}
        if lfs:
            headers.update({"X-Linked-Size": str(size), "X-Linked-Etag": f'"{etag}"'})
        ranged = handler.headers.get("Range")
        start, end, status = 0, size - 1, 200
        if ranged and ranged.startswith("bytes="):
            first, _, last = ranged[len("bytes="):].partition("-")
            start = int(first) if first else max(0, size - int(last))
            end = min(int(last), size - 1) if (last and first) else size - 1
            if start >= size or end < start:
                self._send(handler, 416, b"", method=method, headers={"Content-Range": f"bytes */{size}", **headers})
                return
            status = 206
            headers["Content-Range"] = f"bytes {start}-{end}/{size}"
        handler.send_response(status)
        handler.send_header("Connection", "close")
        handler.close_connection = True
        handler.send_header("Content-Type", "application/octet-stream")
        handler.send_header("Content-Length", str(end - start + 1))
        for key, value in headers.items():
            handler.send_header(key, value)
        handler.end_headers()
        if method == "HEAD":
            return
        with open(file, "rb") as handle:  # streamed: a whole shard never sits in memory
            handle.seek(start)
            left = end - start + 1
            while left > 0:
                chunk = handle.read(min(left, 8 << 20))
                if not chunk:
                    break
                handler.wfile.write(chunk)
                left -= len(chunk)
                with self._lock:
                    self.bytes_sent += len(chunk)


def _posted_paths(body: bytes, content_type: str) -> list[str]:
    """The ``paths`` of a paths-info request, form-encoded (huggingface_hub's) or JSON."""
    if "json" in content_type:
        paths = json.loads(body or b"{}").get("paths", [])
        return [paths] if isinstance(paths, str) else list(paths)
    return urllib.parse.parse_qs(body.decode(), keep_blank_values=True).get("paths", [])


def serve_directory(root: str | os.PathLike[str], repo_id: str, commit: str, **kwargs: Any) -> HubServer:
    """A server holding one repo: the directory ``root`` at ``commit``."""
    return HubServer({repo_id: Repo(Path(root), commit, **kwargs)})


def endpoint_settings(endpoint: str) -> list[tuple[Any, str, Any]]:
    """(object, attribute, value) that point huggingface_hub at ``endpoint`` in this process: its
    constants read ``HF_ENDPOINT`` at import, and 0.x's ``file_download`` keeps its own copy of
    the resolve URL template. Apply them with ``monkeypatch.setattr`` (and set ``HF_ENDPOINT``)."""
    from huggingface_hub import constants, file_download

    template = endpoint + "/{repo_id}/resolve/{revision}/{filename}"
    settings: list[tuple[Any, str, Any]] = [(constants, "ENDPOINT", endpoint),
                                            (constants, "HUGGINGFACE_CO_URL_TEMPLATE", template)]
    if hasattr(file_download, "HUGGINGFACE_CO_URL_TEMPLATE"):
        settings.append((file_download, "HUGGINGFACE_CO_URL_TEMPLATE", template))
    return settings
