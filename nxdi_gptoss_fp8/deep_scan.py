"""The deep scan (``validate --deep``): the ``values`` checks that need every FP8 byte.

Reads each FP8 expert byte exactly once, in chunks of whole rows that never straddle an
expert, and reports per tensor, with counts and the first offending coordinates:

- ``values.fp8_out_of_range``: bytes whose four exponent bits are all ones
  (``byte & 0x78 == 0x78``): |x| > 240 or NaN, which Neuron's E4M3 cannot hold;
- ``values.nonzero_padding``: a non-zero value in the padding (rows/columns beyond H or I;
  in ``gate_up`` the padding of each half). When the checkpoint is padded, the BF16 tensors'
  padding is checked too (their whole bytes are read then); scales are not: a padded channel's
  scale must be > 0;
- ``values.zero_expert`` (warning): an expert whose FP8 weight is all ±0, the sign of a
  broken conversion (the format does not forbid it, so it does not fail the checkpoint).

"Zero" means numerically zero: +0 and -0 (0x00, 0x80 in FP8; 0x0000, 0x8000 in BF16). The
per-chunk work is a few numpy passes over a reused buffer (several GB/s); reading dominates.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

try:
    import numpy as np
except ImportError:  # the validator itself needs only the standard library
    np = None  # type: ignore[assignment]

from . import format as fmt
from .deps import missing
from .errors import NotRegularFileError
from .files import open_regular
from .findings import PreflightReport, Severity
from .progress import Progress
from .units import format_bytes, format_duration, plural

if TYPE_CHECKING:
    from .checks import CheckpointView

CHUNK_BYTES = 32 << 20
_EXPONENT_TOP = 0x78  # (byte & 0x7F) >= 0x78  <=>  exponent bits all ones


# Tensors whose last dimension is H' (padded at its end); the others are listed in padding_region.
_HIDDEN_LAST = (
    "embed_tokens.weight", "lm_head.weight", "norm.weight", "input_layernorm.weight",
    "post_attention_layernorm.weight", "q_proj.weight", "k_proj.weight", "v_proj.weight",
    "o_proj.bias", "router.linear_router.weight", f"{fmt.DOWN}.bias",
)


@dataclass(frozen=True)
class Region:
    """Padding of one expert's [rows, cols] matrix: rows [row_start, rows) are padding, and
    in the rows before it the listed column ranges are."""

    row_start: int
    col_ranges: tuple[tuple[int, int], ...]


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


@dataclass(frozen=True)
class ScanStats:
    tensors: int
    bytes_scanned: int
    elapsed_s: float

    @property
    def rate_gb_s(self) -> float:
        return self.bytes_scanned / self.elapsed_s / 1e9 if self.elapsed_s > 0 else 0.0


def padding_region(name: str, shape: tuple[int, ...], layout: fmt.Layout) -> Region | None:
    """The padding of tensor ``name`` as a ``Region`` of its [rows, cols] view, or None."""
    h, i = layout.dims.hidden_size, layout.dims.intermediate_size
    hp, ip = layout.padded_hidden_size, layout.padded_intermediate_size
    if (h, i) == (hp, ip) or name.endswith(".scale"):
        return None
    rows = shape[-2] if len(shape) >= 2 else 1
    if name.endswith((f"{fmt.GATE_UP}.weight", f"{fmt.GATE_UP}.bias")):
        row_start = h if name.endswith(".weight") else rows
        return Region(row_start, ((i, ip), (ip + i, 2 * ip)) if ip > i else ())
    if name.endswith(f"{fmt.DOWN}.weight"):
        return Region(i, ((h, hp),) if hp > h else ())
    if name.endswith("self_attn.o_proj.weight"):
        return Region(h, ())
    if name.endswith(_HIDDEN_LAST) and hp > h:
        return Region(rows, ((h, hp),))
    return None


def scan_targets(view: CheckpointView) -> list[ScanTarget]:
    """Every tensor the deep scan reads: the FP8 experts, and padded BF16 tensors.

    Tensors whose dtype or shape is wrong, or whose shard is broken, are skipped: the
    preflight already reports them.
    """
    if view.layout is None:
        return []
    targets = []
    for key, spec in fmt.expected_namespace(view.layout).items():
        found = view.tensor(key)
        if found is None or spec.dtype == fmt.F32:
            continue
        shard, info = found
        if info.dtype != spec.dtype or info.shape != spec.shape:
            continue
        fp8 = spec.dtype == fmt.F8_E4M3
        region = padding_region(key, spec.shape, view.layout)
        if not fp8 and region is None:
            continue
        experts, rows, cols = (1, 1, *spec.shape)[-3:]
        header = view.headers[shard]
        targets.append(ScanTarget(
            key=key, shard=shard, path=header.path, offset=header.data_offset + info.begin, shape=spec.shape,
            experts=experts, rows=rows, cols=cols, itemsize=fmt.DTYPE_BITS[spec.dtype] // 8,
            fp8=fp8, padding=region,
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


def scan_tensor(target: ScanTarget, handle: Any, buffer: bytearray, *, chunk_bytes: int = CHUNK_BYTES,
                progress: Any = None) -> TensorResult:
    """Scan one tensor from the open shard ``handle`` using ``buffer`` (≥ one chunk)."""
    result = TensorResult()
    row_bytes = target.cols * target.itemsize
    element = np.uint8 if target.itemsize == 1 else np.uint16
    magnitude_mask = 0x7F if target.itemsize == 1 else 0x7FFF
    nonzero_in_expert = False
    for expert, row, count in _chunks(target, chunk_bytes):
        if row == 0:
            nonzero_in_expert = False
        size = count * row_bytes
        handle.seek(target.offset + (expert * target.rows + row) * row_bytes)
        view = memoryview(buffer)[:size]
        got = handle.readinto(view)
        if got != size:
            raise EOFError(f"{target.shard} ended inside {target.key}")
        values = np.frombuffer(buffer, dtype=element, count=size // target.itemsize).reshape(count, target.cols)
        magnitude = values & magnitude_mask
        if target.fp8:
            bad = magnitude >= _EXPONENT_TOP
            bad_count = int(np.count_nonzero(bad))
            if bad_count:
                if result.first_out_of_range is None:
                    r, c = _first_true(bad)
                    result.first_out_of_range = (expert, row + r, c, int(values[r, c]))
                result.out_of_range += bad_count
            nonzero_in_expert = nonzero_in_expert or bool(magnitude.any())
            if row + count == target.rows and not nonzero_in_expert:
                result.zero_experts.append(expert)
        if target.padding is not None:
            _check_padding(target.padding, magnitude, expert, row, count, result)
        if progress is not None:
            progress(size)
    return result


def _check_padding(region: Region, magnitude: np.ndarray, expert: int, row: int, count: int,
                   result: TensorResult) -> None:
    """Count non-zero values of this block that fall in the padding region; the first one is
    the earliest in memory order (blocks are visited in order, so the first block with one)."""
    split = min(max(region.row_start - row, 0), count)  # block rows [0, split) are real rows
    parts = [(magnitude[:split, start:stop], 0, start) for start, stop in region.col_ranges] if split else []
    if split < count:
        parts.append((magnitude[split:], split, 0))
    first: tuple[int, int] | None = None
    for part, row_base, col_base in parts:
        if not part.size:
            continue
        nonzero = part != 0
        found = int(np.count_nonzero(nonzero))
        if found:
            r, c = _first_true(nonzero)
            first = min(first or (row_base + r, col_base + c), (row_base + r, col_base + c))
            result.nonzero_padding += found
    if first is not None and result.first_padding is None:
        result.first_padding = (expert, row + first[0], first[1])


def deep_scan(view: CheckpointView, report: PreflightReport, *, chunk_bytes: int = CHUNK_BYTES,
              show_progress: bool | None = None) -> ScanStats:
    """Scan every FP8 expert byte (and padded BF16 tensors) of the checkpoint; add findings.

    Raises ``MissingDependencyError`` when numpy is not installed. ``show_progress=None`` shows a bar on a terminal and a plain line every few seconds on a
    non-terminal stderr (``progress.Progress``); False shows nothing.
    """
    started = time.perf_counter()
    if np is None:  # an environment problem, not a finding about the checkpoint
        raise missing("numpy", "the deep scan (validate --deep)")
    targets = scan_targets(view)
    if view.layout is None:
        report.add("values", "deep_scan_skipped",
                   "the deep scan did not run: the namespace could not be derived (see the config errors)",
                   severity=Severity.INFO)
    total = sum(t.nbytes for t in targets)
    bar = Progress(total, "deep scan", show=show_progress)
    buffer = bytearray(max((t.cols * t.itemsize * _rows_per_chunk(t, chunk_bytes) for t in targets), default=0))
    scanned = 0
    try:
        for shard in sorted({t.shard for t in targets}):
            shard_targets = sorted((t for t in targets if t.shard == shard), key=lambda t: t.offset)
            try:
                with open_regular(shard_targets[0].path, buffering=0) as handle:
                    for target in shard_targets:
                        try:
                            result = scan_tensor(target, handle, buffer, chunk_bytes=chunk_bytes,
                                                 progress=bar.update)
                        except EOFError as exc:
                            report.add("header", "data_beyond_file", f"{exc} (the file shrank after its header was read)",
                                       file=shard, key=target.key)
                            continue
                        scanned += target.nbytes
                        _report(report, target, result)
            except NotRegularFileError as exc:  # replaced since its header was read: refused, never blocked on
                report.add("filesystem", "not_a_file", f"{exc}: a shard must be a plain file (refused before it was opened for reading)", file=shard)
            except OSError as exc:
                report.add("filesystem", "unreadable", f"cannot read {shard}: {exc.strerror or exc}", file=shard)
    finally:
        bar.close()
    stats = ScanStats(len(targets), scanned, time.perf_counter() - started)
    report.bytes_read += scanned
    if targets:
        report.add("values", "deep_scan_done",
                   f"deep scan read {plural(stats.tensors, 'tensor')} ({format_bytes(stats.bytes_scanned)}) in "
                   f"{format_duration(stats.elapsed_s)} ({stats.rate_gb_s:.2f} GB/s)", severity=Severity.INFO)
    return stats


def _report(report: PreflightReport, target: ScanTarget, result: TensorResult) -> None:
    if result.out_of_range and result.first_out_of_range is not None:
        expert, row, col, byte = result.first_out_of_range
        report.add(
            "values", "fp8_out_of_range",
            f"{target.key} has {result.out_of_range} FP8 values with all exponent bits set (|x| > "
            f"{fmt.FP8_MAX:g} or NaN), which Neuron's E4M3 cannot hold; first at "
            f"{target.coords(expert, row, col)} = 0x{byte:02X}: re-quantize within ±{fmt.FP8_MAX:g}",
            file=target.shard, key=target.key,
        )
    if result.nonzero_padding and result.first_padding is not None:
        report.add(
            "values", "nonzero_padding",
            f"{target.key} has {result.nonzero_padding} non-zero values in its padding (rows/columns "
            f"beyond H or I); first at {target.coords(*result.first_padding)}: padding must be "
            "zero, re-convert the checkpoint",
            file=target.shard, key=target.key,
        )
    if result.zero_experts:
        shown = ", ".join(map(str, result.zero_experts[:8])) + (" ..." if len(result.zero_experts) > 8 else "")
        report.add(
            "values", "zero_expert",
            f"{target.key}: {len(result.zero_experts)} of {target.experts} experts are all zero (experts "
            f"{shown}): a sign of a broken conversion; compare with the source checkpoint",
            file=target.shard, key=target.key, severity=Severity.WARNING,
        )
