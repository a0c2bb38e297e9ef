"""The deep scan (``validate --deep``): the ``values`` checks that need every tensor byte.

Reads each FP8 expert byte and each BF16 byte exactly once, in chunks of whole rows that never
straddle an expert, and reports per tensor, with counts and the first offending coordinates:

- ``values.fp8_out_of_range``: bytes whose four exponent bits are all ones
  (``byte & 0x78 == 0x78``): |x| > 240 or NaN, which Neuron's E4M3 cannot hold;
- ``values.non_finite``: BF16 values (attention, router, embeddings, norms, sinks, biases)
  whose eight exponent bits are all ones (``value & 0x7F80 == 0x7F80``): ±inf or NaN;
- ``values.nonzero_padding``: a non-zero value in the padding (rows/columns beyond H or I;
  in ``gate_up`` the padding of each half), in FP8 and BF16 tensors; scales are not checked
  here (a padded channel's scale must be > 0, and the preflight checks every scale);
- ``values.zero_expert`` (warning): an expert whose FP8 weight is all ±0, the sign of a
  broken conversion (the format does not forbid it, so it does not fail the checkpoint).

"Zero" means numerically zero: +0 and -0 (0x00, 0x80 in FP8; 0x0000, 0x8000 in BF16).

Speed: a chunk, half the L2 cache in size (``cache_chunk_bytes``), is read into one reused
buffer and tested with two max reductions over it while it is still in L2, viewed unsigned and
signed (``_flags``): they say exactly whether any value is out of range and whether any is
non-zero, with no per-value Python and no temporary array. Only a chunk
holding a bad value is looked at value by value, for the count and the first coordinates.
Shards are scanned in parallel threads (reading and numpy release the GIL); findings are
reported in the same order whatever the thread count.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

try:
    import numpy as np
except ImportError:  # the validator itself needs only the standard library
    np = None  # type: ignore[assignment]

from .. import format as fmt
from ..deps import missing
from ..errors import NotRegularFileError
from ..machine import cache_chunk_bytes, usable_cpus
from ..padding import Region, padding_region
from ..progress import Progress
from ..safeio.files import open_regular
from ..safeio.hashing import Cancelled, gather
from ..units import format_bytes, format_duration, plural
from .findings import PreflightReport, Severity

if TYPE_CHECKING:
    from .view import CheckpointView

__all__ = [
    "Region", "ScanStats", "ScanTarget", "TensorResult", "deep_scan", "scan_targets", "scan_tensor",
]

_EXPONENT_TOP = 0x78  # (byte & 0x7F) >= 0x78  <=>  exponent bits all ones
_BF16_EXPONENT_TOP = 0x7F80  # (value & 0x7FFF) >= 0x7F80  <=>  exponent bits all ones: ±inf, NaN



@dataclass(frozen=True)
class ScanTarget:
    """One tensor to scan, viewed as [experts, rows, cols] of ``itemsize``-byte elements."""

    key: str
    shard: str
    path: str
    offset: int
    shape: tuple[int, ...]
    experts: int
    rows: int
    cols: int
    itemsize: int
    fp8: bool
    padding: Region | None

    @property
    def nbytes(self) -> int:
        return self.experts * self.rows * self.cols * self.itemsize

    def coords(self, expert: int, row: int, col: int) -> list[int]:
        """Coordinates in the tensor's own shape (1-D and 2-D tensors drop the leading dims)."""
        return [expert, row, col][3 - len(self.shape):]


@dataclass
class TensorResult:
    """What the scan found in one tensor."""

    out_of_range: int = 0
    first_out_of_range: tuple[int, int, int, int] | None = None  # expert, row, col, byte
    nonzero_padding: int = 0
    first_padding: tuple[int, int, int] | None = None
    zero_experts: list[int] = field(default_factory=list)
    non_finite: int = 0
    first_non_finite: tuple[int, int, int, int] | None = None  # expert, row, col, value


@dataclass(frozen=True)
class ScanStats:
    tensors: int
    bytes_scanned: int
    elapsed_s: float
    workers: int = 1

    @property
    def rate_gb_s(self) -> float:
        return self.bytes_scanned / self.elapsed_s / 1e9 if self.elapsed_s > 0 else 0.0


def scan_targets(view: CheckpointView) -> list[ScanTarget]:
    """Every tensor the deep scan reads: the FP8 experts and every BF16 tensor (the F32
    scales are the preflight's: it reads and checks every one of them).

    Tensors whose dtype or shape is wrong, or whose shard is broken, are skipped: the
    preflight already reports them.
    """
    if view.layout is None:
        return []
    targets = []
    for key, spec in (view.expected() or {}).items():
        found = view.tensor(key)
        if found is None or spec.dtype == fmt.F32:
            continue
        shard, info = found
        if info.dtype != spec.dtype or info.shape != spec.shape:
            continue
        experts, rows, cols = (1, 1, *spec.shape)[-3:]
        header = view.headers[shard]
        targets.append(ScanTarget(
            key=key, shard=shard, path=header.path, offset=header.data_offset + info.begin, shape=spec.shape,
            experts=experts, rows=rows, cols=cols, itemsize=fmt.DTYPE_BITS[spec.dtype] // 8,
            fp8=spec.dtype == fmt.F8_E4M3, padding=padding_region(key, spec.shape, view.layout),
        ))
    return targets


def _rows_per_chunk(target: ScanTarget, chunk_bytes: int) -> int:
    """Whole rows of one expert that fit in ``chunk_bytes`` (at least one)."""
    return max(1, min(target.rows, chunk_bytes // max(target.cols * target.itemsize, 1)))


def _chunks(target: ScanTarget, chunk_bytes: int) -> Iterator[tuple[int, int, int]]:
    """(expert, first row, row count) blocks of at most ``chunk_bytes`` (at least one row)."""
    step = _rows_per_chunk(target, chunk_bytes)
    for expert in range(target.experts):
        for row in range(0, target.rows, step):
            yield expert, row, min(step, target.rows - row)


def _first_true(mask: np.ndarray) -> tuple[int, int]:
    flat = int(np.argmax(mask))
    return divmod(flat, mask.shape[1])


_top = np.maximum.reduce if np is not None else None  # the ufunc itself: less per-call work than .max()


def _flags(unsigned: np.ndarray, signed: np.ndarray) -> tuple[bool, bool]:
    """(some value is out of range, some value is non-zero) among the little-endian values of
    ``unsigned`` (uint8 or uint16) and ``signed`` (the same bytes as int8 or int16): exact,
    from two max reductions and no temporary.

    Viewed unsigned, the largest value is a negative one (sign bit set) when there is any;
    viewed signed, it is the largest positive one. A positive value is out of range when it is
    at least ``bad`` (FP8 0x78, BF16 0x7F80: exponent all ones), a negative one when it is at
    least ``sign | bad``; non-zero means at least 1, or ``sign | 1`` (-0 is zero).
    """
    if not unsigned.size:
        return False, False
    sign, bad = (0x80, _EXPONENT_TOP) if unsigned.itemsize == 1 else (0x8000, _BF16_EXPONENT_TOP)
    top_negative = int(_top(unsigned))
    top_positive = int(_top(signed))
    return (top_positive >= bad or top_negative >= sign | bad), (top_positive >= 1 or top_negative >= sign | 1)


def scan_tensor(target: ScanTarget, handle: Any, buffer: bytearray, *, chunk_bytes: int | None = None,
                progress: Any = None, cancel: threading.Event | None = None) -> TensorResult:
    """Scan one tensor from the open shard ``handle`` using ``buffer`` (≥ one chunk).

    The chunks of a tensor follow each other in the file: one seek per tensor, then one
    ``readinto`` and two reductions per chunk over arrays made once over ``buffer``.
    ``cancel``, when set, stops the scan at the next chunk with ``Cancelled``.
    """
    chunk_bytes = chunk_bytes or cache_chunk_bytes()
    result = TensorResult()
    row_bytes = target.cols * target.itemsize
    element, signed_element = (np.uint8, np.int8) if target.itemsize == 1 else (np.uint16, np.int16)
    mask, bad_from = (0x7F, _EXPONENT_TOP) if target.itemsize == 1 else (0x7FFF, _BF16_EXPONENT_TOP)
    whole = memoryview(buffer)
    unsigned = np.frombuffer(buffer, dtype=element, count=len(buffer) // target.itemsize)
    signed = unsigned.view(signed_element)
    blocks: dict[int, tuple[memoryview, np.ndarray, np.ndarray]] = {}  # row count -> its views, made once
    readinto = handle.readinto
    nonzero_in_expert = False
    handle.seek(target.offset)
    for expert, row, count in _chunks(target, chunk_bytes):
        if cancel is not None and cancel.is_set():
            raise Cancelled
        if row == 0:
            nonzero_in_expert = False
        block = blocks.get(count)
        if block is None:
            numel = count * target.cols
            block = blocks[count] = (whole[:count * row_bytes], unsigned[:numel], signed[:numel])
        data, chunk, signed_chunk = block
        size = len(data)
        if readinto(data) != size:
            raise EOFError(f"{target.shard} ended inside {target.key}")
        out_of_range, nonzero = _flags(chunk, signed_chunk)
        values = None
        if out_of_range:  # rare: count the bad values and find the first, value by value
            values = chunk.reshape(count, target.cols)
            bad = (values & mask) >= bad_from
            bad_count = int(np.count_nonzero(bad))
            r, c = _first_true(bad)
            if target.fp8:
                if result.first_out_of_range is None:
                    result.first_out_of_range = (expert, row + r, c, int(values[r, c]))
                result.out_of_range += bad_count
            else:
                if result.first_non_finite is None:
                    result.first_non_finite = (expert, row + r, c, int(values[r, c]))
                result.non_finite += bad_count
        if target.fp8:
            nonzero_in_expert = nonzero_in_expert or nonzero
            if row + count == target.rows and not nonzero_in_expert:
                result.zero_experts.append(expert)
        if target.padding is not None:
            if values is None:
                values = chunk.reshape(count, target.cols)
            _check_padding(target.padding, values, mask, expert, row, count, result)
        if progress is not None:
            progress(size)
    return result


def _check_padding(region: Region, values: np.ndarray, mask: int, expert: int, row: int, count: int,
                   result: TensorResult) -> None:
    """Count non-zero values of this block that fall in the padding region; the first one is
    the earliest in memory order (blocks are visited in order, so the first block with one).
    Only the padding parts are masked (sign bits cleared: -0 is zero), never the whole block."""
    split = min(max(region.row_start - row, 0), count)  # block rows [0, split) are real rows
    parts = [(values[:split, start:stop], 0, start) for start, stop in region.col_ranges] if split else []
    if split < count:
        parts.append((values[split:], split, 0))
    first: tuple[int, int] | None = None
    for part, row_base, col_base in parts:
        if not part.size:
            continue
        nonzero = (part & mask) != 0
        found = int(np.count_nonzero(nonzero))
        if found:
            r, c = _first_true(nonzero)
            first = min(first or (row_base + r, col_base + c), (row_base + r, col_base + c))
            result.nonzero_padding += found
    if first is not None and result.first_padding is None:
        result.first_padding = (expert, row + first[0], first[1])


# What scanning one shard gave, in order: a tensor's result, or why a tensor or the shard failed.
_Event = tuple[str, Any, Any]


def _scan_shard(targets: list[ScanTarget], chunk_bytes: int, progress: Callable[[int], None],
                cancel: threading.Event) -> list[_Event]:
    """Scan the ``targets`` of one shard (sorted by offset) with this thread's own buffers."""
    events: list[_Event] = []
    buffer = bytearray(max(t.cols * t.itemsize * _rows_per_chunk(t, chunk_bytes) for t in targets))
    try:
        with open_regular(targets[0].path, buffering=0) as handle:
            for target in targets:
                try:
                    result = scan_tensor(target, handle, buffer, chunk_bytes=chunk_bytes,
                                         progress=progress, cancel=cancel)
                except EOFError as exc:
                    events.append(("eof", target, exc))
                    continue
                events.append(("result", target, result))
    except NotRegularFileError as exc:  # replaced since its header was read: refused, never blocked on
        events.append(("not_a_file", None, exc))
    except OSError as exc:
        events.append(("unreadable", None, exc))
    return events


def deep_scan(view: CheckpointView, report: PreflightReport, *, chunk_bytes: int | None = None,
              show_progress: bool | None = None, workers: int | None = None) -> ScanStats:
    """Scan every FP8 expert byte and every BF16 byte of the checkpoint; add findings.

    ``chunk_bytes`` (default ``cache_chunk_bytes()``) is read at a time; the findings do not
    depend on it. Shards are scanned by ``workers`` threads (default: one per shard up to the CPU count);
    the findings and their order do not depend on it. Ctrl-C stops every thread at its next
    chunk. Raises ``MissingDependencyError`` when numpy is not installed.
    ``show_progress=None`` shows a bar on a terminal and a plain line every few seconds on a
    non-terminal stderr (``progress.Progress``); False shows nothing.
    """
    started = time.perf_counter()
    chunk_bytes = chunk_bytes or cache_chunk_bytes()
    if np is None:  # an environment problem, not a finding about the checkpoint
        raise missing("numpy", "the deep scan (validate --deep)")
    targets = scan_targets(view)
    if view.layout is None:
        report.add("values", "deep_scan_skipped",
                   "the deep scan did not run: the namespace could not be derived (see the config errors)",
                   severity=Severity.INFO)
    total = sum(t.nbytes for t in targets)
    by_shard = {shard: sorted((t for t in targets if t.shard == shard), key=lambda t: t.offset)
                for shard in sorted({t.shard for t in targets})}
    threads = max(1, min(len(by_shard), workers or usable_cpus()))
    bar = Progress(total, "deep scan", show=show_progress)
    cancel = threading.Event()
    try:
        if threads == 1:
            outcomes = {shard: _scan_shard(group, chunk_bytes, bar.update, cancel) for shard, group in by_shard.items()}
        else:
            outcomes = _in_threads(by_shard, threads, chunk_bytes, bar.update, cancel)
    finally:
        bar.close()
    scanned = 0
    for shard, events in outcomes.items():
        for kind, target, detail in events:
            if kind == "result":
                scanned += target.nbytes
                _report(report, target, detail)
            elif kind == "eof":
                report.add("header", "data_beyond_file", f"{detail} (the file shrank after its header was read)",
                           file=shard, key=target.key)
            elif kind == "not_a_file":
                report.add("filesystem", "not_a_file", f"{detail}: a shard must be a plain file (refused before it was opened for reading)", file=shard)
            else:
                report.add("filesystem", "unreadable", f"cannot read {shard}: {detail.strerror or detail}", file=shard)
    stats = ScanStats(len(targets), scanned, time.perf_counter() - started, threads)
    report.bytes_read += scanned
    if targets:
        report.add("values", "deep_scan_done",
                   f"deep scan read {plural(stats.tensors, 'tensor')} ({format_bytes(stats.bytes_scanned)}) in "
                   f"{format_duration(stats.elapsed_s)} ({stats.rate_gb_s:.2f} GB/s)", severity=Severity.INFO)
    return stats


def _in_threads(by_shard: dict[str, list[ScanTarget]], threads: int, chunk_bytes: int,
                progress: Callable[[int], None], cancel: threading.Event) -> dict[str, list[_Event]]:
    """``_scan_shard`` for every shard in ``threads`` threads, the largest first; the results in
    ``by_shard``'s order.
    Ctrl-C sets ``cancel`` and every worker stops at its next chunk (``hashing.gather``)."""
    largest_first = sorted(by_shard, key=lambda shard: -sum(t.nbytes for t in by_shard[shard]))  # even finish
    with ThreadPoolExecutor(max_workers=threads, thread_name_prefix="deep-scan") as pool:
        futures = {shard: pool.submit(_scan_shard, by_shard[shard], chunk_bytes, progress, cancel)
                   for shard in largest_first}
        outcomes = gather(futures, cancel)
    return {shard: outcomes[shard] for shard in by_shard}


def _report(report: PreflightReport, target: ScanTarget, result: TensorResult) -> None:
    """Each value finding of one tensor, added to ``report`` against its shard and key."""
    for reason, message, severity in _value_findings(target, result):
        report.add("values", reason, message, file=target.shard, key=target.key, severity=severity)


def _value_findings(target: ScanTarget, result: TensorResult) -> Iterator[tuple[str, str, Severity]]:
    """(reason, message, severity) of each kind of bad value the scan counted in one tensor."""
    if result.out_of_range and result.first_out_of_range is not None:
        expert, row, col, byte = result.first_out_of_range
        yield ("fp8_out_of_range",
               f"{target.key} has {plural(result.out_of_range, 'FP8 value')} with all exponent bits set (|x| > "
               f"{fmt.FP8_MAX:g} or NaN), which Neuron's E4M3 cannot hold; first at "
               f"{target.coords(expert, row, col)} = 0x{byte:02X}: re-quantize within ±{fmt.FP8_MAX:g}", Severity.ERROR)
    if result.non_finite and result.first_non_finite is not None:
        expert, row, col, value = result.first_non_finite
        yield ("non_finite",
               f"{target.key} has {plural(result.non_finite, 'non-finite BF16 value')} (±inf or NaN); first at "
               f"{target.coords(expert, row, col)} = 0x{value:04X}: the model would compute with them; "
               "convert again from a source whose values are all finite", Severity.ERROR)
    if result.nonzero_padding and result.first_padding is not None:
        yield ("nonzero_padding",
               f"{target.key} has {plural(result.nonzero_padding, 'non-zero value')} in its padding (rows/columns "
               f"beyond H or I); first at {target.coords(*result.first_padding)}: padding must be "
               "zero, re-convert the checkpoint", Severity.ERROR)
    if result.zero_experts:
        shown = ", ".join(map(str, result.zero_experts[:8])) + (" ..." if len(result.zero_experts) > 8 else "")
        verb = "is" if len(result.zero_experts) == 1 else "are"
        yield ("zero_expert",
               f"{target.key}: {len(result.zero_experts)} of {plural(target.experts, 'expert')} {verb} all zero (experts "
               f"{shown}): a sign of a broken conversion; compare with the source checkpoint", Severity.WARNING)
