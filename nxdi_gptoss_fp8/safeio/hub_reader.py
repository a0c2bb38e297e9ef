"""A checkpoint on the Hugging Face Hub read without downloading it: ``HubReader``.

The preflight reads ``config.json``, the index, each shard's safetensors header and the expert
scales (``safeio.reader``); here each is an HTTP range request on ``resolve/COMMIT/FILE``,
through huggingface_hub's own URL builder, session, headers and status handling (0.x's requests
or 2.x's httpx). Every read is pinned to the one commit the revision was resolved to, so a branch
that moves during the run cannot mix two revisions. The headers of all shards are requested in
parallel, then the scales. A shard's SHA-256 is the Hub's LFS record (``paths-info``): zero bytes.

huggingface_hub is imported only here, lazily. Every failure to read (unreachable, a timeout,
401/403, 404, 429) is a ``HubAccessError`` with the one line ``explain`` words for it.
"""

from __future__ import annotations

import importlib
import io
import posixpath
import queue
import threading
from collections.abc import Callable, Iterable, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, BinaryIO, TypeVar

from ..errors import HubAccessError
from ..units import plural
from .files import FileIdentity
from .json_file import MAX_JSON_FILE_BYTES, JsonFileError, parse_json_bytes
from .reader import CheckpointReader
from .safetensors_header import SafetensorsHeader, parse_header_bytes, read_header_bytes

__all__ = ["HEADER_PROBE", "HUB_TIMEOUT_S", "HubEntry", "HubReader", "bounded_call", "hub_errors"]

_T = TypeVar("_T")
_R = TypeVar("_R")

HUB_TIMEOUT_S = 20.0  # one request (or one metadata call) may take this long, then the run stops
HEADER_PROBE = 64 * 1024  # the first read of a shard: its length prefix and, usually, its whole header
SCALE_CHUNK = 16 * 1024 * 1024  # one range request of scale bytes
WORKERS = 16  # parallel range requests


@dataclass(frozen=True)
class HubEntry:
    """One path of the repo at the pinned commit: a file with its size, or a folder."""

    path: str
    size: int = 0
    is_dir: bool = False


def hub_errors() -> tuple[type[BaseException], ...]:
    """The exceptions huggingface_hub's calls raise for a failed request: its own HTTP errors,
    and the transport's (requests' are ``OSError``s; httpx's and httpx2's, in huggingface_hub 1.x and
    2.x, are not)."""
    found: list[type[BaseException]] = [OSError, ValueError, TimeoutError]
    try:
        from huggingface_hub.errors import HfHubHTTPError

        found.append(HfHubHTTPError)
    except ImportError:  # pragma: no cover - huggingface_hub < 0.24
        pass
    for transport in ("httpx", "httpx2"):  # huggingface_hub 1.x's, and 2.x's
        try:
            module = importlib.import_module(transport)
        except ImportError:
            continue
        found.extend(getattr(module, name) for name in ("HTTPError", "InvalidURL", "StreamError") if hasattr(module, name))
    return tuple(found)


def bounded_call(call: Callable[[], _T], timeout: float, what: str) -> _T:
    """``call()`` in a daemon thread, waited for at most ``timeout`` seconds (``TimeoutError``
    after): a metadata call that takes no timeout of its own cannot hang the command."""
    results: queue.Queue[tuple[bool, Any]] = queue.Queue(maxsize=1)

    def run() -> None:
        try:
            results.put((True, call()))
        except BaseException as exc:  # handed to the waiting thread as it is
            results.put((False, exc))

    threading.Thread(target=run, name="hub-call", daemon=True).start()
    try:
        ok, value = results.get(timeout=timeout)
    except queue.Empty:
        raise TimeoutError(f"no answer to {what} within {timeout:g} s") from None
    if not ok:
        raise value
    return value  # type: ignore[no-any-return]


class _RangedFile(io.RawIOBase):
    """A read-only handle on one file of the repo: each read is a range request (the first one,
    at offset 0, fetches ``HEADER_PROBE`` bytes and serves the header from them)."""

    def __init__(self, reader: HubReader, name: str, size: int) -> None:
        super().__init__()
        self._reader, self._name, self._size = reader, name, size
        self._position = 0
        self._cached: tuple[int, bytes] = (0, b"")

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def seek(self, offset: int, whence: int = io.SEEK_SET) -> int:
        base = {io.SEEK_SET: 0, io.SEEK_CUR: self._position, io.SEEK_END: self._size}[whence]
        self._position = max(0, base + offset)
        return self._position

    def tell(self) -> int:
        return self._position

    def readinto(self, buffer: Any) -> int:
        view = memoryview(buffer).cast("B")
        wanted = min(len(view), max(0, self._size - self._position))
        if not wanted:
            return 0
        start, data = self._cached
        if not (start <= self._position and self._position + wanted <= start + len(data)):
            length = max(wanted, HEADER_PROBE) if self._position == 0 else wanted
            data = self._reader.fetch(self._name, self._position, min(length, self._size - self._position))
            start = self._position
            self._cached = (start, data)
        got = data[self._position - start:self._position - start + wanted]
        view[:len(got)] = got
        self._position += len(got)
        return len(got)


class HubReader(CheckpointReader):
    """One Hub repo at one commit, read over HTTP ranges; ``entries`` is its file listing at that
    commit (the tree), ``explain`` words a failed request in one line."""

    local = False
    read_chunk = SCALE_CHUNK

    def __init__(self, repo_id: str, commit: str, entries: Iterable[HubEntry], *, endpoint: str,
                 explain: Callable[[BaseException], str], revision: str | None = None,
                 timeout: float = HUB_TIMEOUT_S, workers: int = WORKERS) -> None:
        self.repo_id, self.commit, self.revision = repo_id, commit, revision
        self.root = f"{repo_id}@{commit}"
        self.entries: Mapping[str, HubEntry] = {entry.path: entry for entry in entries}
        self.endpoint, self.explain, self.timeout, self.workers = endpoint, explain, timeout, workers
        self.requests = 0  # range requests made
        self.bytes_fetched = 0  # bytes those requests returned
        self._lock = threading.Lock()

    def label(self, name: str) -> str:
        return f"{self.root}:{name}"

    def _fail(self, exc: BaseException, what: str) -> HubAccessError:
        return HubAccessError(f"cannot read {what} of {self.root} from the Hub: {self.explain(exc)}")

    def _file(self, name: str) -> HubEntry:
        entry = self.entries.get(name)
        if entry is None or entry.is_dir:
            raise FileNotFoundError(2, f"{self.label(name)} is not in the repo at this commit", name)
        return entry

    def exists(self, name: str) -> bool:
        return name in self.entries

    def listing(self) -> list[str]:
        return sorted({path.split("/", 1)[0] for path in self.entries})

    def scan(self, depth: int, budget: int) -> list[tuple[str, bool]]:
        found = [(path, entry.is_dir) for path, entry in sorted(self.entries.items()) if path.count("/") <= depth]
        return found[:max(0, budget)]

    def fetch(self, name: str, start: int, length: int) -> bytes:
        """``length`` bytes of ``name`` from ``start``: one range request pinned to the commit."""
        from huggingface_hub import get_session, hf_hub_url
        from huggingface_hub.utils import build_hf_headers, hf_raise_for_status

        url = hf_hub_url(self.repo_id, name, revision=self.commit, endpoint=self.endpoint)
        headers = {**build_hf_headers(), "Range": f"bytes={start}-{start + length - 1}"}
        session = get_session()
        follow = {"follow_redirects": True} if type(session).__module__.startswith("httpx") else {}
        try:
            response = session.get(url, headers=headers, timeout=self.timeout, **follow)
            hf_raise_for_status(response)
        except hub_errors() as exc:
            raise self._fail(exc, posixpath.basename(name)) from exc
        data = response.content
        if response.status_code == 200 and len(data) == self._file(name).size:  # a server that ignores ranges
            data = data[start:start + length]
        with self._lock:
            self.requests += 1
            self.bytes_fetched += len(response.content)
        if len(data) != length:
            raise HubAccessError(f"cannot read {name} of {self.root} from the Hub: asked for bytes {start}-"
                                 f"{start + length - 1} and got {plural(len(data), 'byte')} (HTTP {response.status_code})")
        return data

    def read_json(self, name: str, *, what: str, on_read: Callable[[bytes, FileIdentity], None] | None = None) -> Any:
        try:
            entry = self._file(name)
        except FileNotFoundError as exc:
            raise JsonFileError("unreadable", exc, str(exc)) from None
        if entry.size > MAX_JSON_FILE_BYTES:  # refused before a byte is fetched
            raise JsonFileError("too_large", None, f"{what} is {plural(entry.size, 'byte')}, above the "
                                f"{MAX_JSON_FILE_BYTES:,}-byte limit", size=entry.size, limit=MAX_JSON_FILE_BYTES)
        raw = self.fetch(name, 0, entry.size) if entry.size else b""
        if on_read is not None:
            on_read(raw, self.identity(name))
        return parse_json_bytes(raw, what=what)

    def identity(self, name: str) -> FileIdentity:
        """What identifies the file: its size (the commit pins its version)."""
        return FileIdentity(0, 0, self._file(name).size, 0, 0)

    def header(self, name: str) -> SafetensorsHeader:
        size = self._file(name).size
        with self.open(name) as handle:
            raw = read_header_bytes(handle, size)  # type: ignore[arg-type]
        return parse_header_bytes(raw, path=self.label(name), identity=self.identity(name))

    def open(self, name: str) -> BinaryIO:
        return _RangedFile(self, name, self._file(name).size)  # type: ignore[return-value]

    def map(self, work: Callable[[_T], _R], items: Iterable[_T]) -> list[_R]:
        items = list(items)
        if len(items) < 2:
            return [work(item) for item in items]
        with ThreadPoolExecutor(max_workers=min(self.workers, len(items)), thread_name_prefix="hub-read") as pool:
            return list(pool.map(work, items))

    def recorded_sha256(self, names: list[str]) -> dict[str, str | None]:
        from huggingface_hub import HfApi

        api = HfApi(endpoint=self.endpoint)
        try:
            infos = bounded_call(lambda: api.get_paths_info(self.repo_id, names, revision=self.commit),
                                 self.timeout, "paths-info")
        except hub_errors() as exc:
            raise self._fail(exc, "the LFS records") from None
        recorded: dict[str, str | None] = dict.fromkeys(names)
        for info in infos:
            lfs = getattr(info, "lfs", None)
            digest = getattr(lfs, "sha256", None) or (lfs.get("sha256") if isinstance(lfs, dict) else None)
            if getattr(info, "path", None) in recorded and isinstance(digest, str):
                recorded[info.path] = digest
        return recorded
