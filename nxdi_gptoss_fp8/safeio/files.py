"""Opening input files safely: regular files only, never blocking; ``FileIdentity``, what
identifies one version of a file. Stdlib only.

Every command reads files a user (or an attacker) chose: a FIFO would block ``open()`` forever,
a device could stream without end, a directory cannot be read. ``open_regular`` opens with
``O_NONBLOCK`` (so opening a FIFO returns at once instead of waiting for a writer) only a path
that ``stat`` says is a regular file — a FIFO, socket, device or directory is refused before it
is opened — and checks again with ``fstat`` that the opened object is a regular file (race-free:
it is the object that will be read), refusing anything else with ``NotRegularFileError`` before a
byte is read. ``read_bounded`` is the one reader of a whole small file: bounded, and refusing
(``FileTooLargeError``) a file above the bound instead of truncating it.
"""

from __future__ import annotations

import contextlib
import os
import stat
from collections.abc import Callable
from dataclasses import dataclass
from typing import BinaryIO

from ..errors import FileTooLargeError, NotRegularFileError
from ..units import plural

__all__ = ["FileIdentity", "file_kind", "not_regular_reason", "open_regular", "read_bounded", "write_atomically"]

_KINDS = (
    (stat.S_ISDIR, "a directory"),
    (stat.S_ISFIFO, "a FIFO (named pipe)"),
    (stat.S_ISSOCK, "a socket"),
    (stat.S_ISCHR, "a character device"),
    (stat.S_ISBLK, "a block device"),
)


@dataclass(frozen=True)
class FileIdentity:
    """What identifies one version of a file: device, inode, size, modification and change time.

    ``ctime_ns`` is what an in-place edit cannot hide: ``os.utime`` can put the modification
    time back, but it sets the change time to now (only the kernel writes it).
    """

    device: int
    inode: int
    size: int
    mtime_ns: int
    ctime_ns: int

    @classmethod
    def of(cls, stat: os.stat_result) -> FileIdentity:
        return cls(stat.st_dev, stat.st_ino, stat.st_size, stat.st_mtime_ns, stat.st_ctime_ns)

    def changes_since(self, before: FileIdentity) -> list[str]:
        """In words, how this identity differs from ``before`` (empty when it is the same file version)."""
        changes = []
        if (self.device, self.inode) != (before.device, before.inode):
            changes.append(f"device/inode {before.device}/{before.inode} → {self.device}/{self.inode} (the file was replaced)")
        if self.size != before.size:
            what = "truncated" if self.size < before.size else "grown"
            changes.append(f"size {before.size:,} → {plural(self.size, 'byte')} ({what})")
        if self.mtime_ns != before.mtime_ns:
            changes.append("modification time changed (rewritten in place)")
        if self.ctime_ns != before.ctime_ns:
            changes.append("change time changed (written, renamed, linked or its times reset)")
        return changes


def file_kind(mode: int) -> str:
    """What ``mode`` (an ``st_mode``) describes, in words: "a regular file", "a FIFO (named pipe)", …"""
    if stat.S_ISREG(mode):
        return "a regular file"
    return next((name for test, name in _KINDS if test(mode)), "not a regular file")


def not_regular_reason(path: str | os.PathLike[str]) -> str | None:
    """Why ``path`` (links followed) is not a regular file to read, or None if it is one.

    Only ``stat``s the path (never opens it); a missing path raises ``FileNotFoundError``.
    """
    mode = os.stat(path).st_mode
    return None if stat.S_ISREG(mode) else f"{os.fspath(path)} is {file_kind(mode)}, not a regular file"


def _reason_or_none(path: str | os.PathLike[str]) -> str | None:
    try:
        return not_regular_reason(path)
    except OSError:
        return None


def open_regular(path: str | os.PathLike[str], *, buffering: int = -1) -> BinaryIO:
    """Open ``path`` for binary reading if, and only if, it is a regular file.

    Never blocks: a FIFO, socket, device or directory raises ``NotRegularFileError`` (naming
    what it is) before it is opened (and rechecked on the opened file). ``OSError`` for a missing or unreadable path.
    ``buffering`` as for ``open`` (0: unbuffered, for ``readinto`` loops).
    """
    # refused BEFORE it is opened: opening a device can act (rewind a tape, arm a watchdog) and
    # opening a FIFO wakes its writer; the fstat below still catches a swap after this stat
    reason = _reason_or_none(path)
    if reason:
        raise NotRegularFileError(reason)
    flags = os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_CLOEXEC", 0)
    try:
        fd = os.open(path, flags)
    except OSError:
        # a directory (EISDIR) or a socket (ENXIO) cannot even be opened: say what it is
        reason = _reason_or_none(path)
        if reason:
            raise NotRegularFileError(reason) from None
        raise
    try:
        mode = os.fstat(fd).st_mode
        if not stat.S_ISREG(mode):
            raise NotRegularFileError(f"{os.fspath(path)} is {file_kind(mode)}, not a regular file")
        if hasattr(os, "set_blocking"):
            os.set_blocking(fd, True)  # regular files ignore O_NONBLOCK; restore the usual mode anyway
        return os.fdopen(fd, "rb", buffering=buffering)
    except BaseException:
        os.close(fd)
        raise


def read_bounded(path: str | os.PathLike[str], limit: int, *,
                 on_read: Callable[[bytes, FileIdentity], None] | None = None) -> tuple[bytes, FileIdentity]:
    """The bytes of the regular file ``path`` and the identity of the file they came from, never
    more than ``limit`` bytes and never fewer than the file holds.

    The size is checked on the opened file before a byte is read and again on what was read (a
    file growing while it is read); either way ``FileTooLargeError``, never a truncated read.
    ``on_read``, when given, gets the bytes read and the identity before the second check (the
    preflight counts and hashes what it read). ``NotRegularFileError`` / ``OSError`` as
    ``open_regular``.
    """
    with open_regular(path) as handle:
        identity = FileIdentity.of(os.fstat(handle.fileno()))
        if identity.size > limit:
            raise FileTooLargeError(f"{os.fspath(path)} is {plural(identity.size, 'byte')}, above the {limit:,}-byte limit",
                                    size=identity.size, limit=limit, grew=False)
        raw = handle.read(limit + 1)
    if on_read is not None:
        on_read(raw, identity)
    if len(raw) > limit:
        raise FileTooLargeError(f"{os.fspath(path)} grew above the {limit:,}-byte limit while it was read",
                                size=len(raw), limit=limit, grew=True)
    return raw, identity


def write_atomically(path: str, data: bytes) -> None:
    """Write ``data`` to ``path`` whole or not at all: a hidden temporary file beside it, synced, then
    renamed over it (and the directory synced); the temporary file is removed on any failure."""
    directory = os.path.dirname(path)
    temporary = os.path.join(directory, f".{os.path.basename(path)}.tmp-{os.getpid()}")
    try:
        with open(temporary, "wb") as handle:
            handle.write(data)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(temporary, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(temporary)
        raise
    try:
        fd = os.open(directory, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
    except OSError:
        pass  # a file system without directory fsync: the rename itself is atomic
