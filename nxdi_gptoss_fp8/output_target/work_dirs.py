"""The hidden work folders a writer of OUT makes (``.OUT.partial-HOST-PID-RANDOM``, and
``.OUT.old-…`` for a previous output moved aside), and the leftovers a killed run leaves: who
owns one (``HOST-PID``), whether that run is alive, refusing a second writer, removing a dead
run's unfinished output (``remove_stale_partials``; a previous output is named, never removed).
Stdlib only.
"""

from __future__ import annotations

import contextlib
import logging
import os
import re
import secrets
import shutil
import socket

from ..errors import ConversionError
from ..units import format_bytes

__all__ = ["host_tag", "is_our_hidden", "make_private_dir", "refuse_concurrent_writer", "remove_stale_partials",
           "stale_partials"]

logger = logging.getLogger(f"{__name__.split('.')[0]}.writer")  # the writer's messages, under the writer's one logger


def _hidden_prefix(out: str, kind: str) -> str:
    return f".{os.path.basename(out)}.{kind}-"


def host_tag() -> str:
    """This host's name as it appears in temporary directory names (no dashes: they separate fields)."""
    return re.sub(r"[^A-Za-z0-9_.]", "_", socket.gethostname())[:64] or "host"


def make_private_dir(out: str, kind: str, where: str | None = None) -> str:
    """A new hidden directory named ``.OUT.KIND-HOST-PID-RANDOM`` in ``where`` (default: beside
    ``out``): created with the user's umask (like any directory the user makes), and naming its
    owner so that a later run can tell a dead run's leftovers from a live one's."""
    parent = where if where is not None else (os.path.dirname(out) or ".")
    for _ in range(100):
        path = os.path.join(parent, f"{_hidden_prefix(out, kind)}{host_tag()}-{os.getpid()}-{secrets.token_hex(4)}")
        try:
            os.mkdir(path, 0o777)  # the umask applies: 0755 with the usual 022
            return path
        except FileExistsError:
            continue
    raise ConversionError(f"cannot create a temporary directory in {parent}")


def is_our_hidden(name: str, out: str) -> bool:
    """Whether ``name`` (an entry of OUT) is a work or old folder of a writer of OUT."""
    return any(name.startswith(_hidden_prefix(out, kind)) for kind in ("partial", "old"))


def _owner_alive(name: str, prefix: str) -> bool:
    """Whether the run that created ``name`` (``PREFIX HOST-PID-RANDOM``) may still be running.
    Directories of other hosts (a shared filesystem) and names we cannot read count as alive."""
    match = re.fullmatch(r"(.+)-(\d+)-[0-9a-f]+", name[len(prefix):])
    if match is None or match[1] != host_tag():
        return True
    try:
        os.kill(int(match[2]), 0)
    except ProcessLookupError:
        return False
    except (PermissionError, OverflowError, ValueError):
        return True
    return True


def stale_partials(out: str | os.PathLike[str], *, kind: str = "partial") -> list[str]:
    """Hidden ``kind`` directories ("partial": unfinished outputs, "old": a previous output moved
    aside) that a killed run writing ``out`` left beside it or inside it (their process is gone)."""
    out = os.path.abspath(os.fspath(out))
    found = []
    for parent in (os.path.dirname(out) or ".", out):
        try:
            names = os.listdir(parent)
        except OSError:
            continue
        found += [os.path.join(parent, name) for name in sorted(names)
                  if name.startswith(_hidden_prefix(out, kind)) and not _owner_alive(name, _hidden_prefix(out, kind))
                  and os.path.isdir(os.path.join(parent, name)) and not os.path.islink(os.path.join(parent, name))]
    return found


def refuse_concurrent_writer(out: str | os.PathLike[str], own: str) -> None:
    """Refuse (``ConversionError``) when another run is writing ``out`` too: a hidden work folder
    of ``out`` other than ``own`` whose process still runs (or of another host). Checked after
    ``own`` exists, so of two runs starting together at least one refuses; a finished run's
    output is never mixed with another's."""
    out = os.path.abspath(os.fspath(out))
    prefix = _hidden_prefix(out, "partial")
    for parent in (os.path.dirname(out) or ".", out):
        try:
            names = os.listdir(parent)
        except OSError:
            continue
        for name in sorted(names):
            path = os.path.join(parent, name)
            if name.startswith(prefix) and path != own and _owner_alive(name, prefix) and os.path.isdir(path):
                raise ConversionError(
                    f"{out} is being written by another run ({path} is its work folder, and its process is still "
                    "running): wait for it to finish, or choose another OUT; a folder a dead run left on another "
                    "host is never removed here: delete it with rm -r")


def remove_stale_partials(out: str | os.PathLike[str]) -> list[str]:
    """Remove the unfinished outputs ``stale_partials`` finds, logging each with its size on the
    package logger. A dead run's ``.old-`` directory (the previous OUT, moved aside by
    ``--overwrite`` just before the new one took its place) may be the only copy of it: it is
    named, never removed."""
    for path in stale_partials(out, kind="old"):
        what = f"move {path}/old back" if os.path.isdir(os.path.join(path, "old")) else \
            f"move the files in {path} back into {os.fspath(out)}"
        logger.warning("%s holds the previous %s, moved aside by an interrupted run: %s "
                       "or delete the directory", path, os.path.basename(os.fspath(out)), what)
    removed = []
    for path in stale_partials(out):
        size = _tree_size(path)
        shutil.rmtree(path, ignore_errors=True)
        if not os.path.exists(path):
            removed.append(path)
            logger.warning("removed %s (%s on disk) left by an interrupted run", path, format_bytes(size))
        else:
            logger.warning("%s was left by an interrupted run and could not be removed: delete it with rm -r", path)
    return removed


def _tree_size(path: str) -> int:
    """Bytes the files under ``path`` occupy on disk (shards are created at full size, so a
    partial one is sparse: its apparent size overstates what removing it frees)."""
    total = 0
    for root, _dirs, files in os.walk(path):
        for name in files:
            with contextlib.suppress(OSError):
                info = os.lstat(os.path.join(root, name))
                total += info.st_blocks * 512 if hasattr(info, "st_blocks") else info.st_size
    return total
