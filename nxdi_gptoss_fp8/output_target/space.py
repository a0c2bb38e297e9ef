"""Whether the filesystem OUT is written on has room for it: the one figure a dry run and a real
run compare (``space_needed``: whole blocks per file, and the directories), checked before the
first byte (``check_space``). Stdlib only.
"""

from __future__ import annotations

import os
from collections.abc import Iterable

from ..errors import ConversionError
from ..units import format_bytes, plural
from .rule import OutputTarget

__all__ = ["DIRECTORY_BLOCKS", "block_size", "check_space", "free_bytes", "space_needed"]


def free_bytes(path: str) -> int:
    """Bytes an unprivileged writer may still use on the filesystem holding ``path``."""
    info = os.statvfs(path)
    return info.f_bavail * info.f_frsize


# blocks counted for the directories a write creates (the work folder, an ``old`` folder)
DIRECTORY_BLOCKS = 2


def block_size(path: str) -> int:
    """The allocation unit of the filesystem holding ``path`` (every file occupies whole ones)."""
    try:
        return os.statvfs(path).f_frsize or 4096
    except OSError:
        return 4096


def space_needed(sizes: Iterable[int], where: str) -> int:
    """Bytes of the filesystem holding ``where`` that files of ``sizes`` bytes occupy: each
    rounded up to whole blocks, plus ``DIRECTORY_BLOCKS`` for the directories. The one figure
    the free-space check compares (a dry run and a real run alike)."""
    block = block_size(where)
    return sum(-(-size // block) * block for size in sizes) + DIRECTORY_BLOCKS * block


def check_space(target: OutputTarget, sizes: Iterable[int], out: str) -> None:
    """Refuse, before the first byte, an output of files of ``sizes`` bytes that cannot finish
    where it will be written: the free space of the filesystem holding ``target``'s work folder
    must cover ``space_needed`` (an output that exactly fills it fits)."""
    where = target.existing_ancestor()
    needed = space_needed(sizes, where)
    free = free_bytes(where)
    if needed > free:
        raise ConversionError(
            f"{out}: the output needs {format_bytes(needed)} ({plural(needed, 'byte')}) on disk but the filesystem holding "
            f"{where} has {format_bytes(free)} ({plural(free, 'byte')}) free: free some space or choose another OUT")
