"""Where a normalized checkpoint is written, and what may be there already.

The output-target decisions of the writer: whether OUT is written beside its parent or inside an
existing directory, what an ``--overwrite`` may replace (only an earlier output of ours), whether
the filesystem has room (``check_space``), and the hidden work folders (``.OUT.partial-HOST-PID-RANDOM``,
``.OUT.old-…``) with the leftovers a killed run leaves (``stale_partials``, ``remove_stale_partials``).
Its own module because these decisions are about the directory, not the streaming of bytes
(``writer``), and ``convert.plan`` and the ``make`` commands ask them too. Stdlib only.
"""

from __future__ import annotations

import contextlib
import logging
import os
import re
import secrets
import shutil
import socket
from collections.abc import Iterable
from dataclasses import dataclass

from . import format as fmt
from .errors import ConversionError
from .safeio.json_file import JsonFileError, read_json_file
from .units import format_bytes
from .validate.findings import printable

__all__ = [
    "OUTPUT_SIDE_FILES", "OutputTarget", "check_space", "free_bytes", "host_tag", "make_private_dir", "output_target",
    "prepare_output", "refuse_concurrent_writer", "remove_stale_partials", "stale_partials",
]

logger = logging.getLogger(f"{__package__}.writer")  # the writer's messages, under the writer's one logger


def _not_a_directory(out: str) -> str:
    """Why ``out`` cannot be written inside: a file, or a symbolic link (never followed)."""
    if os.path.islink(out):
        target = printable(os.readlink(out))
        return (f"{out} is a symbolic link (to {target}), which is never followed: pass the directory "
                "it points to, or choose another output path")
    return f"{out} exists and is not a directory: choose another output path"


def prepare_output(out: str, *, overwrite: bool) -> None:
    """Refuse a non-empty ``out`` unless ``overwrite``; never touch it otherwise."""
    if os.path.lexists(out):
        if not os.path.isdir(out) or os.path.islink(out):
            raise ConversionError(_not_a_directory(out))
        if os.listdir(out) and not overwrite:
            raise ConversionError(f"{out} is not empty: pass --overwrite to replace it, or choose another output path")


# what an earlier output of ours holds: a ``--overwrite`` replaces only a directory of these
_OUR_SHARD = re.compile(r"model-\d{5}-of-\d{5}\.safetensors")
OUTPUT_SIDE_FILES = ("README.md",)  # written beside the checkpoint (the model card)


def _is_our_name(name: str, extra_names: Iterable[str]) -> bool:
    from .hub import COMPANION_FILES

    return (name in (fmt.CONFIG_FILE, fmt.INDEX_FILE, *OUTPUT_SIDE_FILES, *COMPANION_FILES, *extra_names)
            or bool(_OUR_SHARD.fullmatch(name)))


def _is_our_index(path: str) -> bool:
    try:
        document = read_json_file(path, what=fmt.INDEX_FILE)
    except JsonFileError:
        return False
    metadata = document.get("metadata") if isinstance(document, dict) else None
    return isinstance(metadata, dict) and metadata.get("format") == fmt.FORMAT_NAME


def _current_directory() -> str | None:
    try:
        return os.getcwd()
    except OSError:  # removed meanwhile: it cannot be inside OUT
        return None


def _inside(path: str, directory: str) -> bool:
    path, directory = os.path.realpath(path), os.path.realpath(directory)
    return path == directory or path.startswith(directory.rstrip(os.sep) + os.sep)


@dataclass(frozen=True)
class OutputTarget:
    """Where a checkpoint will be written and what it replaces.

    OUT absent: a hidden work folder beside it (in its parent), renamed to OUT at the end.
    OUT an existing directory (empty, a mount point, under a read-only parent, or an earlier
    output being overwritten): the hidden work folder is made inside OUT and its files are
    moved into OUT at the end (the index last), so nothing is written on another filesystem
    and OUT itself is never renamed."""

    out: str
    inside: bool  # True: work inside OUT (it exists)
    replaced: tuple[str, ...] = ()  # entries of OUT an overwrite replaces

    @property
    def work_parent(self) -> str:
        """The directory the work folder is made in (it shares OUT's filesystem)."""
        return self.out if self.inside else (os.path.dirname(self.out) or ".")

    def existing_ancestor(self) -> str:
        """The nearest directory that exists on the way to ``work_parent`` (where free space is measured)."""
        path = self.work_parent
        while not os.path.isdir(path) and os.path.dirname(path) != path:
            path = os.path.dirname(path)
        return path


def output_target(out: str, *, overwrite: bool, extra_names: Iterable[str] = ()) -> OutputTarget:
    """Decide where ``out`` is written; refuse what cannot or must not be replaced.

    A non-empty OUT needs ``overwrite``, and then must look like an earlier output of ours (our
    shards, config, index of this format, companion files and card, nothing else); an OUT that
    is the current directory, or holds it, is never overwritten. Our own hidden work folders
    in OUT do not count. Raises ``ConversionError`` naming OUT and the fix."""
    out = os.path.abspath(os.fspath(out))
    if not os.path.lexists(out):
        return OutputTarget(out, inside=False)
    if not os.path.isdir(out) or os.path.islink(out):
        raise ConversionError(_not_a_directory(out))
    try:
        entries = sorted(name for name in os.listdir(out) if not _is_our_hidden(name, out))
    except OSError as exc:
        raise ConversionError(f"cannot list {out}: {exc.strerror or exc}") from None
    if not entries:
        return OutputTarget(out, inside=True)
    if not overwrite:
        raise ConversionError(f"{out} is not empty: pass --overwrite to replace it, or choose another output path")
    cwd = _current_directory()
    if cwd is not None and _inside(cwd, out):
        raise ConversionError(f"{out} is the current directory or holds it: --overwrite would replace the files "
                              "you are working in; name another OUT, or cd elsewhere first")
    foreign = [name for name in entries if not _is_our_name(name, extra_names)]
    index = os.path.join(out, fmt.INDEX_FILE)
    if os.path.lexists(index) and not _is_our_index(index):
        foreign.insert(0, f"{fmt.INDEX_FILE} (not a {fmt.FORMAT_NAME} index)")
    if foreign:
        shown = ", ".join(foreign[:3]) + (f", … ({len(foreign)} in all)" if len(foreign) > 3 else "")
        raise ConversionError(f"{out} does not look like an earlier output of this converter (it holds {shown}): "
                              "--overwrite replaces only those; empty it yourself or choose another output path")
    return OutputTarget(out, inside=True, replaced=tuple(entries))


def free_bytes(path: str) -> int:
    """Bytes an unprivileged writer may still use on the filesystem holding ``path``."""
    info = os.statvfs(path)
    return info.f_bavail * info.f_frsize


def check_space(target: OutputTarget, needed: int, out: str) -> None:
    """Refuse, before the first byte, an output of ``needed`` bytes that cannot finish where it
    will be written: the free space of the filesystem holding ``target``'s work folder."""
    where = target.existing_ancestor()
    free = free_bytes(where)
    if needed > free:
        raise ConversionError(
            f"{out}: the output needs {format_bytes(needed)} ({needed:,} bytes) but the filesystem holding "
            f"{where} has {format_bytes(free)} free: free some space or choose another OUT")


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


def _is_our_hidden(name: str, out: str) -> bool:
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
