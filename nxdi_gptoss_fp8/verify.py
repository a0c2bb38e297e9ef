"""Verify a converted checkpoint against its source, value by value.

Re-reads both sides one tensor (one expert per lane, two lanes) at a time. Every non-expert
tensor must equal the source, renamed, cast to BF16 and zero-padded, bit for bit. Every FP8
expert is dequantized (``fp8 × scale``) and compared with the source as its kind's
``reference_rows`` decodes it, independently of the converter (MXFP4 through a value table and
a power of two; compressed-tensors as their FP8 × their scale; BF16 as is), the stored expert
brought back to the source's row layout by the verifier's own transposes; padding must be zero.
With ``y = source / scale``:

* wherever ``y`` is an E4M3 value within ±240 the result must be exact;
* elsewhere ``|dequantized − source| ≤ max(2^-4·|source|, 2^-10·scale) · (1 + 2^-16)``:
  half an E4M3 step (3 mantissa bits; 2^-10 is half the subnormal step 2^-9), with room for
  one float32 rounding of ``y``;
* every stored FP8 value lies within ±240 (no NaN, no exponent-all-ones byte).

This is what catches a swapped gate/up interleave, a missing transpose, a swapped nibble order
or an exponent bias off by one. Requires torch and safetensors.
"""

from __future__ import annotations

import errno
import logging
import os
import threading
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from typing import Any

import torch

from . import format as fmt
from .convert import (
    SOURCE_BF16,
    SOURCE_COMPRESSED_TENSORS,
    Source,
    SourceKind,
    SourceReader,
    non_expert_names,
    open_source,
    source_kind,
)
from .convert.fp8 import FP8_DTYPE, fp8_values
from .convert.kinds.base import ExpertRows
from .convert.output import single_threaded_torch
from .convert.source import FINGERPRINT_FIELDS, FINGERPRINT_PARTS, read_json
from .convert.workers import LayerPool, peak_rss, plan_workers, refuse_in_worker_start
from .errors import ConversionError
from .hub import is_repo_id
from .progress import Progress
from .validate.pipeline import preflight

__all__ = [
    "BOUND_TEXT", "LANES", "MAX_PROBLEMS", "RELATIVE_STEP", "SLACK", "SUBNORMAL_STEP", "ExpertResult", "LayerRow",
    "LayerVerdict", "VerificationReport", "compare_expert", "logger", "recorded_source", "source_mismatch_hint",
    "swapped_arguments_hint", "verify_conversion", "verify_layer",
]

BOUND_TEXT = (
    "exact wherever source/scale is an E4M3 value within ±240; otherwise "
    "|fp8·scale − source| ≤ max(2^-4·|source|, 2^-10·scale)·(1 + 2^-16)"
)
RELATIVE_STEP = 2.0**-4
SUBNORMAL_STEP = 2.0**-10
SLACK = 1.0 + 2.0**-16
MAX_PROBLEMS = 20
LANES = 2
logger = logging.getLogger(__name__)
_CHUNK_VALUES = 1 << 17  # values compared at a time: the pieces stay in cache
_TILE_ROWS = 128  # rows compared at a time are a multiple of this (the transpose back is cheaper in wide blocks)


@dataclass
class LayerRow:
    """One line of the per-layer table."""

    layer: str
    tensors: int = 0
    tensor_mismatches: int = 0
    values: int = 0
    exact: int = 0
    inexact: int = 0
    violations: int = 0
    max_rel_error: float = 0.0  # among the inexact values stored non-zero
    flushed: int = 0  # inexact values stored as 0 (their relative error is 1 by definition)


@dataclass
class VerificationReport:
    """The verdict of ``verify_conversion``: a row per layer and the first problems found."""

    out: str
    source: str
    source_format: str = ""
    rows: list[LayerRow] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)
    bound: str = BOUND_TEXT
    problem_count: int = 0

    @property
    def violations(self) -> int:
        return sum(row.violations + row.tensor_mismatches for row in self.rows) + self.problem_count

    @property
    def ok(self) -> bool:
        return self.violations == 0

    def note(self, message: str, *, counts: bool = True) -> None:
        """Record a problem (the first ``MAX_PROBLEMS`` messages are kept)."""
        if counts:
            self.problem_count += 1
        if len(self.problems) < MAX_PROBLEMS:
            self.problems.append(message)

    def to_dict(self) -> dict[str, Any]:
        document = asdict(self)
        document.update(ok=self.ok, violations=self.violations)
        return document

    def render_text(self) -> str:
        header = (f"{'layer':>6} {'tensors':>8} {'mismatch':>8} {'fp8 values':>12} {'exact':>12} {'inexact':>9} "
                  f"{'flushed':>8} {'violations':>10} {'max rel err':>11}")
        lines = [f"verify {self.out} against {self.source} ({self.source_format or 'unknown'})", header]
        for row in self.rows:
            lines.append(
                f"{row.layer:>6} {row.tensors:>8} {row.tensor_mismatches:>8} {row.values:>12} {row.exact:>12} "
                f"{row.inexact:>9} {row.flushed:>8} {row.violations:>10} {row.max_rel_error:>11.3g}"
            )
        lines.append(f"bound: {self.bound}")
        if any(row.flushed for row in self.rows):
            lines.append("flushed: inexact source values stored as 0 (too small for E4M3 at their channel's scale); "
                         "max rel err is over the other inexact values")
        lines += [f"  problem: {message}" for message in self.problems]
        hidden = self.violations - len(self.problems)
        if not self.ok and hidden > 0:
            lines.append(f"  … and {hidden} more violating values or tensors")
        lines.append("OK: every value within its bound" if self.ok else f"FAILED: {self.violations} violations")
        return "\n".join(lines)


# --------------------------------------------------------------------------- experts


@dataclass
class ExpertResult:
    """The verdict on one expert projection (merged into its layer's row)."""

    values: int = 0
    exact: int = 0
    inexact: int = 0
    violations: int = 0
    max_rel_error: float = 0.0
    flushed: int = 0
    problem: str | None = None


def _segments(want: ExpertRows, stored: torch.Tensor, scale: torch.Tensor, proj: str, padded_i: int
              ) -> tuple[list[tuple[int, int, torch.Tensor, torch.Tensor, int]], list[torch.Tensor]]:
    """Pair the source rows with the stored expert [in', out'] (bytes): (first source row, row
    step, the stored columns they became — as a transposed view, brought back a block of rows
    at a time by the comparison, their scales, the output column of the first) per segment,
    and the padding regions (which must hold zeros). gate_up rows are interleaved: even rows
    (gate) are columns 0…, odd rows (up) columns I'…"""
    rows, cols = want.shape
    if proj == fmt.GATE_UP:
        half = rows // 2
        segments = [(0, 2, stored[:cols, :half].t(), scale[:half], 0),
                    (1, 2, stored[:cols, padded_i:padded_i + half].t(), scale[padded_i:padded_i + half], padded_i)]
        padding = [stored[cols:], stored[:cols, half:padded_i], stored[:cols, padded_i + half:]]
    else:
        segments = [(0, 1, stored[:cols, :rows].t(), scale[:rows], 0)]
        padding = [stored[cols:], stored[:cols, rows:]]
    return segments, padding


def _products_exact(scale: torch.Tensor) -> torch.Tensor:
    """bool per row: an E4M3 value (≤ 4 significant bits) times this float32 scale is exact in
    float32 (the scale has ≤ 20 significant bits and leaves room below and above)."""
    magnitude = scale.abs()
    return (torch.isfinite(scale) & (magnitude >= 2.0**-100) & (magnitude <= 2.0**100)
            & ((scale.view(torch.int32) & 0xF) == 0))


def _judge(want: torch.Tensor, stored: torch.Tensor, scale: torch.Tensor
           ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """float64 verdicts for values ``want`` (source), ``stored`` (FP8 as float32) and their
    per-value ``scale``: (exact, bad, error)."""
    want, scale64 = want.double(), scale.double()
    got = stored.double() * scale64
    y = want / scale64
    representable = (y.float().clamp(-fmt.FP8_MAX, fmt.FP8_MAX).to(FP8_DTYPE).double() == y) & (y * scale64 == want)
    error = (got - want).abs()
    bound = torch.maximum(RELATIVE_STEP * want.abs(), SUBNORMAL_STEP * scale64) * SLACK
    in_range = stored.abs() <= fmt.FP8_MAX  # False for NaN too
    exact = error == 0
    bad = ~in_range | (representable & ~exact) | ~(error <= bound)
    return exact, bad, error


def _nonzero(mask: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``mask.nonzero(as_tuple=True)`` for a contiguous 2-D bool ``mask``, in the same order;
    three times as fast when few are set: the mask read as 64-bit words first, then only the
    bytes of the words that hold any (``nonzero`` of a whole block costs more than the
    comparisons that made it)."""
    cols = mask.shape[1]
    if mask.numel() % 8 or mask.storage_offset() % 8 or not mask.is_contiguous():
        return mask.nonzero(as_tuple=True)
    hit = mask.view(-1).view(torch.int64).nonzero().view(-1)
    if hit.numel() * 8 > mask.numel() // 8:  # dense: the plain pass is cheaper
        return mask.nonzero(as_tuple=True)
    within = mask.view(-1, 8)[hit].nonzero()
    flat = hit[within[:, 0]] * 8 + within[:, 1]
    return flat // cols, flat % cols


def _no_screen(*_: object) -> None:
    """Sources whose values float32 cannot hold go through ``_judge`` alone."""
    return None


class _Screen:
    """For rows of requantized values (any float32 scale), the values float32 alone proves
    inexact and within the bound — what ``_judge`` would say of them, without its float64 passes
    — through buffers of ``rows`` × ``cols`` allocated once per expert (fresh ones would cost
    page faults on every block).

    With ``g = fl(fp8 × scale)`` and ``e = fl(|g − w|)`` a value is proven when ``e > 0`` (then the
    float64 product is not ``w`` either: inexact), ``e ≤ max(2^-4·|w|, 2^-10·scale)`` (the true
    error then exceeds ``e`` by at most 2^-19 of the bound, within its 2^-16 slack), and
    ``fl(w / scale)`` has a non-zero bit among its low 20 mantissa bits (an E4M3 value has at most
    4 significant bits and would divide exactly: not representable, so inexact is allowed).
    Scales must lie in [2^-100, 2^100], so that none of these float32 results is subnormal."""

    def __init__(self, rows: int, cols: int) -> None:
        self.error, self.size, self.bound, self.ratio = (torch.empty((rows, cols), dtype=torch.float32)
                                                         for _ in range(4))
        self.proven, self.other = (torch.empty((rows, cols), dtype=torch.bool) for _ in range(2))
        self.index = torch.empty(rows * cols // 2 + 1, dtype=torch.int32)

    def __call__(self, q: torch.Tensor, scale: torch.Tensor, want: torch.Tensor, floor: float = 0.0
                 ) -> tuple[int, float, int, torch.Tensor, torch.Tensor] | None:
        """(how many values are proven, the worst relative error of those stored non-zero exactly
        as ``_judge`` computes it — or 0.0 when it cannot exceed ``floor`` —, how many of them are
        stored as 0 (flushed: counted apart, as ``_judge`` does), the rows and columns of every
        other value, for ``_judge``); None when a scale is out of range."""
        magnitude = scale.abs()
        if not bool(((magnitude >= 2.0**-100) & (magnitude <= 2.0**100)).all()):
            return None
        n, cols = q.shape
        s = scale.unsqueeze(1)
        error, size, bound, ratio = self.error[:n], self.size[:n], self.bound[:n], self.ratio[:n]
        proven, other = self.proven[:n], self.other[:n]
        values = fp8_values(q, out=error, index=self.index[: n * cols // 2]) if q.numel() % 2 == 0 else \
            error.copy_(fp8_values(q))
        error = values.mul_(s).sub_(want).abs_()
        torch.abs(want, out=size)
        torch.maximum(torch.mul(size, RELATIVE_STEP, out=bound), s * SUBNORMAL_STEP, out=bound)
        torch.le(error, bound, out=proven)
        proven.bitwise_and_(torch.gt(error, 0, out=other))
        mantissa = torch.div(want, s, out=ratio).view(torch.int32).bitwise_and_(0xFFFFF)
        proven.bitwise_and_(torch.ne(mantissa, 0, out=other))
        count = int(proven.sum())
        torch.logical_not(proven, out=other)
        rel_max, flushed = 0.0, 0
        if count:
            rel = error.div_(size).masked_fill_(other, 0.0)  # float32 relative errors of the proven values
            top = float(rel.amax())
            if top >= 1.0:  # a value stored as 0 has relative error exactly 1: flushed, left out of the maximum
                stored_zero = torch.eq(q & 0x7F, 0, out=other).logical_and_(proven)
                flushed = int(stored_zero.sum())
                rel.masked_fill_(stored_zero, 0.0)
                top = float(rel.amax())
            # float32 rounding moves a relative error r by at most 2^-24·(1 + 3r): the float64
            # maximum is among the values within ``slack`` of the float32 one (skipped when even
            # those cannot beat ``floor``, the largest already found)
            slack = 2.0**-21 * (1 + 4 * top)
            if top > 0.0 and top + slack >= floor:
                rows, columns = _nonzero(torch.ge(rel, top - slack, out=other))
                wanted = want[rows, columns].double()
                exact_error = (fp8_values(q[rows, columns].contiguous()).double() * scale[rows].double()
                               - wanted).abs()
                rel_max = float((exact_error / wanted.abs()).max())
        torch.logical_not(proven, out=other)
        where_rows, where_cols = _nonzero(other)
        return count, rel_max, flushed, where_rows, where_cols


def _byte_mismatches(q: torch.Tensor, scale: torch.Tensor, source_q: torch.Tensor, source_scale: torch.Tensor
                     ) -> tuple[torch.Tensor, torch.Tensor] | None:
    """Stored E4M3 bytes ``q`` [rows, cols] with float32 ``scale`` [rows] against a source that is
    itself E4M3 bytes × a float32 per-row scale: where the stored scale is the source's or twice
    it, ``q × scale == source`` exactly iff ``q`` (or ``q`` doubled) is the source byte. Doubling
    a byte adds min(magnitude, 8): the exponent field + 1 for normal values (magnitude ≥ 8), the
    magnitude twice for subnormal ones (value m · 2^-9). Returns the rows (indices) holding any
    other byte and the bytes' differences (zero where equal), or None when a scale is neither."""
    same, twice = scale == source_scale, scale == source_scale * 2
    if not bool((same | twice).all()):
        return None
    step = (q & 0x7F).clamp_(max=0x08)
    if not bool(twice.all()):
        step.mul_(twice.to(torch.uint8).unsqueeze(1))
    differ = step.add_(q).bitwise_xor_(source_q)
    return differ.amax(dim=1).nonzero().reshape(-1), differ


def compare_expert(want: ExpertRows, stored: torch.Tensor, scale: torch.Tensor, proj: str,
                   padded_i: int, where: str) -> ExpertResult:
    """Check one expert: ``want`` the source's rows [rows, cols] (decoded a block at a time),
    ``stored`` the output's FP8 [in', out'], ``scale`` its float32 [out'].

    Rows whose scale makes every product exact in float32 are compared in float32 — equal
    means exact — and only the unequal values go through the float64 bound; other rows
    (requantized sources) are judged in float64 throughout.
    """
    segments, padding = _segments(want, stored.view(torch.uint8), scale, proj, padded_i)
    result = ExpertResult()
    first: str | None = None
    for region in padding:
        nonzero = int(((region & 0x7F) != 0).sum())
        result.values += region.numel()
        result.exact += region.numel() - nonzero
        result.violations += nonzero
        if nonzero and first is None:
            first = f"{where}: padding holds non-zero values"
    cols = want.shape[1]
    step = _TILE_ROWS * max(1, _CHUNK_VALUES // (_TILE_ROWS * cols))
    # one block of rows transposed back, reused: first its stored columns copied out whole (short
    # contiguous runs), then transposed within the cache (a strided read across the whole expert
    # would cost a TLB miss per byte)
    columns, block = torch.empty((cols, step), dtype=torch.uint8), torch.empty((step, cols), dtype=torch.uint8)
    screen = _Screen(step, cols) if want.dtype == torch.float32 else _no_screen
    for offset, stride, back, scales, column in segments:
        rows = back.shape[0]
        fast = _products_exact(scales) & (want.dtype == torch.float32)
        # exponent field all ones (beyond ±240, or NaN) ⟺ the byte | 0x87 is 0xFF (integer ops: a
        # comparison to bool costs about ten times as much)
        in_range = int((back.t() | 0x87).amax()) != 0xFF if back.numel() else True  # read as stored: rows
        try_equal = True  # one pass that stops early; dropped after a chunk with mismatches
        for start in range(0, rows, step):
            stop = min(rows, start + step)
            stored_columns = columns[:, :stop - start]
            stored_columns.copy_(back[start:stop].t())
            q, s = block[:stop - start].copy_(stored_columns.t()), scales[start:stop]
            result.values += q.numel()
            subset = None
            if in_range and bool(fast[start:stop].all()):
                source = want.fp8_rows(offset + start * stride, offset + stop * stride, stride)
                compared = None if source is None else _byte_mismatches(q, s, *source)
                if compared is not None:
                    subset, differ = compared
                    if not subset.numel():
                        result.exact += q.numel()
                        continue
            wanted = want.rows(offset + start * stride, offset + stop * stride, stride, subset)
            if subset is not None:  # only the differing bytes of the differing rows are judged in float
                result.exact += (q.shape[0] - subset.numel()) * cols
                q, s = q[subset], s[subset]
                where_rows, where_cols = differ[subset].nonzero(as_tuple=True)
                result.exact += q.numel() - where_rows.numel()
                values = fp8_values(q[where_rows, where_cols].contiguous())
                wanted_values = wanted[where_rows, where_cols]
                exact, bad, error = _judge(wanted_values, values, s[where_rows])
            elif bool(fast[start:stop].all()):
                values = fp8_values(q)
                values.mul_(s.unsqueeze(1))
                if in_range and try_equal and torch.equal(values, wanted):
                    result.exact += q.numel()
                    continue
                suspect = values != wanted
                if not in_range:
                    suspect |= (q & 0x78) == 0x78
                where_rows, where_cols = suspect.nonzero(as_tuple=True)
                result.exact += q.numel() - where_rows.numel()
                try_equal = not where_rows.numel()
                if try_equal:
                    continue
                values = fp8_values(q[where_rows, where_cols].contiguous())
                wanted_values = wanted[where_rows, where_cols]
                exact, bad, error = _judge(wanted_values, values, s[where_rows])
            elif in_range and (screened := screen(q, s, wanted, result.max_rel_error)) is not None:
                inexact, rel_max, flushed_proven, where_rows, where_cols = screened
                result.inexact += inexact
                result.flushed += flushed_proven
                result.max_rel_error = max(result.max_rel_error, rel_max)
                if not where_rows.numel():
                    continue
                values = fp8_values(q[where_rows, where_cols].contiguous())
                wanted_values = wanted[where_rows, where_cols]
                exact, bad, error = _judge(wanted_values, values, s[where_rows])
            else:
                values = fp8_values(q)
                wanted_values = wanted.reshape(-1)
                exact, bad, error = _judge(wanted_values, values.reshape(-1),
                                           s.unsqueeze(1).expand_as(values).reshape(-1))
                where_rows = where_cols = None
            result.exact += int((exact & ~bad).sum())
            result.inexact += int((~exact & ~bad).sum())
            nonzero = wanted_values != 0
            flushed = nonzero & (values.reshape(-1) == 0) & ~bad
            result.flushed += int(flushed.sum())
            rounded = nonzero & ~flushed
            if bool(rounded.any()):
                rel = (error[rounded] / wanted_values.double().abs()[rounded]).max()
                result.max_rel_error = max(result.max_rel_error, float(rel))
            violations = int(bad.sum())
            if violations:
                result.violations += violations
                at = int(bad.nonzero()[0])
                r, c = (int(where_rows[at]), int(where_cols[at])) if where_rows is not None else divmod(at, cols)
                stored_value = float(fp8_values(q[r, c:c + 1].contiguous()))
                if first is None:
                    first = (f"{where}[{c}, {column + start + (r if subset is None else int(subset[r]))}]: stored {stored_value} × scale {float(s[r])} = "
                             f"{stored_value * float(s[r])}, source {float(wanted[r, c])}")
    if first is not None:
        result.problem = f"{first} ({result.violations} values of this expert violate)"
    return result


def _compare_tensor(expected: torch.Tensor, got: torch.Tensor, row: LayerRow, report: VerificationReport,
                    name: str, offset: int = 0) -> bool:
    if offset == 0:
        row.tensors += 1
    if got.shape == expected.shape and torch.equal(got.view(torch.int16), expected.view(torch.int16)):
        return True
    if got.shape != expected.shape:
        report.note(f"{name}: stored shape {list(got.shape)}, expected {list(expected.shape)}", counts=False)
    else:
        index = int((got.view(torch.int16) != expected.view(torch.int16)).reshape(-1).nonzero()[0])
        report.note(f"{name}: element {offset + index} is {float(got.reshape(-1)[index])}, expected "
                    f"{float(expected.reshape(-1)[index])} (not bit-exact)", counts=False)
    return False


def _check_non_expert(src: SourceReader, out: SourceReader, hf_name: str, name: str, shape: tuple[int, ...],
                      row: LayerRow, report: VerificationReport) -> None:
    source_shape = src.source.tensors[hf_name][1].shape
    if len(shape) == 1:
        expected = torch.zeros(shape, dtype=torch.bfloat16)
        expected[: source_shape[0]] = src.get(hf_name).to(torch.bfloat16)
        if not _compare_tensor(expected, out.get(name), row, report, name):
            row.tensor_mismatches += 1
        return
    rows, cols = shape
    step = max(1, (16 << 20) // (2 * cols))
    for start in range(0, rows, step):
        stop = min(rows, start + step)
        expected = torch.zeros((stop - start, cols), dtype=torch.bfloat16)
        if start < source_shape[0]:
            part = src.slice(hf_name)[start:min(stop, source_shape[0])]
            expected[: part.shape[0], : part.shape[1]] = part
            del part
        same = _compare_tensor(expected, out.slice(name)[start:stop], row, report, name, offset=start * cols)
        src.release()  # keeps RSS flat on large tensors: see SourceReader.release
        out.release()
        if not same:
            row.tensor_mismatches += 1
            return


def _check_biases(kind: SourceKind, src: SourceReader, out: SourceReader, layer: int, layout: fmt.Layout,
                  row: LayerRow, report: VerificationReport) -> None:
    prefix = fmt.layer_prefix(layer)
    ip, hp = layout.padded_intermediate_size, layout.padded_hidden_size
    gate_up, down = kind.reference_biases(src, layer)
    expected = torch.zeros((gate_up.shape[0], 2 * ip), dtype=torch.bfloat16)
    half = gate_up.shape[1] // 2
    expected[:, :half] = gate_up[:, 0::2]
    expected[:, ip:ip + half] = gate_up[:, 1::2]
    if not _compare_tensor(expected, out.get(f"{prefix}{fmt.GATE_UP}.bias"), row, report, f"{prefix}{fmt.GATE_UP}.bias"):
        row.tensor_mismatches += 1
    expected = torch.zeros((down.shape[0], hp), dtype=torch.bfloat16)
    expected[:, : down.shape[1]] = down
    if not _compare_tensor(expected, out.get(f"{prefix}{fmt.DOWN}.bias"), row, report, f"{prefix}{fmt.DOWN}.bias"):
        row.tensor_mismatches += 1


def _output_source(out: str, report_view: Any) -> Source:
    tensors = {}
    for name in report_view.weight_map:
        shard, info = report_view.tensor(name)
        tensors[name] = (os.path.join(out, shard), info)
    return Source(root=out, kind="normalized", config=report_view.config, dims=report_view.dims, tensors=tensors)


def _add(row: LayerRow, result: ExpertResult, report: VerificationReport) -> None:
    row.values += result.values
    row.exact += result.exact
    row.inexact += result.inexact
    row.violations += result.violations
    row.max_rel_error = max(row.max_rel_error, result.max_rel_error)
    row.flushed += result.flushed
    if result.problem is not None:
        report.note(result.problem, counts=False)


class _LaneReaders:
    """A source and an output reader per worker thread (a reader's ``release`` must not close
    files another thread is reading); all closed together at the end."""

    def __init__(self, src: Source, out: Source) -> None:
        self.src, self.out = src, out
        self._local = threading.local()
        self._lock = threading.Lock()
        self._all: list[SourceReader] = []

    def get(self) -> tuple[SourceReader, SourceReader]:
        if not hasattr(self._local, "pair"):
            self._local.pair = (SourceReader(self.src), SourceReader(self.out))
            with self._lock:
                self._all.extend(self._local.pair)
        return self._local.pair

    def __enter__(self) -> _LaneReaders:
        return self

    def __exit__(self, *exc: object) -> None:
        for reader in self._all:
            reader.release()


def _verify_expert(kind: SourceKind, readers: _LaneReaders, layer: int, proj: str, expert: int, scale: torch.Tensor,
                   padded_i: int) -> ExpertResult:
    src, out = readers.get()
    name = f"{fmt.layer_prefix(layer)}{proj}.weight"
    try:
        want = kind.reference_rows(src, layer, proj, expert)
        stored = out.slice(name)[expert]
        return compare_expert(want, stored, scale, proj, padded_i, f"{name}[{expert}]")
    finally:
        src.release()  # keeps RSS flat: see SourceReader.release
        out.release()


def _check_experts(kind: SourceKind, readers: _LaneReaders, out: SourceReader, layer: int, proj: str,
                   layout: fmt.Layout, pool: ThreadPoolExecutor, row: LayerRow, report: VerificationReport,
                   progress: Progress | None = None, lanes: int = LANES) -> int:
    """Every expert of one projection, ``lanes`` at a time (one expert per lane in memory);
    returns the number of inexact values."""
    tick = progress.update if progress is not None else (lambda _count: None)
    name = f"{fmt.layer_prefix(layer)}{proj}"
    scales = out.get(f"{name}.scale").clone()
    tick(scales.numel() * 4)
    weight = out.source.tensors[f"{name}.weight"][1]
    per_expert = weight.nbytes // max(1, weight.shape[0])
    row.tensors += 2
    in_flight: list[Future[ExpertResult]] = []
    inexact = 0
    for expert in range(readers.src.dims.num_local_experts):
        if len(in_flight) == lanes:
            result = in_flight.pop(0).result()
            inexact += result.inexact
            _add(row, result, report)
            tick(per_expert)
        in_flight.append(pool.submit(_verify_expert, kind, readers, layer, proj, expert, scales[expert, 0],
                                     layout.padded_intermediate_size))
    for future in in_flight:
        result = future.result()
        inexact += result.inexact
        _add(row, result, report)
        tick(per_expert)
    return inexact


def _normalized_index(path: str) -> bool:
    """Whether ``path`` holds an index of the normalized format (a converted checkpoint)."""
    try:
        index = read_json(os.path.join(path, fmt.INDEX_FILE), fmt.INDEX_FILE)
    except ConversionError:
        return False
    metadata = index.get("metadata") if isinstance(index, dict) else None
    return isinstance(metadata, dict) and metadata.get("format") == fmt.FORMAT_NAME


def swapped_arguments_hint(out: str | os.PathLike[str], source: str | os.PathLike[str]) -> str | None:
    """A one-line hint when ``source`` is a converted checkpoint and ``out`` is not: the two
    arguments were given the other way round."""
    out, source = os.fspath(out), os.fspath(source)
    if os.path.isdir(source) and _normalized_index(source) and not _normalized_index(out):
        return (f"the arguments look swapped: {source} is a converted (normalized FP8) checkpoint and {out} is not; "
                f"run: nxdi-gptoss-fp8 verify-conversion {source} --source {out}")
    return None


def source_mismatch_hint(recorded: dict[str, Any], src: Source, given: str | None, *, out: str = "OUT",
                         option: str = "--source") -> str | None:
    """When OUT's recorded ``source`` (format, Hub repo, path) disagrees with the source given:
    one line naming what OUT (``out``) says it was converted from, and that ``option`` takes it."""
    said = []
    if isinstance(recorded.get("format"), str) and recorded["format"] != src.kind:
        said.append(f"format {recorded['format']} (this source is {src.kind})")
    repo = recorded.get("repo")
    if isinstance(repo, str) and given is not None and is_repo_id(given) and not os.path.lexists(given) and repo != given:
        said.append(f"Hub repo {repo} (you gave {given})")
    fingerprint = recorded.get("fingerprint")
    if isinstance(fingerprint, dict) and not said:
        try:
            given_fingerprint = src.fingerprint()
        except ConversionError:
            given_fingerprint = {}
        differ = [name for name in FINGERPRINT_FIELDS
                  if isinstance(fingerprint.get(name), str) and fingerprint[name] != given_fingerprint.get(name)]
        if differ:
            said.append(f"a source whose {', '.join(FINGERPRINT_PARTS[name] for name in differ)} differ from those of "
                        f"{src.root} (recorded {', '.join(f'{n} {str(fingerprint[n])[:12]}…' for n in differ)})")
    if not said:
        return None
    revision = f" at {recorded['revision']}" if isinstance(recorded.get("revision"), str) else ""
    return (f"hint: {out} records that it was converted from {'; '.join(said)}{revision}: pass that source with {option}, "
            f"or check that {out} is the conversion you meant")


@dataclass
class LayerVerdict:
    """One layer's row, its problems in the order found and its inexact count (merged into the
    report in layer order, wherever the layer was checked)."""

    row: LayerRow
    problems: list[str]
    inexact: int
    peak_rss: int = 0


def verify_layer(kind: SourceKind, src_reader: SourceReader, out_reader: SourceReader, readers: _LaneReaders,
                 pool: ThreadPoolExecutor, lanes: int, layer: int, layout: fmt.Layout,
                 progress: Progress | None = None) -> LayerVerdict:
    """Every tensor of one layer: the non-expert ones bit for bit, the biases, then every expert
    ``lanes`` at a time on ``pool``. Runs here or in a worker process alike (there without
    ``progress``: the main process counts whole layers)."""
    namespace = fmt.expected_namespace(layout)
    row, found = LayerRow(str(layer)), VerificationReport(out="", source="")
    prefix = fmt.layer_prefix(layer)
    for hf_name, name in non_expert_names(layout.dims).items():
        if name.startswith(prefix):
            _check_non_expert(src_reader, out_reader, hf_name, name, namespace[name].shape, row, found)
            if progress is not None:
                progress.update(namespace[name].nbytes)
    _check_biases(kind, src_reader, out_reader, layer, layout, row, found)
    if progress is not None:
        progress.update(namespace[f"{prefix}{fmt.GATE_UP}.bias"].nbytes + namespace[f"{prefix}{fmt.DOWN}.bias"].nbytes)
    inexact = sum(_check_experts(kind, readers, out_reader, layer, proj, layout, pool, row, found, progress, lanes)
                  for proj in (fmt.GATE_UP, fmt.DOWN))
    return LayerVerdict(row, found.problems, inexact)


@dataclass
class _VerifyJob:
    """What every verification worker is set up with (pickled once per process)."""

    src: Source
    output: Source
    layout: fmt.Layout
    lanes: int


_WORKER: dict[str, Any] = {}  # a verification worker's job, readers and lanes, kept from layer to layer


def _setup_verify(job: _VerifyJob) -> None:
    _WORKER["job"] = job


def _verify_layer_in_worker(layer: int) -> LayerVerdict:
    job: _VerifyJob = _WORKER["job"]
    if "pool" not in _WORKER:
        _WORKER.update(pool=ThreadPoolExecutor(max_workers=job.lanes, thread_name_prefix="verify"),
                       readers=_LaneReaders(job.src, job.output))
    with SourceReader(job.src) as src_reader, SourceReader(job.output) as out_reader:
        verdict = verify_layer(source_kind(job.src), src_reader, out_reader, _WORKER["readers"], _WORKER["pool"],
                               job.lanes, layer, job.layout)
    verdict.peak_rss = peak_rss()
    return verdict


def recorded_source(out_path: str) -> dict[str, Any]:
    """The ``source`` provenance the converter recorded in the output's index, if readable."""
    try:
        index = read_json(os.path.join(out_path, fmt.INDEX_FILE), fmt.INDEX_FILE)
    except ConversionError:
        return {}
    metadata = index.get("metadata") if isinstance(index, dict) else None
    recorded = metadata.get("source") if isinstance(metadata, dict) else None
    return recorded if isinstance(recorded, dict) else {}


def verify_conversion(out: str | os.PathLike[str], source: str | os.PathLike[str], *,
                      progress: bool = False, gate_up_split: str | None = None,
                      given_source: str | None = None, workers: int | None = None) -> VerificationReport:
    """Compare the converted checkpoint ``out`` with its ``source``, value by value.

    ``gate_up_split`` (compressed-tensors sources whose files cannot tell it) defaults to the
    split the converter recorded in ``out``. ``progress`` shows a bar on a terminal and a plain
    line every few seconds elsewhere. ``given_source`` is what the user named (a Hub id, say)
    for the hint when OUT records another source. ``workers``: experts compared at once, layers
    in parallel processes as ``convert`` spreads them (None: the CPUs the host offers, bounded by
    memory); the report is the same whatever the count. Returns a ``VerificationReport``
    (``report.ok`` is the verdict, ``render_text()`` the per-layer table). Raises
    ``ConversionError`` when ``source`` is not a supported GPT-OSS checkpoint, or is the
    converted one (arguments swapped); ``OSError`` naming the file when a file of ``out`` cannot
    be read. Reads both checkpoints fully, one expert per lane at a
    time. Example::

        report = verify_conversion("gpt-oss-120b-fp8", "gpt-oss-120b")
        print(report.render_text())
    """
    refuse_in_worker_start()
    out_path = os.path.abspath(os.fspath(out))
    swapped = swapped_arguments_hint(out_path, source)
    if swapped:
        raise ConversionError(swapped)
    recorded = recorded_source(out_path)
    stated = recorded.get("gate_up_split") if recorded.get("format") == SOURCE_COMPRESSED_TENSORS else None
    # the split OUT records applies to a compressed-tensors source only: any other source given
    # gets the "OUT records …" hint, not a refusal of an option the user never passed
    src = open_source(source, gate_up_split=gate_up_split,
                      recorded_gate_up_split=stated if isinstance(stated, str) else None)
    kind = source_kind(src)
    report = VerificationReport(out=out_path, source=src.root, source_format=src.kind)
    hint = source_mismatch_hint(recorded, src, given_source if given_source is not None else os.fspath(source))
    checked = preflight(out_path, allow_custom_model=True)
    unreadable = next((f for f in checked.errors if f.code == "filesystem.unreadable"), None)
    if unreadable is not None:  # an I/O error on OUT, not a verdict on the conversion
        where = os.path.join(out_path, unreadable.file) if unreadable.file else out_path
        raise OSError(errno.EIO, unreadable.message.split(": ", 1)[-1], where)
    if not checked.ok:
        for finding in checked.errors:
            report.note(f"preflight: {finding.code}: {finding.message}")
        return report
    view = checked.view
    layout = view.layout
    if view.dims != src.dims:
        if hint:
            report.note(hint, counts=False)
        report.note(f"dimensions differ: output {view.dims}, source {src.dims}: not a conversion of this source")
        return report
    namespace = fmt.expected_namespace(layout)
    renames = non_expert_names(src.dims)
    exactness = recorded.get("exactness")
    try:
        plan = plan_workers(workers, layout, src.kind)
    except ValueError as exc:
        raise ConversionError(str(exc)) from None
    if plan.note:
        logger.warning("verify-conversion: %s", plan.note)
    bar = Progress(sum(spec.nbytes for spec in namespace.values()), f"verify 0/{src.dims.num_hidden_layers} layers",
                   show=None if progress else False)
    output = _output_source(out_path, view)
    layers = range(src.dims.num_hidden_layers)
    with bar, SourceReader(src) as src_reader, SourceReader(output) as out_reader, \
            _LaneReaders(src, output) as readers, ThreadPoolExecutor(max_workers=plan.lanes, thread_name_prefix="verify") as pool, single_threaded_torch():
        global_row = LayerRow("global")

        def check_globals() -> None:
            for hf_name, name in renames.items():
                if not name.startswith("layers."):
                    _check_non_expert(src_reader, out_reader, hf_name, name, namespace[name].shape, global_row, report)
                    bar.update(namespace[name].nbytes)
            report.rows.append(global_row)

        layer_bytes = [sum(spec.nbytes for name, spec in namespace.items() if name.startswith(fmt.layer_prefix(layer)))
                       for layer in layers]
        if plan.processes == 1:
            check_globals()
            verdicts = []
            for layer in layers:
                verdicts.append(verify_layer(kind, src_reader, out_reader, readers, pool, plan.lanes, layer, layout,
                                             bar))
                bar.set_description(f"verify {layer + 1}/{src.dims.num_hidden_layers} layers")
        else:  # the layers in worker processes, the globals here meanwhile; progress by whole layers
            counted = [0]

            def layers_done(done: int) -> None:
                while counted[0] < done:
                    bar.update(layer_bytes[counted[0]])
                    counted[0] += 1
                bar.set_description(f"verify {done}/{src.dims.num_hidden_layers} layers")

            with LayerPool(plan.processes, _setup_verify, (_VerifyJob(src, output, layout, plan.lanes),)) as workers_:
                futures = [workers_.submit(_verify_layer_in_worker, layer) for layer in layers]
                check_globals()
                verdicts = workers_.gather(futures, layers_done)
        for verdict in verdicts:  # in layer order: the report does not depend on the workers
            report.rows.append(verdict.row)
            for message in verdict.problems:
                report.note(message, counts=False)
        inexact_total = sum(verdict.inexact for verdict in verdicts)
    if (src.kind != SOURCE_BF16 and isinstance(exactness, dict)
            and exactness.get("inexact_values") != inexact_total):
        report.note(f"the converter recorded {exactness.get('inexact_values')} inexact values in the index, "
                    f"verification found {inexact_total}")
    if hint and not report.ok:
        report.problems.insert(0, hint)
    return report
