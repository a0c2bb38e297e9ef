"""SHA-256 of files and of in-memory buffers, one home for the validator, the writer and the
loader. Stdlib only; hashlib releases the GIL on large updates, so threads hash in parallel.

Work in threads stops promptly on Ctrl-C: the waiting thread wakes in short steps (a signal
reaches it at once), sets a cancel flag that every worker checks after each chunk, and
re-raises the ``KeyboardInterrupt`` — no shard is hashed to its end first.
"""

from __future__ import annotations

import hashlib
import mmap
import os
import threading
from collections.abc import Callable, Mapping
from concurrent.futures import Future, ThreadPoolExecutor, wait
from typing import Any

from .files import open_regular

__all__ = [
    "CHUNK", "WAIT_STEP_S", "WINDOW", "BackgroundHasher", "Cancelled", "ProgressCallback", "gather", "hash_buffers",
    "hash_files", "sha256_buffer", "sha256_file", "sha256_mapped",
]

CHUNK = 1 << 24  # bytes per update: memory stays at one chunk, progress moves in steps this size
WINDOW = 1 << 24  # bytes of a file mapped at once by ``sha256_mapped``: its share of RSS stays at this
WAIT_STEP_S = 0.1  # how often the thread waiting for workers wakes (how soon it sees Ctrl-C)
_POPULATE = getattr(mmap, "MAP_POPULATE", 0)  # Linux: a window's pages mapped in one call, not one fault each


ProgressCallback = Callable[[int], None]  # called with the bytes just hashed, chunk by chunk


class Cancelled(Exception):
    """Raised in a worker thread at its next chunk once the work was cancelled (Ctrl-C)."""


def sha256_file(path: str, *, chunk: int = CHUNK, progress: ProgressCallback | None = None,
                cancel: threading.Event | None = None) -> str:
    """Hex SHA-256 of a file, read through one reused buffer (memory stays at ``chunk``).

    ``cancel``, once set, stops the hashing with ``Cancelled`` after the current chunk.
    """
    digest = hashlib.sha256()
    buffer = bytearray(chunk)
    view = memoryview(buffer)
    with open_regular(path, buffering=0) as handle:
        while count := handle.readinto(buffer):
            if cancel is not None and cancel.is_set():
                raise Cancelled(path)
            digest.update(view[:count])
            if progress:
                progress(count)
    return digest.hexdigest()


def sha256_mapped(path: str, *, window: int = WINDOW, progress: ProgressCallback | None = None,
                  cancel: threading.Event | None = None) -> str:
    """Hex SHA-256 of a regular file read through memory maps of ``window`` bytes at a time:
    no copy into a buffer (the pages come straight from the page cache), and memory bounded by
    one window. ``cancel`` as for ``sha256_file``."""
    window = max(mmap.ALLOCATIONGRANULARITY, window - window % mmap.ALLOCATIONGRANULARITY)
    digest = hashlib.sha256()
    with open_regular(path, buffering=0) as handle:
        size = os.fstat(handle.fileno()).st_size
        for start in range(0, size, window):
            if cancel is not None and cancel.is_set():
                raise Cancelled(path)
            length = min(window, size - start)
            with mmap.mmap(handle.fileno(), length, offset=start, prot=mmap.PROT_READ,
                           flags=mmap.MAP_SHARED | _POPULATE) as mapped:
                digest.update(mapped)
            if progress:
                progress(length)
    return digest.hexdigest()


class BackgroundHasher:
    """SHA-256 of files handed over one by one (``submit``, e.g. each shard as soon as its last
    byte is written), hashed by ``workers`` background threads through bounded memory maps
    while the caller goes on; ``results`` waits for them all (Ctrl-C-prompt, like ``gather``)."""

    def __init__(self, workers: int = 1, *, window: int = WINDOW) -> None:
        self.window = window
        self.cancel = threading.Event()
        self._pool = ThreadPoolExecutor(max_workers=max(1, workers), thread_name_prefix="sha256")
        self._futures: dict[str, Future[str]] = {}
        self._lock = threading.Lock()
        self._hashed = 0
        self._progress: ProgressCallback | None = None

    def _count(self, size: int) -> None:
        with self._lock:
            self._hashed += size
            progress = self._progress
        if progress:
            progress(size)

    def submit(self, name: str, path: str) -> None:
        """Start hashing ``path`` (complete, no longer written) under ``name``."""
        self._futures[name] = self._pool.submit(sha256_mapped, path, window=self.window, progress=self._count,
                                                cancel=self.cancel)

    def submitted(self, name: str) -> bool:
        return name in self._futures

    def results(self, progress: ProgressCallback | None = None) -> dict[str, str]:
        """Every submitted file's digest (name → hex), in submission order, once all are done;
        ``progress`` first gets the bytes already hashed, then each window as it is hashed."""
        with self._lock:
            self._progress, done = progress, self._hashed
        if progress and done:
            progress(done)
        return gather(self._futures, self.cancel)

    def close(self) -> None:
        """Stop: queued files are dropped, running ones stop at their next window."""
        self.cancel.set()
        self._pool.shutdown(wait=True, cancel_futures=True)


def sha256_buffer(buffer: object, *, chunk: int = CHUNK, progress: ProgressCallback | None = None,
                  cancel: threading.Event | None = None) -> str:
    """Hex SHA-256 of the bytes of ``buffer`` (anything exporting the buffer protocol, e.g. an
    ``mmap``), hashed in place chunk by chunk: nothing is copied."""
    digest = hashlib.sha256()
    with memoryview(buffer).cast("B") as view:  # type: ignore[arg-type]
        for start in range(0, len(view), chunk):
            if cancel is not None and cancel.is_set():
                raise Cancelled
            part = view[start:start + chunk]
            digest.update(part)
            if progress:
                progress(len(part))
    return digest.hexdigest()


def gather(futures: Mapping[str, Future[Any]], cancel: threading.Event) -> dict[str, Any]:
    """The results of ``futures`` (name → future), in their order, waiting in steps of
    ``WAIT_STEP_S`` so that Ctrl-C reaches this thread promptly. On any exception here
    (``KeyboardInterrupt``) ``cancel`` is set and queued work dropped before it propagates:
    running workers stop at their next chunk. Otherwise every future runs to its end and the
    first worker error in ``futures``' order is raised as it is."""
    try:
        pending = set(futures.values())
        while pending:
            pending = wait(pending, timeout=WAIT_STEP_S).not_done
    except BaseException:
        cancel.set()
        for future in futures.values():
            future.cancel()
        raise
    return {name: future.result() for name, future in futures.items()}


def _parallel(items: Mapping[str, object], hash_one: Callable[..., str], workers: int,
              progress: ProgressCallback | None, chunk: int) -> dict[str, str]:
    cancel = threading.Event()
    with ThreadPoolExecutor(max_workers=max(1, workers)) as pool:
        futures = {name: pool.submit(hash_one, source, chunk=chunk, progress=progress, cancel=cancel)
                   for name, source in items.items()}
        return gather(futures, cancel)


def hash_files(paths: Mapping[str, str], *, workers: int = 2,
               progress: ProgressCallback | None = None, chunk: int = CHUNK) -> dict[str, str]:
    """SHA-256 of several files (name → path) in parallel threads; ``progress`` gets every chunk
    (from several threads: it must be thread-safe, as ``progress.Progress.update`` is).
    Ctrl-C stops every thread at its next chunk (see the module docstring)."""
    return _parallel({name: str(path) for name, path in paths.items()}, sha256_file, workers, progress, chunk)


def hash_buffers(buffers: Mapping[str, object], *, workers: int = 2,
                 progress: ProgressCallback | None = None, chunk: int = CHUNK) -> dict[str, str]:
    """SHA-256 of several in-memory buffers (name → buffer, e.g. shard mappings) in parallel threads."""
    return _parallel(buffers, sha256_buffer, workers, progress, chunk)
