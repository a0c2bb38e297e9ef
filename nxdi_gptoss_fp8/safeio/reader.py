"""Where the preflight reads a checkpoint's files from: ``CheckpointReader``, and ``LocalReader``
for a directory on disk. Stdlib only.

The preflight asks a reader for exactly what it reads (whether a file exists, the directory's
entries, a small JSON file, a shard's safetensors header, byte ranges of a shard), so one set of
checks judges a local directory and a Hub repo (``safeio.hub_reader``) alike. ``LocalReader``
keeps every local rule: links out of the directory are refused, FIFOs, sockets, devices and
directories are refused before they are opened, the nested search is bounded.
"""

from __future__ import annotations

import os
import stat
from collections.abc import Callable, Iterable
from typing import Any, BinaryIO, TypeVar

from .files import FileIdentity, open_regular
from .json_file import read_json_file
from .safetensors_header import SafetensorsHeader, read_header

__all__ = ["CheckpointReader", "LocalReader"]

_T = TypeVar("_T")
_R = TypeVar("_R")


class CheckpointReader:
    """The files of one checkpoint, as the preflight reads them (the base: what every reader answers).

    ``root`` is what the report names (a directory, or ``REPO_ID@COMMIT``); ``local`` says whether
    the files are on this machine (only then are links, file kinds and other checkpoint kinds
    looked at, and only then can every byte be hashed or scanned); ``read_chunk`` is the size of
    one read of the expert scales from a remote reader (a local one reads in cache-sized chunks).
    """

    root: str = ""
    local: bool = True
    read_chunk: int = 1 << 20

    def label(self, name: str) -> str:
        """How a finding names the file ``name`` (a local finding names it as it is)."""
        return name

    def root_problem(self) -> tuple[str, str] | None:
        """(code, message) of the ``filesystem`` finding when the root cannot be read as a directory, else None."""
        return None

    def exists(self, name: str) -> bool:
        raise NotImplementedError

    def listing(self) -> list[str]:
        """The names of the entries at the top of the checkpoint (``OSError`` when they cannot be listed)."""
        raise NotImplementedError

    def scan(self, depth: int, budget: int) -> list[tuple[str, bool]]:
        """(relative path, is a directory) of the entries at most ``depth`` levels below the top,
        at most ``budget`` of them, never through a link."""
        raise NotImplementedError

    def link_outside(self, name: str) -> str | None:
        """Where ``name`` leads when it is a link out of the checkpoint, else None."""
        return None

    def read_json(self, name: str, *, what: str, on_read: Callable[[bytes, FileIdentity], None] | None = None) -> Any:
        """The strict JSON document of the small file ``name`` (``json_file.JsonFileError`` as ``read_json_file``)."""
        raise NotImplementedError

    def header(self, name: str) -> SafetensorsHeader:
        """The validated safetensors header of the shard ``name`` (``safetensors_header``'s one reader):
        ``HeaderError``, ``NotRegularFileError``, ``FileNotFoundError`` or ``OSError``."""
        raise NotImplementedError

    def open(self, name: str) -> BinaryIO:
        """A binary handle on ``name`` for ``seek`` and ``readinto`` (the scale values)."""
        raise NotImplementedError

    def map(self, work: Callable[[_T], _R], items: Iterable[_T]) -> list[_R]:
        """``work`` over ``items``, results in their order (a remote reader runs them in parallel)."""
        return [work(item) for item in items]

    def recorded_sha256(self, names: list[str]) -> dict[str, str | None] | None:
        """The SHA-256 of each file as the store records it, read without a byte of the file
        (None for a file it records none for); None when the store records none at all (a
        directory: the bytes must be hashed)."""
        return None


class LocalReader(CheckpointReader):
    """A checkpoint directory on this machine.

    ``links_into``: a directory links may lead into besides the checkpoint's own (the blob store
    of a Hub cache snapshot, whose files are links into ``blobs/``)."""

    local = True

    def __init__(self, root: str, *, links_into: str | None = None) -> None:
        self.root = root
        self.links_into = os.path.realpath(links_into) if links_into else None

    def _path(self, name: str) -> str:
        return os.path.join(self.root, name)

    def root_problem(self) -> tuple[str, str] | None:
        from ..format import INDEX_FILE

        root = self.root
        if "\x00" in root:  # no file name holds one (os functions raise ValueError)
            return "missing_directory", f"{root!r} contains a NUL byte: no directory has that name"
        if not os.path.exists(root):
            return "missing_directory", f"{root} does not exist"
        if not os.path.isdir(root):
            return "not_a_directory", f"{root} is a file; pass the checkpoint directory that holds {INDEX_FILE}"
        if not os.access(root, os.R_OK | os.X_OK):
            return "unreadable", f"{root} cannot be listed (permissions)"
        return None

    def exists(self, name: str) -> bool:
        return os.path.exists(self._path(name))

    def listing(self) -> list[str]:
        return os.listdir(self.root)

    def scan(self, depth: int, budget: int) -> list[tuple[str, bool]]:
        found: list[tuple[str, bool]] = []
        level = [""]
        for _ in range(depth + 1):
            below: list[str] = []
            for relative in level:
                if budget < 0:
                    break
                try:
                    with os.scandir(os.path.join(self.root, relative)) as entries:
                        for entry in entries:
                            budget -= 1
                            if budget < 0:
                                break
                            name = os.path.join(relative, entry.name) if relative else entry.name
                            is_dir = entry.is_dir(follow_symlinks=False)
                            found.append((name, is_dir))
                            if is_dir:
                                below.append(name)
                except OSError:
                    continue
            level = below
        return found

    def link_outside(self, name: str) -> str | None:
        """``OSError`` when ``name`` cannot be looked at (it need not exist: a missing file is no link)."""
        path = self._path(name)
        if not stat.S_ISLNK(os.lstat(path).st_mode):
            return None
        target = os.path.realpath(path)
        inside = os.path.dirname(target)
        return None if inside == os.path.realpath(self.root) or inside == self.links_into else target

    def read_json(self, name: str, *, what: str, on_read: Callable[[bytes, FileIdentity], None] | None = None) -> Any:
        return read_json_file(self._path(name), what=what, on_read=on_read)

    def header(self, name: str) -> SafetensorsHeader:
        return read_header(self._path(name))

    def open(self, name: str) -> BinaryIO:
        return open_regular(self._path(name), buffering=0)
