"""The ``values`` checks on the expert scales, read in bounded chunks, byte-classified without numpy."""

from __future__ import annotations

import itertools
import struct
import sys
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from .. import format as fmt
from ..machine import cache_chunk_bytes
from ..safeio.reader import CheckpointReader
from ..safeio.safetensors_header import TensorInfo
from ..units import plural
from .findings import PreflightReport, Severity
from .namespace import _BEGIN, _END
from .nxdi_config import bounded_int
from .view import CheckpointView

__all__ = ["MAX_SCALE_BYTES", "ScaleStats", "loaded_numpy", "scale_stats"]


# Scales are read in cache-sized chunks (``machine.cache_chunk_bytes``) through one buffer, and never more than
# this in all: the published profiles hold 159 MB (120b) and 360 MB (120b padded to 3072/8192).
MAX_SCALE_BYTES = 1024 * 1024 * 1024


@dataclass
class ScaleStats:
    """Counts over float32 scales: ``bad`` values are not normal, finite and > 0.

    The other counts overlap (-0.0 is both negative and zero) and only explain ``bad``.
    """

    bad: int
    negative: int
    zero: int
    non_finite: int
    subnormal: int = 0
    first_bad: int = -1

    def merge(self, other: ScaleStats, offset: int) -> ScaleStats:
        """These counts plus ``other``'s, whose values start ``offset`` values later."""
        first = self.first_bad if self.first_bad >= 0 else (other.first_bad + offset if other.first_bad >= 0 else -1)
        return ScaleStats(self.bad + other.bad, self.negative + other.negative, self.zero + other.zero,
                          self.non_finite + other.non_finite, self.subnormal + other.subnormal, first)


# A float32 is bad when its sign is set or its exponent is all zeros (zero, subnormal) or all
# ones (inf, NaN). The exponent spans the top byte's low 7 bits and the next byte's top bit,
# so each value gets a class from each byte and the two are ANDed (as big integers, one bit
# field per value): 0 = good, 1 = zero/subnormal, 2 = inf/NaN, with bit 4 added for a sign.
_TOP_CLASS = bytes((4 if b & 0x80 else 0) | (1 if b & 0x7F == 0 else 2 if b & 0x7F == 0x7F else 0) for b in range(256))


_NEXT_CLASS = bytes(4 | (1 if b < 0x80 else 2) for b in range(256))


_NOT_ZERO = bytes(1 if b else 0 for b in range(256))


_LOW_EXPONENT = bytes(1 if b in (1, 5) else 0 for b in range(256))


# the float32 bit patterns that are normal, finite and > 0: one range of 32-bit words
# (0x00800000 is the smallest normal, 0x7F7FFFFF the largest finite)
_GOOD_WORDS = (0x0080_0000, 0x7F7F_FFFF)


def loaded_numpy() -> Any:
    """numpy if this process has already imported it (NxDI's process has), else None.

    The scale check uses it to decide ordinary scales faster, but never imports it: importing
    numpy costs more (~40 ms) than it saves on the largest published scales (~10 ms)."""
    return sys.modules.get("numpy")


def scale_stats(raw: bytes | bytearray | memoryview, *, numpy: Any = None) -> ScaleStats:
    """Count little-endian float32 values in ``raw`` that are not normal, finite and > 0.

    No Python loop per value: the bytes of each value are taken with stride slices, classified
    with ``bytes.translate`` tables and combined as one big-integer AND, all C loops. Ordinary
    positive scales are decided by their top byte alone: all of them in 0x01 … 0x7E is one
    stride slice, ``isascii`` (no sign bit) and two ``memchr`` scans (no 0x00, no 0x7F) — or,
    given the ``numpy`` module, a min and a max over the values as 32-bit words (no copy): all
    of them good is all words in one range. Anything else is counted as above.
    """
    count = len(raw) // 4
    if len(raw) != 4 * count:
        raw = raw[:4 * count]
    if numpy is not None:
        words = numpy.frombuffer(raw, dtype="<u4")
        if not count or (words.min() >= _GOOD_WORDS[0] and words.max() <= _GOOD_WORDS[1]):
            return ScaleStats(0, 0, 0, 0)
    if isinstance(raw, memoryview):  # a bad value among them (rare): the byte passes below need bytes
        raw = raw.tobytes()
    top = raw[3::4]  # bytes, or a bytearray for a bytearray (no second copy)
    if top.isascii() and b"\x00" not in top and b"\x7f" not in top:
        return ScaleStats(0, 0, 0, 0)
    if not raw.translate(None, b"\x00"):  # all zero (a preallocated, never-written file)
        return ScaleStats(count, 0, count, 0, 0, 0)
    classes = (int.from_bytes(top.translate(_TOP_CLASS), "little")
               & int.from_bytes(bytes(raw[2::4]).translate(_NEXT_CLASS), "little")).to_bytes(count, "little")
    good = classes.count(0)
    low_exponent = classes.count(1) + classes.count(5)
    non_finite = classes.count(2) + classes.count(6)
    zero = 0
    if low_exponent:  # exact zeros among them: the three low bytes are zero too
        low = int.from_bytes(raw[0::4].translate(_NOT_ZERO), "little") | int.from_bytes(raw[1::4].translate(_NOT_ZERO), "little") \
            | int.from_bytes(raw[2::4].translate(_NOT_ZERO), "little")
        exponent_zero = int.from_bytes(classes.translate(_LOW_EXPONENT), "little")
        zero = (exponent_zero & ~low).bit_count()
    return ScaleStats(
        bad=count - good, negative=count - good - classes.count(1) - classes.count(2), zero=zero,
        non_finite=non_finite, subnormal=low_exponent - zero,
        first_bad=count - len(classes.lstrip(b"\x00")) if good < count else -1,
    )


# Checks whose errors make the shard headers untrustworthy as a map of the scales' bytes.
_SCALE_BLOCKERS = frozenset({"config", "index", "header", "ownership", "collision", "dtype_shape", "sidecar"})


def _scales_trusted(view: CheckpointView, report: PreflightReport) -> bool:
    """Whether the scales may be read: config, index and headers agree, and the size is bounded.

    Otherwise one finding says why they were not read (an info when other errors already make
    the checkpoint invalid; an error when the checkpoint claims more scale bytes than the
    preflight will read).
    """
    blocked = sorted({f.check for f in report.errors if f.check in _SCALE_BLOCKERS})
    if view.layout is None or view.broken_shards or blocked:
        reason = f"of the {', '.join(blocked)} errors above" if blocked else "the config and index give no usable layout"
        report.add("values", "not_checked", f"scale values were not read because {reason}: fix those first", severity=Severity.INFO)
        return False
    layout = view.layout
    total = 4 * layout.dims.num_hidden_layers * layout.dims.num_local_experts * (2 * layout.padded_intermediate_size + layout.padded_hidden_size)
    if total > MAX_SCALE_BYTES:
        report.add(
            "values", "scales_too_large",
            f"the layout implies {plural(total, 'byte')} of expert scales, above the {MAX_SCALE_BYTES:,} the preflight "
            "reads (the published profiles hold at most a few hundred MB): the scales cannot be checked",
            file=fmt.INDEX_FILE, key="metadata",
        )
        return False
    return True


def _read_scale_stats(handle: Any, start: int, nbytes: int, buffer: bytearray, counted: list[int],
                      numpy: Any = None) -> tuple[ScaleStats, bytes]:
    """Stats of the ``nbytes`` scale bytes at ``start`` of the open shard ``handle``, read
    through ``buffer`` in chunks of its size (``numpy``: as for ``scale_stats``); also the
    first bad value's 4 bytes (or b""). The bytes read are added to ``counted[0]``."""
    stats = ScaleStats(0, 0, 0, 0)
    first_value = b""
    whole = memoryview(buffer)
    handle.seek(start)
    done = 0
    while done < nbytes:
        size = min(len(buffer), nbytes - done)
        got = _read_into(handle, whole[:size])
        if not got:
            raise EOFError
        counted[0] += got
        # the last, shorter chunk: a view for numpy (no copy); the stdlib passes need a bytearray
        raw = buffer if got == len(buffer) else whole[:got] if numpy is not None else buffer[:got]
        chunk = scale_stats(raw, numpy=numpy)
        if chunk.bad and not first_value:
            first_value = bytes(raw[4 * chunk.first_bad:4 * chunk.first_bad + 4])
        stats = stats.merge(chunk, done // 4)
        done += got
    return stats, first_value


def _read_into(handle: Any, view: memoryview) -> int:
    """Fill ``view`` from ``handle`` (short reads continued); the bytes read, fewer only at the end of the file."""
    got = 0
    while got < len(view):
        count = handle.readinto(view[got:])
        if not count:
            break
        got += count
    return got


@dataclass(frozen=True)
class _ScaleRead:
    """What reading one scale tensor gave: its stats and first bad value's bytes, or the
    (check, code, message) of the finding that replaces them."""

    stats: ScaleStats | None = None
    first_value: bytes = b""
    problem: tuple[str, str, str] | None = None


def _read_shard_scales(reader: CheckpointReader, shard: str, items: list[tuple[str, TensorInfo]], start: int,
                       buffer: Callable[[], bytearray], numpy: Any) -> tuple[dict[str, _ScaleRead], int]:
    """Every scale tensor of one shard, in file order, through one open handle and the buffer
    ``buffer()`` gives this thread; also the bytes read."""
    reads: dict[str, _ScaleRead] = {}
    counted = [0]
    try:
        with reader.open(shard) as handle:
            for key, info in items:
                try:
                    stats, first_value = _read_scale_stats(handle, start + info.begin, info.nbytes, buffer(), counted,
                                                           numpy)
                except EOFError:
                    reads[key] = _ScaleRead(problem=("header", "data_beyond_file", f"{shard} ended while reading {key}"))
                    continue
                reads[key] = _ScaleRead(stats, first_value)
    except OSError as exc:
        for key, _ in items:
            reads.setdefault(key, _ScaleRead(problem=("filesystem", "unreadable",
                                                      f"cannot read {key} from {shard}: {exc.strerror or exc}")))
    return reads, counted[0]


def _check_scale_values(view: CheckpointView, report: PreflightReport) -> None:
    """Every expert scale tensor of the format's dtype and shape read and checked: each shard
    opened once, its scales read in file order through one buffer reused for all of them
    (cache-sized: a fresh zeroed buffer per tensor costs its page faults each time); the
    findings in key order."""
    # only scales of the format's shape are read: a mis-shaped "scale" could be any size
    expected = view.expected() or {}
    numpy = loaded_numpy()
    by_shard: dict[str, list[tuple[str, TensorInfo]]] = {}
    for key in sorted(k for k in expected if fmt.is_expert_scale(k) and k in view.locations):
        shard, info = view.tensor(key)  # type: ignore[misc]
        spec = expected.get(key)
        if info.dtype != fmt.F32 or spec is None or info.shape != spec.shape:
            continue
        by_shard.setdefault(shard, []).append((key, info))
    if not by_shard:
        return
    largest = max(info.nbytes for items in by_shard.values() for _, info in items)
    chunk = cache_chunk_bytes() if view.reader.local else view.reader.read_chunk
    size = max(4, min(chunk & ~3, largest))  # whole float32 values per chunk
    buffers = threading.local()  # one buffer per thread, reused for every tensor it reads

    def buffer() -> bytearray:
        if getattr(buffers, "buffer", None) is None:
            buffers.buffer = bytearray(size)
        return buffers.buffer  # type: ignore[no-any-return]

    def shard_scales(shard: str) -> tuple[dict[str, _ScaleRead], int]:
        return _read_shard_scales(view.reader, shard, sorted(by_shard[shard], key=lambda item: item[1].begin),
                                  view.headers[shard].data_offset, buffer, numpy)

    reads: dict[str, _ScaleRead] = {}
    for shard_reads, counted in view.reader.map(shard_scales, list(by_shard)):
        reads.update(shard_reads)
        report.bytes_read += counted
    for key in sorted(reads):
        read = reads[key]
        shard, info = view.tensor(key)  # type: ignore[misc]
        if read.problem is not None:
            check, code, message = read.problem
            report.add(check, code, message, file=shard, key=key)
        elif read.stats is not None and read.stats.bad:
            stats = read.stats
            (value,) = struct.unpack("<f", read.first_value)
            coords = _unravel(stats.first_bad, info.shape)
            report.add(
                "values", "bad_scale",
                f"{key} has {stats.bad:,} of {info.numel:,} scales that are not normal, finite and > 0 "
                f"({stats.negative:,} negative, {stats.zero:,} zero, {stats.subnormal:,} subnormal, "
                f"{stats.non_finite:,} inf/NaN); first at {list(coords)} = {value!r}",
                file=shard, key=key,
            )


def _unravel(index: int, shape: tuple[int, ...]) -> tuple[int, ...]:
    coords = []
    for dim in reversed(shape):
        coords.append(index % dim if dim else 0)
        index //= dim or 1
    return tuple(reversed(coords))


def _check_total_size(view: CheckpointView, report: PreflightReport) -> None:
    total = bounded_int(view.metadata.get("total_size"), 0, fmt.MAX_BYTE_COUNT)
    if total is None or view.broken_shards or not view.headers:
        return
    infos = list(itertools.chain.from_iterable(header.tensors.values() for header in view.headers.values()))
    actual = sum(map(_END, infos)) - sum(map(_BEGIN, infos))
    if actual != total:
        report.add("index", "total_size_mismatch", f"metadata total_size is {total:,} but the shard headers hold {plural(actual, 'tensor byte')}", file=fmt.INDEX_FILE, key="metadata.total_size")
