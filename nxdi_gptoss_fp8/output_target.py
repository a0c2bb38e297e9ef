"""Where an output directory is written, and what may be there already: the one overwrite rule.

Every writer of this package asks this module, and only this module removes or replaces
anything: whether OUT is written beside its parent or inside an existing directory, whether it
can be written at all (``check_writable``: the same check for a dry run and a real run), what an
``--overwrite`` may replace (only a directory recognized by its content as an earlier output of
the same kind: ``output_target``), moving a finished work folder into place (``install``,
``staged_output``), whether the filesystem has room (``check_space``), and the hidden work
folders (``.OUT.partial-HOST-PID-RANDOM``, ``.OUT.old-…``) with the leftovers a killed run leaves
(``stale_partials``, ``remove_stale_partials``, ``remove_work_dir``). ``test_output_target``
fails when another module removes or renames a path. Stdlib only.
"""

from __future__ import annotations

import contextlib
import errno
import logging
import os
import re
import secrets
import shutil
import socket
from collections.abc import Iterable, Iterator
from dataclasses import dataclass

from . import format as fmt
from .errors import ConversionError, OutputWriteError
from .safeio.json_file import JsonFileError, read_json_file
from .units import format_bytes
from .validate.findings import printable

__all__ = [
    "DIRECTORY_BLOCKS", "NORMALIZED", "OUTPUT_SIDE_FILES", "SOURCE", "SOURCE_KINDS", "OutputTarget", "block_size",
    "check_space", "check_writable", "free_bytes", "host_tag", "install", "is_write_error", "make_private_dir",
    "output_target", "refuse_concurrent_writer", "remove_stale_partials", "remove_work_dir", "space_needed",
    "staged_output", "stale_partials", "write_failed",
]

logger = logging.getLogger(f"{__package__}.writer")  # the writer's messages, under the writer's one logger


def _not_a_directory(out: str) -> str:
    """Why ``out`` cannot be written inside: a file, or a symbolic link (never followed)."""
    if os.path.islink(out):
        target = printable(os.readlink(out))
        return (f"{out} is a symbolic link (to {target}), which is never followed: pass the directory "
                "it points to, or choose another output path")
    return f"{out} exists and is not a directory: choose another output path"


# the kinds of output: what ``convert`` and ``make-tiny`` write (a normalized checkpoint), and the
# synthetic sources (``make-tiny --hf-mxfp4/--hf-bf16/--ct-fp8``, ``synthetic.sources``), by their
# ``recognize`` kind; SOURCE: any of these (a writer that learns the kind from what it wrote)
NORMALIZED = "normalized-fp8"
SOURCE = "source"
SOURCE_KINDS = ("hf-mxfp4", "hf-bf16", "compressed-tensors-fp8", "nxdi-legacy-fp8")
# what an earlier output of ours holds: a ``--overwrite`` replaces only a directory of these
_OUR_SHARD = re.compile(r"model-\d{5}-of-\d{5}\.safetensors")
OUTPUT_SIDE_FILES = ("README.md",)  # written beside the checkpoint (the model card)
_SOURCE_FILES = (fmt.CONFIG_FILE, fmt.INDEX_FILE, "model.safetensors")
_SOURCE_ORIGINAL = ("original", (fmt.CONFIG_FILE, "model.safetensors", "dtypes.json"))  # the decoy set


def _is_our_name(name: str, extra_names: Iterable[str]) -> bool:
    from .hub import COMPANION_FILES

    return (name in (fmt.CONFIG_FILE, fmt.INDEX_FILE, *OUTPUT_SIDE_FILES, *COMPANION_FILES, *extra_names)
            or bool(_OUR_SHARD.fullmatch(name)))


def _is_source_name(out: str, name: str) -> bool:
    """Whether ``name`` (an entry of ``out``) is one a synthetic source writer writes."""
    path = os.path.join(out, name)
    if name == _SOURCE_ORIGINAL[0]:
        if not os.path.isdir(path) or os.path.islink(path):
            return False
        try:
            return set(os.listdir(path)) <= set(_SOURCE_ORIGINAL[1])
        except OSError:
            return False
    return (name in _SOURCE_FILES or bool(_OUR_SHARD.fullmatch(name))) and _is_plain_file(out, name)


def _is_plain_file(out: str, name: str) -> bool:
    """A regular file, not a symbolic link: a directory or link named like ours is not ours."""
    path = os.path.join(out, name)
    return os.path.isfile(path) and not os.path.islink(path)


def _kind_title(kind: str) -> str:
    from .recognize import TITLES

    return "a synthetic source" if kind == SOURCE else TITLES.get(kind, kind)


def _foreign(out: str, entries: list[str], kind: str, extra_names: Iterable[str]) -> list[str]:
    """What in ``out`` (its ``entries``) is not an earlier output of ``kind``: entries no writer of
    that kind writes, an index of another format, or (sources) a checkpoint of another kind."""
    if kind == NORMALIZED:  # our names, as regular files, and the index of this format among them
        foreign = [name for name in entries if not _is_our_name(name, extra_names) or not _is_plain_file(out, name)]
        index = os.path.join(out, fmt.INDEX_FILE)
        if not os.path.lexists(index):
            foreign.append(f"no {fmt.INDEX_FILE}")
        elif not _is_our_index(index):
            foreign.insert(0, f"{fmt.INDEX_FILE} (not a {fmt.FORMAT_NAME} index)")
        return foreign
    foreign = [name for name in entries if not _is_source_name(out, name)]
    if not foreign:
        from .recognize import recognize

        found = recognize(out).kind
        if found not in SOURCE_KINDS or (kind != SOURCE and found != kind):
            foreign.append(f"{_kind_title(found)}, not {_kind_title(kind)}")
    return foreign


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


def output_target(out: str | os.PathLike[str], *, overwrite: bool, extra_names: Iterable[str] = (),
                  kind: str = NORMALIZED) -> OutputTarget:
    """Decide where ``out`` is written; refuse what cannot or must not be replaced: the one rule.

    OUT must be writable (``check_writable``). A non-empty OUT needs ``overwrite``, and then must
    be recognized by its content as an earlier output of ``kind``: for ``NORMALIZED`` our
    shards, config, index of this format, companion files and card, nothing else; for a source
    kind the files a synthetic source writer writes, recognized as a checkpoint of that kind.
    An OUT that is the current directory, or holds it, is never overwritten. Our own hidden work
    folders in OUT do not count. Raises ``ConversionError`` naming OUT, what it holds and the fix."""
    out = os.path.abspath(os.fspath(out))
    if not os.path.lexists(out):
        target = OutputTarget(out, inside=False)
        check_writable(target)
        return target
    if not os.path.isdir(out) or os.path.islink(out):
        raise ConversionError(_not_a_directory(out))
    try:
        entries = sorted(name for name in os.listdir(out) if not _is_our_hidden(name, out))
    except OSError as exc:
        raise ConversionError(f"cannot list {out}: {exc.strerror or exc}") from None
    if not entries:
        target = OutputTarget(out, inside=True)
        check_writable(target)
        return target
    if not overwrite:
        raise ConversionError(f"{out} is not empty: pass --overwrite to replace it, or choose another output path")
    cwd = _current_directory()
    if cwd is not None and _inside(cwd, out):
        raise ConversionError(f"{out} is the current directory or holds it: --overwrite would replace the files "
                              "you are working in; name another OUT, or cd elsewhere first")
    foreign = _foreign(out, entries, kind, extra_names)
    if foreign:
        shown = ", ".join(printable(name) for name in foreign[:3]) + (
            f", … ({len(foreign)} in all)" if len(foreign) > 3 else "")
        what = "this converter (a normalized checkpoint)" if kind == NORMALIZED else \
            f"the same kind ({_kind_title(kind)})"
        raise ConversionError(f"{out} does not look like an earlier output of {what}: it holds {shown}; "
                              "--overwrite replaces only such an output, never anything else: empty it yourself "
                              "or choose another output path")
    target = OutputTarget(out, inside=True, replaced=tuple(entries))
    check_writable(target)
    return target


def check_writable(target: OutputTarget) -> None:
    """Refuse, before anything is written, an OUT that cannot be written: the nearest existing
    directory on the way to the work folder must be a directory this process may create entries
    in, on a filesystem mounted read-write. The one check of a dry run and a real run."""
    path = target.work_parent
    while not os.path.lexists(path) and os.path.dirname(path) != path:
        path = os.path.dirname(path)
    if not os.path.isdir(path):
        raise ConversionError(f"cannot write {target.out}: {path} is not a directory, so nothing can be created "
                              "under it; choose another output path")
    with contextlib.suppress(OSError, AttributeError):
        if os.statvfs(path).f_flag & os.ST_RDONLY:
            raise OutputWriteError(f"cannot write {target.out}: {path} is on a read-only file system; "
                                   "choose an OUT on a writable filesystem", path=path, errno_name="EROFS")
    effective = {"effective_ids": True} if os.access in os.supports_effective_ids else {}
    if not os.access(path, os.W_OK | os.X_OK, **effective):
        raise ConversionError(f"cannot write {target.out}: {path} is not writable by this user (permissions); "
                              "choose an OUT you can write to")


def _swap_entries(work: str, out: str, replaced: Iterable[str]) -> None:
    """Inside an existing OUT: the entries being replaced moved into a hidden ``old`` folder in
    OUT, the new ones moved in (the index last: an interruption never leaves a directory that
    passes the preflight), then the old ones removed. Nothing leaves OUT's filesystem."""
    old = None
    replaced = list(replaced)
    if replaced:
        old = make_private_dir(out, "old", out)
        for name in replaced:
            os.rename(os.path.join(out, name), os.path.join(old, name))
    names = sorted(os.listdir(work), key=lambda name: name == fmt.INDEX_FILE)
    for name in names:
        os.rename(os.path.join(work, name), os.path.join(out, name))
    _fsync_dir(out)
    os.rmdir(work)
    if old is not None:
        shutil.rmtree(old, ignore_errors=True)
    _fsync_dir(out)


def install(work: str, target: OutputTarget, *, overwrite: bool, extra_names: Iterable[str] = (),
            kind: str = NORMALIZED) -> None:
    """Move the finished work folder ``work`` (made by ``make_private_dir`` for ``target``) into
    place at ``target.out``. The rule is asked again first (OUT may have changed meanwhile; for
    ``SOURCE`` with the kind ``work`` is recognized as), so what is replaced is what it allows now."""
    if kind == SOURCE:
        from .recognize import recognize

        kind = recognize(work).kind
    now = output_target(target.out, overwrite=overwrite, extra_names=extra_names, kind=kind)
    out = target.out
    if target.inside:
        _swap_entries(work, out, now.replaced)
        return
    if now.inside and not now.replaced:  # made (empty) meanwhile
        os.rmdir(out)
    if now.inside:  # an earlier output appeared meanwhile: moved aside, then removed
        trash = make_private_dir(out, "old")
        os.rename(out, os.path.join(trash, "old"))
        os.rename(work, out)
        shutil.rmtree(trash, ignore_errors=True)
    else:
        os.rename(work, out)
    _fsync_dir(os.path.dirname(out))


_WRITE_ERRNOS = (errno.ENOSPC, errno.EDQUOT, errno.EFBIG)


def is_write_error(exc: BaseException, work: str | None) -> bool:
    """Whether ``exc`` is a failure to write the output (the disk or quota full, a file too
    large, or any error on a file in the work folder ``work``), not a source that cannot be read."""
    if not isinstance(exc, OSError) or isinstance(exc, ConversionError):
        return False
    filename = os.fspath(exc.filename) if isinstance(exc.filename, (str, os.PathLike)) else None
    return exc.errno in _WRITE_ERRNOS or bool(work and filename and _inside(filename, work))


def write_failed(exc: OSError, out: str, where: str | None = None) -> OutputWriteError:
    """The one-line error for an ``OSError`` while writing ``out`` (disk full, quota, I/O error),
    raised after the partial output was removed: names the path being written and says that
    OUT is as it was."""
    path = exc.filename or where or out
    reason = {errno.ENOSPC: "no space left on the device", errno.EDQUOT: "the disk quota is exceeded"}.get(
        exc.errno, exc.strerror or str(exc))
    return OutputWriteError(
        f"cannot write {out}: {reason} (writing {printable(os.fspath(path))}); the partial output was removed"
        + (f" and {out} is as it was" if os.path.lexists(out) else ", nothing is left") + ": free some space or "
        "choose another OUT", path=os.fspath(path), errno_name=errno.errorcode.get(exc.errno or 0))


@contextlib.contextmanager
def staged_output(out: str | os.PathLike[str], *, overwrite: bool, kind: str) -> Iterator[str]:
    """A hidden work folder for writing ``out`` whole: the rule asked first (``output_target``),
    the folder installed at ``out`` when the block ends normally, removed otherwise. An
    ``OSError`` inside (disk full, say) becomes one ``OutputWriteError`` naming the path."""
    target = output_target(out, overwrite=overwrite, kind=kind)
    try:
        if not target.inside:
            os.makedirs(target.work_parent, exist_ok=True)
        remove_stale_partials(target.out)
        work = make_private_dir(target.out, "partial", target.work_parent)
    except OSError as exc:
        raise write_failed(exc, target.out, target.work_parent) from None
    try:
        yield work
        install(work, target, overwrite=overwrite, kind=kind)
    except OSError as exc:
        if not is_write_error(exc, work) and exc.filename is not None:
            raise
        raise write_failed(exc, target.out, work) from None
    finally:
        remove_work_dir(work, target.out)


def remove_work_dir(path: str | None, out: str) -> None:
    """Remove ``path`` if it is a hidden work or old folder of a writer of ``out`` (made by
    ``make_private_dir``); anything else is never removed (``ValueError``: a bug, not an input)."""
    if path is None or not os.path.lexists(path):
        return
    if not _is_our_hidden(os.path.basename(path), os.path.abspath(os.fspath(out))):
        raise ValueError(f"{path} is not a work folder of a writer of {out}: not removed")
    shutil.rmtree(path, ignore_errors=True)


def _fsync_dir(path: str) -> None:
    try:
        fd = os.open(path or ".", os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


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
            f"{out}: the output needs {format_bytes(needed)} ({needed:,} bytes) on disk but the filesystem holding "
            f"{where} has {format_bytes(free)} ({free:,} bytes) free: free some space or choose another OUT")


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
