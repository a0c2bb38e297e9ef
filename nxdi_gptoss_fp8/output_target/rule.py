"""What an output directory may be, and what an ``--overwrite`` may replace: the one rule.

Whether OUT is written beside its parent or inside an existing directory (``output_target``,
``OutputTarget``), whether it can be written at all (``check_writable``: the same check for a dry
run and a real run), and what an ``--overwrite`` may replace (only a directory recognized by its
content as an earlier output of the same kind). The work folders are ``work_dirs``, moving one
into place ``install``, the room it needs ``space``. Stdlib only.
"""

from __future__ import annotations

import contextlib
import os
import re
from collections.abc import Iterable
from dataclasses import dataclass

from .. import format as fmt
from ..errors import ConversionError, OutputWriteError
from ..recognize import COMPRESSED_TENSORS_FP8, HF_BF16, HF_MXFP4, LEGACY_FP8, NORMALIZED, TITLES, recognize
from ..safeio.json_file import JsonFileError, read_json_file
from ..units import printable
from .work_dirs import is_our_hidden

__all__ = ["OUTPUT_SIDE_FILES", "SOURCE", "SOURCE_KINDS", "OutputTarget", "check_writable", "inside",
           "output_target"]


def _not_a_directory(out: str) -> str:
    """Why ``out`` cannot be written inside: a file, or a symbolic link (never followed)."""
    if os.path.islink(out):
        target = printable(os.readlink(out))
        return (f"{out} is a symbolic link (to {target}), which is never followed: pass the directory "
                "it points to, or choose another output path")
    return f"{out} exists and is not a directory: choose another output path"


# the kinds of output: what ``convert`` and ``make-tiny`` write (a normalized checkpoint,
# ``recognize.NORMALIZED``), and the synthetic sources (``make-tiny --hf-mxfp4/--hf-bf16/--ct-fp8``,
# ``synthetic.sources``), by their ``recognize`` kind; SOURCE: any of these (a writer that learns
# the kind from what it wrote)
SOURCE = "source"
SOURCE_KINDS = (HF_MXFP4, HF_BF16, COMPRESSED_TENSORS_FP8, LEGACY_FP8)
# what an earlier output of ours holds: a ``--overwrite`` replaces only a directory of these
_OUR_SHARD = re.compile(r"model-\d{5}-of-\d{5}\.safetensors")
OUTPUT_SIDE_FILES = ("README.md",)  # written beside the checkpoint (the model card)
_SOURCE_FILES = (fmt.CONFIG_FILE, fmt.INDEX_FILE, "model.safetensors")
_SOURCE_ORIGINAL = ("original", (fmt.CONFIG_FILE, "model.safetensors", "dtypes.json"))  # the decoy set


def _is_our_name(name: str, extra_names: Iterable[str]) -> bool:
    from ..hub import COMPANION_FILES

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


def inside(path: str, directory: str) -> bool:
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
        entries = sorted(name for name in os.listdir(out) if not is_our_hidden(name, out))
    except OSError as exc:
        raise ConversionError(f"cannot list {out}: {exc.strerror or exc}") from None
    if not entries:
        target = OutputTarget(out, inside=True)
        check_writable(target)
        return target
    if not overwrite:
        raise ConversionError(f"{out} is not empty: pass --overwrite to replace it, or choose another output path")
    cwd = _current_directory()
    if cwd is not None and inside(cwd, out):
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
