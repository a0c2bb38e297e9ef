"""The value-level checks of ``verify-conversion``: the bound every dequantized FP8 value must
meet, the float64 judge that decides it, and the two faster paths that settle most values before
the judge sees them (each proven to give the judge's verdict).

* ``judge``: float64 verdicts (exact, violating, error) for stored values against the source;
* ``Screen``: for requantized rows (any float32 scale), the values float32 alone proves inexact
  and within the bound, leaving only the rest to ``judge``;
* ``byte_mismatches``: a source that is itself E4M3 bytes × a float32 scale compared byte for
  byte, where the stored scale is the source's or twice it;
* ``products_exact`` says which rows may be compared in float32 at all, ``nonzero`` lists the
  values left over quickly. Requires torch.
"""

from __future__ import annotations

import torch

from .. import format as fmt
from .fp8 import FP8_DTYPE, fp8_values

__all__ = [
    "BOUND_TEXT", "RELATIVE_STEP", "SLACK", "SUBNORMAL_STEP", "Screen", "byte_mismatches", "judge", "no_screen",
    "nonzero", "products_exact",
]

BOUND_TEXT = (
    "exact wherever source/scale is an E4M3 value within ±240; otherwise "
    "|fp8·scale − source| ≤ max(2^-4·|source|, 2^-10·scale)·(1 + 2^-16)"
)
RELATIVE_STEP = 2.0**-4
SUBNORMAL_STEP = 2.0**-10
SLACK = 1.0 + 2.0**-16


def products_exact(scale: torch.Tensor) -> torch.Tensor:
    """bool per row: an E4M3 value (≤ 4 significant bits) times this float32 scale is exact in
    float32 (the scale has ≤ 20 significant bits and leaves room below and above)."""
    magnitude = scale.abs()
    return (torch.isfinite(scale) & (magnitude >= 2.0**-100) & (magnitude <= 2.0**100)
            & ((scale.view(torch.int32) & 0xF) == 0))


def judge(want: torch.Tensor, stored: torch.Tensor, scale: torch.Tensor
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


def nonzero(mask: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
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


def no_screen(*_: object) -> None:
    """Sources whose values float32 cannot hold go through ``judge`` alone."""
    return None


class Screen:
    """For rows of requantized values (any float32 scale), the values float32 alone proves
    inexact and within the bound — what ``judge`` would say of them, without its float64 passes
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
        as ``judge`` computes it — or 0.0 when it cannot exceed ``floor`` —, how many of them are
        stored as 0 (flushed: counted apart, as ``judge`` does), the rows and columns of every
        other value, for ``judge``); None when a scale is out of range."""
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
                rows, columns = nonzero(torch.ge(rel, top - slack, out=other))
                wanted = want[rows, columns].double()
                exact_error = (fp8_values(q[rows, columns].contiguous()).double() * scale[rows].double()
                               - wanted).abs()
                rel_max = float((exact_error / wanted.abs()).max())
        torch.logical_not(proven, out=other)
        where_rows, where_cols = nonzero(other)
        return count, rel_max, flushed, where_rows, where_cols


def byte_mismatches(q: torch.Tensor, scale: torch.Tensor, source_q: torch.Tensor, source_scale: torch.Tensor
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
