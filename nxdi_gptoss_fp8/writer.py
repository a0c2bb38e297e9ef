"""Write a normalized checkpoint: shard plan and headers up front, data streamed, index last.

Every shard's header is computed from the format's namespace before any data exists, so the
file is created at its final size and each tensor (or any chunk of one) is written at its
offset as soon as it is ready: memory never holds more than the caller's chunk. Everything
goes into a hidden temporary directory beside the output; ``commit`` checks that every byte
was written, copies the extra files (tokenizer, generation config), writes ``config.json`` and
the index last, and renames the directory into place.
An interrupted write therefore never leaves a directory that passes the preflight. The hidden
directory is named ``.OUT.partial-HOST-PID-RANDOM`` and created with the user's umask; when a
run is killed outright (SIGKILL, out of memory) and leaves it behind, the next writer of the
same OUT removes it once that process is gone, and logs what it removed. Where OUT is written,
what it may replace, the free-space check and the leftovers: ``output_target``.
"""

from __future__ import annotations

import contextlib
import errno
import json
import logging
import os
import re
import shutil
import struct
import threading
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from . import format as fmt
from .errors import ConversionError
from .output_target.install import install, is_write_error, remove_work_dir, write_failed
from .output_target.rule import output_target
from .output_target.space import check_space
from .output_target.work_dirs import make_private_dir, refuse_concurrent_writer, remove_stale_partials
from .progress import Progress
from .safeio.files import open_regular
from .safeio.hashing import BackgroundHasher
from .units import plural

__all__ = [
    "DEFAULT_MAX_SHARD_SIZE", "INDEX_SLACK", "CheckpointWriter", "PlannedTensor", "as_bytes", "build_header", "logger",
    "plan_shards", "shard_file_name", "shard_units",
]

logger = logging.getLogger(__name__)

DEFAULT_MAX_SHARD_SIZE = 5_000_000_000
INDEX_SLACK = 1024  # bytes of index metadata a caller may add before commit (``planned_files``)
_ALIGNMENT = 8
_DTYPE_ORDER = {"F64": 0, "I64": 0, "U64": 0, "F32": 1, "I32": 1, "U32": 1, "BF16": 2, "F16": 2}
_QKV = re.compile(r"^(.*self_attn\.)([qkv])_proj\.(weight|bias)$")


def _placement_key(spec: fmt.TensorSpec) -> tuple[int, str]:
    """Order of tensors in a shard: descending element size (alignment), then name, except
    that a layer's q, k, v weights (and biases) follow each other in that order, so a loader
    can present NxDI's fused ``Wqkv`` as a view of the file instead of a concatenated copy."""
    match = _QKV.match(spec.name)
    name = f"{match[1]}qkv.{match[3]}.{'qkv'.index(match[2])}" if match else spec.name
    return _DTYPE_ORDER.get(spec.dtype, 3), name


def shard_units(layout: fmt.Layout) -> list[list[fmt.TensorSpec]]:
    """Groups of tensors that stay in one shard: each global, a layer's non-expert tensors,
    and each expert projection with its scale and bias (a weight and its scale share a shard)."""
    globals_ = {spec.name: spec for spec in fmt.global_specs(layout)}
    units: list[list[fmt.TensorSpec]] = [[globals_["embed_tokens.weight"]]]
    for layer in range(layout.dims.num_hidden_layers):
        specs = fmt.layer_specs(layout, layer)
        for proj in (fmt.GATE_UP, fmt.DOWN):
            units.append([s for s in specs if f".{proj}." in s.name])
        units.append([s for s in specs if fmt.EXPERT_PREFIX not in s.name])
    units.append([globals_["norm.weight"]])
    units.append([globals_["lm_head.weight"]])
    return units


def plan_shards(layout: fmt.Layout, max_shard_size: int) -> list[list[fmt.TensorSpec]]:
    """Pack the units greedily, in order, into shards of at most ``max_shard_size`` tensor
    bytes (a unit larger than that gets a shard of its own)."""
    shards: list[list[fmt.TensorSpec]] = [[]]
    size = 0
    for unit in shard_units(layout):
        unit_size = sum(spec.nbytes for spec in unit)
        if shards[-1] and size + unit_size > max_shard_size:
            shards.append([])
            size = 0
        shards[-1].extend(unit)
        size += unit_size
    return shards


def shard_file_name(number: int, count: int) -> str:
    return f"model-{number:05d}-of-{count:05d}.safetensors"


@dataclass(frozen=True)
class PlannedTensor:
    spec: fmt.TensorSpec
    shard: str
    offset: int  # absolute file offset of the first data byte


def build_header(specs: Iterable[fmt.TensorSpec]) -> tuple[bytes, dict[str, int]]:
    """A safetensors header (length prefix included) and each tensor's data offset.

    Tensors are ordered by ``_placement_key``, so every tensor starts at a multiple of its
    element size; the JSON is padded with spaces to an 8-byte boundary.
    """
    ordered = sorted(specs, key=_placement_key)
    entries: dict[str, Any] = {}
    offsets: dict[str, int] = {}
    position = 0
    for spec in ordered:
        entries[spec.name] = {"dtype": spec.dtype, "shape": list(spec.shape), "data_offsets": [position, position + spec.nbytes]}
        offsets[spec.name] = position
        position += spec.nbytes
    text = json.dumps(entries, separators=(",", ":")).encode()
    text += b" " * (-(8 + len(text)) % _ALIGNMENT)
    prefix = struct.pack("<Q", len(text))
    start = len(prefix) + len(text)
    return prefix + text, {name: start + offset for name, offset in offsets.items()}


def as_bytes(data: Any) -> memoryview:
    """A flat byte view of ``data``: a torch tensor (any dtype, made contiguous) or a buffer."""
    if type(data).__module__.startswith("torch"):
        import torch

        flat = data.detach().contiguous().reshape(-1)
        return memoryview(flat.view(torch.uint8).numpy()).cast("B")
    return memoryview(data).cast("B")


def planned_bytes(plan: Mapping[str, PlannedTensor], name: str, data: Any, offset: int) -> tuple[PlannedTensor, memoryview]:
    """Tensor ``name``'s place in ``plan`` and ``data`` as bytes; ``ConversionError`` unless
    ``name`` is planned and bytes ``[offset, offset+len)`` fall inside it."""
    planned = plan.get(name)
    if planned is None:
        raise ConversionError(f"{name} is not a tensor of the normalized format")
    raw = as_bytes(data)
    if offset < 0 or offset + raw.nbytes > planned.spec.nbytes:
        raise ConversionError(f"{name}: bytes {offset}..{offset + raw.nbytes} exceed its {plural(planned.spec.nbytes, 'byte')}")
    return planned, raw


def pwrite_all(fd: int, view: memoryview, position: int) -> None:
    """Write all of ``view`` at ``position`` of ``fd`` (``os.pwrite`` may write less per call)."""
    while view.nbytes:
        written = os.pwrite(fd, view, position)
        view, position = view[written:], position + written


class CheckpointWriter:
    """Streams a normalized checkpoint into place. Use as a context manager::

        with CheckpointWriter(out, layout, "custom", config) as writer:
            for name, tensor in tensors:
                writer.put(name, tensor)
            writer.commit()

    Leaving the block without ``commit`` (an exception, a kill) removes the temporary
    directory when it can; a directory left by a kill has no index, is hidden, and is removed
    by the next writer of the same output (``remove_stale_partials``).
    """

    def __init__(
        self,
        out: str | os.PathLike[str],
        layout: fmt.Layout,
        profile: str,
        config: Mapping[str, Any],
        *,
        max_shard_size: int = DEFAULT_MAX_SHARD_SIZE,
        source: Mapping[str, Any] | None = None,
        overwrite: bool = False,
        hash_workers: int = 2,
        record_sha256: bool = True,
        extra_files: Mapping[str, str | os.PathLike[str]] | None = None,
        sparse: bool = False,
        conversion_target: str | None = None,
    ) -> None:
        self.out = os.path.abspath(os.fspath(out))
        self.conversion_target = conversion_target  # a format.TARGETS name, recorded as metadata.target
        self.sparse = sparse  # the caller leaves most bytes as holes (put_zeros): no free-space check
        self.layout, self.profile, self.config = layout, profile, dict(config)
        self.source = dict(source) if source is not None else None
        self.extra_files = dict(extra_files or {})
        # file name → text written beside the checkpoint at commit, inside the atomic write (a
        # model card made from the finished conversion, say); set before ``commit``
        self.text_files: dict[str, str] = {}
        # file name → an upper bound of a text file the caller will set before ``commit`` (counted
        # by ``planned_files``, so the free-space check covers it)
        self.reserved: dict[str, int] = {}
        self.overwrite, self.hash_workers, self.record_sha256 = overwrite, hash_workers, record_sha256
        for name in self.extra_files:
            if os.path.basename(name) != name or name in (".", "..", fmt.CONFIG_FILE, fmt.INDEX_FILE) \
                    or name.lower().endswith(fmt.WEIGHT_FILE_SUFFIXES) or name.startswith("."):
                raise ConversionError(f"extra file {name!r} must be a plain file name that is not the checkpoint's own "
                                      "config, index or a weight file")
        self.target = output_target(self.out, overwrite=overwrite, extra_names=self.extra_files)
        plan = plan_shards(layout, max_shard_size)
        self.shard_names = [shard_file_name(i + 1, len(plan)) for i in range(len(plan))]
        self._plan: dict[str, PlannedTensor] = {}
        self._headers: dict[str, tuple[bytes, int]] = {}
        for shard, specs in zip(self.shard_names, plan, strict=True):
            header, offsets = build_header(specs)
            size = len(header) + sum(spec.nbytes for spec in specs)
            self._headers[shard] = (header, size)
            for spec in specs:
                self._plan[spec.name] = PlannedTensor(spec, shard, offsets[spec.name])
        self._written: dict[str, int] = dict.fromkeys(self._plan, 0)
        # bytes each shard still waits for: at 0 its SHA-256 starts in the background
        self._remaining = {shard: size - len(header) for shard, (header, size) in self._headers.items()}
        self._lock = threading.Lock()  # the counts, updated from the writing threads
        self._hasher: BackgroundHasher | None = None
        self._fds: dict[str, int] = {}
        self.tmp: str | None = None
        self.committed = False
        self.removed_stale: list[str] = []

    @property
    def shard_sizes(self) -> dict[str, int]:
        """Shard file name → its size in bytes (header included), as it will be written."""
        return {shard: size for shard, (_header, size) in self._headers.items()}

    def planned_files(self) -> dict[str, int]:
        """Every file of the finished output → its size in bytes: the shards (from their headers),
        ``config.json`` and the copied and text files exactly, the index with its digests plus
        ``INDEX_SLACK`` (room for what a caller adds to the ``source`` metadata before commit, e.g.
        the exactness summary), and each ``reserved`` file at the bound its caller gave."""
        files = dict(self.shard_sizes)
        for name, source in self.extra_files.items():
            with contextlib.suppress(OSError):
                files[name] = os.stat(source).st_size
        files.update({name: len(text.encode("utf-8")) for name, text in self.text_files.items()})
        files.update({name: bound for name, bound in self.reserved.items() if name not in self.text_files})
        files[fmt.CONFIG_FILE] = len(_json_text(self.config).encode("utf-8"))
        digests = dict.fromkeys(self.shard_names, "0" * 64) if self.record_sha256 else None
        metadata = fmt.index_metadata(self.layout, self.profile, shard_sha256=digests, source=self.source,
                                      target=self.conversion_target)
        index = {"metadata": metadata, "weight_map": {name: planned.shard for name, planned in self._plan.items()}}
        files[fmt.INDEX_FILE] = len(_json_text(index).encode("utf-8")) + INDEX_SLACK
        return files

    def planned_bytes(self) -> int:
        """Bytes the finished output's files hold (``planned_files``, summed)."""
        return sum(self.planned_files().values())

    def check_space(self) -> None:
        """Refuse, before the first byte, an output that cannot finish where it will be written:
        the free space of that filesystem must cover ``planned_files`` on disk
        (``output_target.check_space``)."""
        if self.sparse:
            return
        check_space(self.target, self.planned_files().values(), self.out)

    def __enter__(self) -> CheckpointWriter:
        if not self.target.inside:
            self.check_space()
            os.makedirs(self.target.work_parent, exist_ok=True)
        self.removed_stale = remove_stale_partials(self.out)
        self.check_space()
        try:
            self.tmp = make_private_dir(self.out, "partial", self.target.work_parent)
            refuse_concurrent_writer(self.out, self.tmp)
            for shard, (header, size) in self._headers.items():
                fd = os.open(os.path.join(self.tmp, shard), os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o644)
                self._fds[shard] = fd
                os.pwrite(fd, header, 0)
                os.ftruncate(fd, size)
            if self.record_sha256:
                self._hasher = BackgroundHasher(self.hash_workers)
        except ConversionError:
            self.abort()
            raise
        except OSError as exc:
            self.abort()
            if exc.errno in (errno.ENOSPC, errno.EDQUOT):
                raise write_failed(exc, self.out, self.tmp) from None
            where = self.tmp or self.target.work_parent
            raise ConversionError(f"cannot write the output {self.out} (in {where}): {exc.strerror or exc}: "
                                  "choose an OUT you can write to") from None
        return self

    def __exit__(self, exc_type: object, exc: object, traceback: object) -> None:
        self._stop_hashing()
        self._close_files()
        if not self.committed:
            self.abort()
            if isinstance(exc, OSError) and is_write_error(exc, self.tmp):  # disk full, say: one line
                raise write_failed(exc, self.out, self.tmp) from None

    @property
    def planned(self) -> Mapping[str, PlannedTensor]:
        return self._plan

    def put(self, name: str, data: Any, *, offset: int = 0) -> None:
        """Write ``data`` (a tensor or buffer) as bytes ``[offset, offset+len)`` of tensor ``name``."""
        planned, raw = planned_bytes(self._plan, name, data, offset)
        try:
            pwrite_all(self._fds[planned.shard], raw, planned.offset + offset)
        except OSError as exc:  # the file being written named (a pwrite error names none)
            exc.filename = exc.filename or os.path.join(self.tmp or "", planned.shard)
            raise
        self._count(name, planned.shard, raw.nbytes)

    def _count(self, name: str, shard: str, size: int) -> None:
        """Count ``size`` more bytes of tensor ``name`` written; a shard whose every byte is
        written is handed to the background hasher at once (it is hashed while the rest converts,
        through the page cache)."""
        with self._lock:
            self._written[name] += size
            self._remaining[shard] -= size
            complete = self._remaining[shard] == 0
        if complete and self._hasher is not None and self.tmp is not None:
            self._hasher.submit(shard, os.path.join(self.tmp, shard))

    def put_zeros(self, name: str) -> None:
        """Declare all of tensor ``name`` zero without writing it: shard files are created at
        their final size, so unwritten bytes read as zeros (and stay holes in sparse files)."""
        planned = self._plan.get(name)
        if planned is None:
            raise ConversionError(f"{name} is not a tensor of the normalized format")
        self._count(name, planned.shard, planned.spec.nbytes - self._written[name])

    def mark_written(self, name: str, size: int) -> None:
        """Count ``size`` bytes of tensor ``name`` as written by a worker process straight into
        this writer's shard files (``tmp``, at the planned offsets: ``convert.workers``)."""
        planned = self._plan.get(name)
        if planned is None or size < 0 or self._written[name] + size > planned.spec.nbytes:
            raise ConversionError(f"{name}: {plural(size, 'more byte')} do not fit the planned tensor")
        self._count(name, planned.shard, size)

    def commit(self, *, show_progress: bool | None = None) -> str:
        """Check completeness, wait for the shards' digests, write config and index, move into place.

        Each shard was handed to the background hasher when its last byte was written (``put``);
        here the rest of the hashing is waited for. ``show_progress`` is ``progress.Progress``'s
        ``show`` (None: a bar on a terminal, a plain line every few seconds elsewhere)."""
        incomplete = [n for n, count in self._written.items() if count != self._plan[n].spec.nbytes]
        if incomplete:
            raise ConversionError(f"{plural(len(incomplete), 'tensor')} not written completely (first: {incomplete[0]})")
        assert self.tmp is not None, "commit() outside the with-block"
        for fd in self._fds.values():
            os.fsync(fd)
        self._close_files()
        paths = {shard: os.path.join(self.tmp, shard) for shard in self.shard_names}
        digests = None
        if self._hasher is not None:
            for shard, path in paths.items():  # complete by the check above: already handed over
                if not self._hasher.submitted(shard):
                    self._hasher.submit(shard, path)
            total = sum(os.path.getsize(path) for path in paths.values())
            with Progress(total, "sha256 shards", show=show_progress) as progress:
                hashed = self._hasher.results(progress.update)
            digests = {shard: hashed[shard] for shard in self.shard_names}
        metadata = fmt.index_metadata(self.layout, self.profile, shard_sha256=digests, source=self.source,
                                      target=self.conversion_target)
        weight_map = {name: planned.shard for name, planned in self._plan.items()}
        for name, source in self.extra_files.items():
            _copy_regular(source, os.path.join(self.tmp, name))
        for name, text in self.text_files.items():
            if os.path.basename(name) != name or name.startswith(".") or name in (fmt.CONFIG_FILE, fmt.INDEX_FILE) \
                    or name in self.extra_files or name.lower().endswith(fmt.WEIGHT_FILE_SUFFIXES):
                raise ConversionError(f"text file {name!r} must be a plain file name of its own")
            with open(os.path.join(self.tmp, name), "w", encoding="utf-8") as handle:
                handle.write(text)
                handle.flush()
                os.fsync(handle.fileno())
        _write_json(os.path.join(self.tmp, fmt.CONFIG_FILE), self.config)
        _write_json(os.path.join(self.tmp, fmt.INDEX_FILE), {"metadata": metadata, "weight_map": weight_map})
        self._move_into_place()
        self.committed = True
        return self.out

    def abort(self) -> None:
        self._stop_hashing()
        self._close_files()
        remove_work_dir(self.tmp, self.out)

    def _stop_hashing(self) -> None:
        if self._hasher is not None:
            self._hasher.close()

    def _close_files(self) -> None:
        for fd in self._fds.values():
            os.close(fd)
        self._fds.clear()

    def _move_into_place(self) -> None:
        assert self.tmp is not None
        install(self.tmp, self.target, overwrite=self.overwrite, extra_names=self.extra_files)


def _copy_regular(source: str | os.PathLike[str], target: str) -> None:
    """Copy a regular file (a FIFO or device is refused, never read); fsynced like the rest."""
    try:
        with open_regular(source) as reader, open(target, "wb") as writer:
            shutil.copyfileobj(reader, writer, 1 << 20)
            writer.flush()
            os.fsync(writer.fileno())
    except OSError as exc:  # NotRegularFileError included
        raise ConversionError(f"cannot copy {os.fspath(source)} into the output: {exc.strerror or exc}") from None


def _json_text(document: Any) -> str:
    """A JSON file's text as the writer writes it (what ``planned_files`` measures)."""
    return json.dumps(document, indent=2) + "\n"


def _write_json(path: str, document: Any) -> None:
    with open(path, "w", encoding="utf-8") as handle:
        handle.write(_json_text(document))
        handle.flush()
        os.fsync(handle.fileno())

