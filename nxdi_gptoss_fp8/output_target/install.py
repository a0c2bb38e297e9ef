"""Moving a finished work folder into place at OUT, and what a failed write leaves: the only
module that replaces an output (``install``, ``staged_output``) or removes a work folder
(``remove_work_dir``). The rule is asked again first, so what is replaced is what it allows now;
a write error becomes one ``OutputWriteError`` naming the path. Stdlib only.
"""

from __future__ import annotations

import contextlib
import errno
import os
import shutil
from collections.abc import Iterable, Iterator

from .. import format as fmt
from ..errors import ConversionError, OutputWriteError
from ..recognize import NORMALIZED
from ..units import printable
from .rule import SOURCE, OutputTarget, inside, output_target
from .work_dirs import is_our_hidden, make_private_dir, remove_stale_partials

__all__ = ["install", "is_write_error", "remove_work_dir", "staged_output", "write_failed"]


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
        from ..recognize import recognize

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
    return exc.errno in _WRITE_ERRNOS or bool(work and filename and inside(filename, work))


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
    if not is_our_hidden(os.path.basename(path), os.path.abspath(os.fspath(out))):
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
