"""SHA-256 of files and of in-memory buffers, one home for the validator, the writer and the
loader. Stdlib only; hashlib releases the GIL on large updates, so threads hash in parallel.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Mapping
from concurrent.futures import ThreadPoolExecutor

from .files import open_regular

CHUNK = 1 << 24  # bytes per update: memory stays at one chunk, progress moves in steps this size


ProgressCallback = Callable[[int], None]  # called with the bytes just hashed, chunk by chunk


def sha256_file(path: str, *, chunk: int = CHUNK, progress: ProgressCallback | None = None) -> str:
    """Hex SHA-256 of a file, read through one reused buffer (memory stays at ``chunk``)."""
    digest = hashlib.sha256()
    buffer = bytearray(chunk)
    view = memoryview(buffer)
    with open_regular(path, buffering=0) as handle:
        while count := handle.readinto(buffer):
            digest.update(view[:count])
            if progress:
                progress(count)
    return digest.hexdigest()


def sha256_buffer(buffer: object, *, chunk: int = CHUNK, progress: ProgressCallback | None = None) -> str:
    """Hex SHA-256 of the bytes of ``buffer`` (anything exporting the buffer protocol, e.g. an
    ``mmap``), hashed in place chunk by chunk: nothing is copied."""
    digest = hashlib.sha256()
    with memoryview(buffer).cast("B") as view:  # type: ignore[arg-type]
        for start in range(0, len(view), chunk):
            part = view[start:start + chunk]
            digest.update(part)
            if progress:
                progress(len(part))
    return digest.hexdigest()


def _parallel(items: Mapping[str, object], hash_one: Callable[..., str], workers: int,
              progress: ProgressCallback | None) -> dict[str, str]:
    def run(item: tuple[str, object]) -> tuple[str, str]:
        name, source = item
        return name, hash_one(source, progress=progress)

    with ThreadPoolExecutor(max_workers=max(1, workers)) as pool:
        return dict(pool.map(run, items.items()))


def hash_files(paths: Mapping[str, str], *, workers: int = 2,
               progress: ProgressCallback | None = None) -> dict[str, str]:
    """SHA-256 of several files (name → path) in parallel threads; ``progress`` gets every chunk
    (from several threads: it must be thread-safe, as ``progress.Progress.update`` is)."""
    return _parallel(paths, lambda path, progress: sha256_file(str(path), progress=progress), workers, progress)


def hash_buffers(buffers: Mapping[str, object], *, workers: int = 2,
                 progress: ProgressCallback | None = None) -> dict[str, str]:
    """SHA-256 of several in-memory buffers (name → buffer, e.g. shard mappings) in parallel threads."""
    return _parallel(buffers, sha256_buffer, workers, progress)
