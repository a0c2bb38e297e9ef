"""One expert of a converted checkpoint against its source (``compare_expert``): the stored FP8
columns brought back to the source's row layout a block at a time, padding that must be zero,
and every value settled by the fastest proof that applies (``verify_values``: byte compare,
float32 equality, the float32 screen) before the float64 judge sees what is left. Requires torch.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

from .. import format as fmt
from ..units import plural
from .fp8 import fp8_values
from .kinds.base import ExpertRows
from .verify_values import Screen, byte_mismatches, judge, no_screen, products_exact

__all__ = ["ExpertResult", "compare_expert"]

# the screen's signature (``verify_values.Screen``; ``no_screen`` when float32 cannot hold the source)
_ScreenFn = Callable[[torch.Tensor, torch.Tensor, torch.Tensor, float],
                    "tuple[int, float, int, torch.Tensor, torch.Tensor] | None"]
_CHUNK_VALUES = 1 << 17  # values compared at a time: the pieces stay in cache
_TILE_ROWS = 128  # rows compared at a time are a multiple of this (the transpose back is cheaper in wide blocks)


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


def _check_padding(padding: list[torch.Tensor], result: ExpertResult, where: str) -> str | None:
    """Count the padding regions' values (each must be zero) into ``result``; the first problem."""
    first = None
    for region in padding:
        nonzero = int(((region & 0x7F) != 0).sum())
        result.values += region.numel()
        result.exact += region.numel() - nonzero
        result.violations += nonzero
        if nonzero and first is None:
            first = f"{where}: padding holds non-zero values"
    return first


@dataclass
class _Judged:
    """The float64 verdicts on the values of one block the faster paths left over: the block's
    stored bytes ``q``, scales ``s`` and source rows ``wanted`` (only the rows ``subset`` when the
    bytes were compared), the values judged and where they lie (``rows``/``cols``; None: all, in
    row-major order)."""

    q: torch.Tensor
    s: torch.Tensor
    wanted: torch.Tensor
    subset: torch.Tensor | None
    values: torch.Tensor
    wanted_values: torch.Tensor
    exact: torch.Tensor
    bad: torch.Tensor
    error: torch.Tensor
    rows: torch.Tensor | None
    cols: torch.Tensor | None


def _settle_block(want: ExpertRows, q: torch.Tensor, s: torch.Tensor, first_row: int, last_row: int, stride: int,
                  fast: bool, in_range: bool, try_equal: bool, screen: _ScreenFn, result: ExpertResult
                  ) -> tuple[_Judged | None, bool]:
    """One block of stored rows ``q`` (scales ``s``) against the source rows ``first_row`` …
    ``last_row`` step ``stride``: what the byte compare, float32 equality (``fast``: every product
    exact in float32) or the screen settle is counted in ``result``; the rest is judged in
    float64 and returned (None: nothing left), with whether the next block tries equality first."""
    subset = None
    if in_range and fast:
        source = want.fp8_rows(first_row, last_row, stride)
        compared = None if source is None else byte_mismatches(q, s, *source)
        if compared is not None:
            subset, differ = compared
            if not subset.numel():
                result.exact += q.numel()
                return None, try_equal
    wanted = want.rows(first_row, last_row, stride, subset)
    if subset is not None:  # only the differing bytes of the differing rows are judged in float
        result.exact += (q.shape[0] - subset.numel()) * q.shape[1]
        q, s = q[subset], s[subset]
        where_rows, where_cols = differ[subset].nonzero(as_tuple=True)
        result.exact += q.numel() - where_rows.numel()
    elif fast:
        values = fp8_values(q)
        values.mul_(s.unsqueeze(1))
        if in_range and try_equal and torch.equal(values, wanted):
            result.exact += q.numel()
            return None, try_equal
        suspect = values != wanted
        if not in_range:
            suspect |= (q & 0x78) == 0x78
        where_rows, where_cols = suspect.nonzero(as_tuple=True)
        result.exact += q.numel() - where_rows.numel()
        try_equal = not where_rows.numel()
        if try_equal:
            return None, try_equal
    elif in_range and (screened := screen(q, s, wanted, result.max_rel_error)) is not None:
        inexact, rel_max, flushed_proven, where_rows, where_cols = screened
        result.inexact += inexact
        result.flushed += flushed_proven
        result.max_rel_error = max(result.max_rel_error, rel_max)
        if not where_rows.numel():
            return None, try_equal
    else:
        values = fp8_values(q)
        exact, bad, error = judge(wanted.reshape(-1), values.reshape(-1), s.unsqueeze(1).expand_as(values).reshape(-1))
        return _Judged(q, s, wanted, subset, values, wanted.reshape(-1), exact, bad, error, None, None), try_equal
    values = fp8_values(q[where_rows, where_cols].contiguous())
    wanted_values = wanted[where_rows, where_cols]
    exact, bad, error = judge(wanted_values, values, s[where_rows])
    return _Judged(q, s, wanted, subset, values, wanted_values, exact, bad, error, where_rows, where_cols), try_equal


def _count_judged(judged: _Judged, result: ExpertResult, where: str, first_column: int) -> str | None:
    """Count one block's float64 verdicts into ``result``; the first violation, described (its
    output column counted from ``first_column``), or None."""
    exact, bad, error, wanted_values = judged.exact, judged.bad, judged.error, judged.wanted_values
    result.exact += int((exact & ~bad).sum())
    result.inexact += int((~exact & ~bad).sum())
    nonzero = wanted_values != 0
    flushed = nonzero & (judged.values.reshape(-1) == 0) & ~bad
    result.flushed += int(flushed.sum())
    rounded = nonzero & ~flushed
    if bool(rounded.any()):
        rel = (error[rounded] / wanted_values.double().abs()[rounded]).max()
        result.max_rel_error = max(result.max_rel_error, float(rel))
    violations = int(bad.sum())
    if not violations:
        return None
    result.violations += violations
    at = int(bad.nonzero()[0])
    q, s, subset = judged.q, judged.s, judged.subset
    if judged.rows is not None and judged.cols is not None:
        r, c = int(judged.rows[at]), int(judged.cols[at])
    else:
        r, c = divmod(at, q.shape[1])
    stored_value = float(fp8_values(q[r, c:c + 1].contiguous()))
    return (f"{where}[{c}, {first_column + (r if subset is None else int(subset[r]))}]: stored {stored_value} × scale "
            f"{float(s[r])} = {stored_value * float(s[r])}, source {float(judged.wanted[r, c])}")


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
    first = _check_padding(padding, result, where)
    cols = want.shape[1]
    step = _TILE_ROWS * max(1, _CHUNK_VALUES // (_TILE_ROWS * cols))
    # one block of rows transposed back, reused: first its stored columns copied out whole (short
    # contiguous runs), then transposed within the cache (a strided read across the whole expert
    # would cost a TLB miss per byte)
    columns, block = torch.empty((cols, step), dtype=torch.uint8), torch.empty((step, cols), dtype=torch.uint8)
    screen: _ScreenFn = Screen(step, cols) if want.dtype == torch.float32 else no_screen
    for offset, stride, back, scales, column in segments:
        rows = back.shape[0]
        fast = products_exact(scales) & (want.dtype == torch.float32)
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
            judged, try_equal = _settle_block(want, q, s, offset + start * stride, offset + stop * stride, stride,
                                              bool(fast[start:stop].all()), in_range, try_equal, screen, result)
            if judged is not None:
                problem = _count_judged(judged, result, where, column + start)
                first = first if first is not None else problem
    if first is not None:
        result.problem = f"{first} ({plural(result.violations, 'value')} of this expert {'violates' if result.violations == 1 else 'violate'})"
    return result
