"""SHA-256 of files and of in-memory buffers, one home for the validator, the writer and the
loader. Stdlib only; hashlib releases the GIL on large updates, so threads hash in parallel.
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Callable, Mapping
from concurrent.futures import ThreadPoolExecutor

CHUNK = 1 << 24  # bytes per update: memory stays at one chunk, progress moves in steps this size


def sha256_file(path: str, *, chunk: int = CHUNK) -> str:
    """Hex SHA-256 of a file, read through one reused buffer (memory stays at ``chunk``)."""
    digest = hashlib.sha256()
    buffer = bytearray(chunk)
    view = memoryview(buffer)
    with open(path, "rb", buffering=0) as handle:
        while count := handle.readinto(buffer):
            digest.update(view[:count])
    return digest.hexdigest()


def sha256_buffer(buffer: object, *, chunk: int = CHUNK) -> str:
    """Hex SHA-256 of the bytes of ``buffer`` (anything exporting the buffer protocol, e.g. an
    ``mmap``), hashed in place chunk by chunk: nothing is copied."""
    digest = hashlib.sha256()
    with memoryview(buffer).cast("B") as view:  # type: ignore[arg-type]
        for start in range(0, len(view), chunk):
            digest.update(view[start:start + chunk])
    return digest.hexdigest()


def _parallel(items: Mapping[str, object], hash_one: Callable[[object], str], workers: int,
              size: Callable[[object], int], progress: Callable[[int], None] | None) -> dict[str, str]:
    def run(item: tuple[str, object]) -> tuple[str, str]:
        name, source = item
        digest = hash_one(source)
        if progress:
            progress(size(source))
        return name, digest

    with ThreadPoolExecutor(max_workers=max(1, workers)) as pool:
        return dict(pool.map(run, items.items()))


def hash_files(paths: Mapping[str, str], *, workers: int = 2,
               progress: Callable[[int], None] | None = None) -> dict[str, str]:
    """SHA-256 of several files (name → path) in parallel threads."""
    return _parallel(paths, lambda path: sha256_file(str(path)), workers,
                     lambda path: os.path.getsize(str(path)), progress)


def hash_buffers(buffers: Mapping[str, object], *, workers: int = 2,
                 progress: Callable[[int], None] | None = None) -> dict[str, str]:
    """SHA-256 of several in-memory buffers (name → buffer, e.g. shard mappings) in parallel threads."""
    return _parallel(buffers, sha256_buffer, workers, lambda buffer: memoryview(buffer).nbytes, progress)  # type: ignore[arg-type]
