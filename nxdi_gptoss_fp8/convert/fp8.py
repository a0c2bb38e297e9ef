"""Expert-wise, per-output-channel symmetric FP8-E4M3 quantization within Neuron's ±240.

``W[e, :, c] ≈ float(q[e, :, c]) × scale[e, 0, c]`` with ``|q| ≤ 240``: the layout NxD's
``expert_wise_per_channel_symmetric`` layers consume (docs/format.md, Layout rules). Requires torch.
``quantize_expertwise`` does it in one piece; ``DenseEncoder`` does the same to one expert in
cache-sized row blocks, with the exactness statistics of every value, for the converter.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

from ..format import FP8_MAX

__all__ = ["BLOCK_VALUES", "FP8_DTYPE", "MIN_NORMAL_SCALE", "DenseEncoder", "RequantError", "channel_scales", "column_amax",
           "dequantize_expertwise", "fp8_values", "quantize_expertwise"]

FP8_DTYPE = torch.float8_e4m3fn
MIN_NORMAL_SCALE = torch.finfo(torch.float32).tiny  # 2^-126
# float32 values of every pair of E4M3 bytes, indexed by the pair read as one uint16: decoding
# by table is about twice as fast as torch's own float8 → float32 cast
_FP8_PAIRS = (torch.arange(1 << 16, dtype=torch.int32).to(torch.int16).view(torch.uint8).view(FP8_DTYPE)
              .float().view(torch.int64))


BLOCK_VALUES = 1 << 17  # values per row block of ``DenseEncoder``: its buffers stay in the L2 cache


def fp8_values(q: torch.Tensor, *, out: torch.Tensor | None = None, index: torch.Tensor | None = None) -> torch.Tensor:
    """float32 values of the E4M3 bytes ``q`` (uint8 or float8, any shape), exactly; into
    ``out`` (float32, as many values) with ``index`` (int32, half as many) as scratch when given."""
    q = q.contiguous().view(torch.uint8)
    if q.numel() % 2:
        values = q.view(FP8_DTYPE).float()
        return values if out is None else out.view(q.shape).copy_(values)
    pairs = q.reshape(-1).view(torch.uint16)
    index = pairs.to(torch.int32) if index is None else index.copy_(pairs)
    if out is None:
        return _FP8_PAIRS.index_select(0, index).view(torch.float32).view(q.shape)
    torch.index_select(_FP8_PAIRS, 0, index, out=out.view(-1).view(torch.int64))
    return out.view(q.shape)


def dequantize_expertwise(q: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    """float32 ``q × scale``: the values an expert-wise FP8 weight stands for (the inverse of
    ``quantize_expertwise``). ``q`` [..., in, out] E4M3 bytes, ``scale`` [..., 1, out] float32;
    each product is one float32 multiplication of two exact values."""
    return fp8_values(q).mul_(scale.to(torch.float32))


def channel_scales(amax: torch.Tensor) -> torch.Tensor:
    """float32 scales of channels whose largest magnitude is ``amax`` (see ``quantize_expertwise``)."""
    return torch.where(amax > 0, (amax / FP8_MAX).clamp(min=MIN_NORMAL_SCALE), torch.ones_like(amax))


def quantize_expertwise(weight: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Quantize ``weight`` [E, in, out] to (FP8 [E, in, out], float32 scale [E, 1, out]).

    The scale is the channel's absolute maximum over the input dim divided by 240, at least
    float32's smallest normal (2^-126: a channel of subnormal values keeps a normal scale, its
    values then land lower in E4M3's range); an all-zero channel (padding) gets scale 1.0,
    because a scale must be a normal, finite float32 > 0.
    """
    if weight.dim() != 3:
        raise ValueError(f"expected an [experts, in, out] tensor, got shape {list(weight.shape)}")
    w = weight.float()
    scale = channel_scales(w.abs().amax(dim=1, keepdim=True))
    q = (w / scale).clamp(-FP8_MAX, FP8_MAX).to(FP8_DTYPE)
    return q, scale.contiguous()


@dataclass
class RequantError:
    """Exactness of values quantized afresh: how many (and how many kept non-zero), how many
    the round trip changed or flushed to zero, the worst and the sum of the relative errors
    ``|float(q) × scale − w| / |w|`` over the values kept non-zero (a value flushed to zero is
    counted apart: its error is 1 by definition)."""

    values: int = 0
    nonzero: int = 0
    inexact: int = 0
    flushed_to_zero: int = 0
    max_rel_error: float = 0.0
    rel_sum: float = 0.0


def column_amax(weight: torch.Tensor) -> tuple[torch.Tensor, bool]:
    """(float32 [cols]: each column's largest magnitude, whether every value is finite) of
    ``weight`` [rows, cols]. BF16 through its bits: a magnitude's bits order like its value, so
    the maximum of ``bits & 0x7FFF`` as int16 is the largest magnitude, and one of at least
    0x7F80 an infinity or a NaN (25 times faster than ``aminmax`` over rows)."""
    if weight.dtype != torch.bfloat16:
        magnitude = weight.float().abs().amax(dim=0)
        return magnitude, bool(torch.isfinite(magnitude).all())
    rows = max(1, BLOCK_VALUES // max(weight.shape[1], 1))
    largest = torch.zeros(weight.shape[1], dtype=torch.int16)
    block = torch.empty((min(rows, weight.shape[0]), weight.shape[1]), dtype=torch.int16)
    for start in range(0, weight.shape[0], rows):
        part = block[: min(rows, weight.shape[0] - start)]
        torch.bitwise_and(weight[start:start + rows].view(torch.int16), 0x7FFF, out=part)
        torch.maximum(largest, part.amax(dim=0), out=largest)
    return largest.view(torch.bfloat16).float(), not bool((largest >= 0x7F80).any())


class DenseEncoder:
    """``quantize_expertwise`` for one expert [rows, cols] (BF16 or float32, input dim first), a
    row block of ``BLOCK_VALUES`` at a time through buffers allocated once, with its
    ``RequantError``.

    The same arithmetic, value for value, as the one-piece function, so the bytes and scales are
    identical; the statistics take one FP8 → float32 decode (by table) and mask-free reductions:
    the values flushed to zero are the non-zero source values less the non-zero round trips (a
    non-zero E4M3 value times a normal scale never underflows to zero), counted apart and left
    out of the relative errors (theirs is exactly 1), and a zero source value's 0/0 relative
    error is counted as 0. Blocks stay in cache, which is most of the gain.
    """

    def __init__(self, block_values: int = BLOCK_VALUES) -> None:
        self.block_values = block_values
        self._buffers: dict[int, tuple[torch.Tensor, ...]] = {}

    def _scratch(self, cols: int) -> tuple[int, tuple[torch.Tensor, ...]]:
        rows = max(2, self.block_values // max(cols, 1))
        rows += rows % 2  # whole row pairs, so a block's bytes read as uint16 pairs
        if cols not in self._buffers:
            self._buffers[cols] = (*(torch.empty((rows, cols), dtype=torch.float32) for _ in range(4)),
                                   torch.empty((rows, cols), dtype=torch.uint8),
                                   torch.empty(rows * cols // 2, dtype=torch.int32))
        return rows, self._buffers[cols]

    def encode(self, weight: torch.Tensor, scale: torch.Tensor,
               place: Callable[[torch.Tensor, int], None]) -> RequantError:
        """Quantize ``weight`` [rows, cols] with channel ``scale`` [cols] (``channel_scales`` of
        its column maxima); each block of E4M3 bytes [n, cols] goes to ``place(block, first_row)``
        while in cache (it is a reused buffer: copy it there). Counts are sums of signs (exact
        in float32 below 2^24 values a block), faster than ``count_nonzero``."""
        rows, cols = weight.shape
        step, (source, work, signs, scales, q, index) = self._scratch(cols)
        scales.copy_(scale.expand(scales.shape))  # a whole block of scales: dividing by it is twice as fast
        result = RequantError(values=weight.numel())
        for start in range(0, rows, step):
            n = min(step, rows - start)
            w, t, sign, qb, s = source[:n], work[:n], signs[:n], q[:n], scales[:n]
            w.copy_(weight[start:start + n])
            torch.div(w, s, out=t).clamp_(-FP8_MAX, FP8_MAX)
            qb.view(FP8_DTYPE).copy_(t)
            place(qb, start)
            t = fp8_values(qb, out=t, index=index[: n * cols // 2]).mul_(s)
            nonzero_q = int(torch.sign(t, out=sign).abs_().sum())
            t.sub_(w).abs_()
            result.inexact += int(torch.sign(t, out=sign).sum())
            nonzero = int(torch.sign(w.abs_(), out=sign).sum())
            flushed = nonzero - nonzero_q
            result.nonzero += nonzero_q  # the mean is over the values kept: a flushed one is counted apart
            result.flushed_to_zero += flushed
            if nonzero_q:
                rel = t.div_(w).nan_to_num_(0.0)  # 0/0 where the source value is zero
                if flushed:  # a flushed value's error is exactly 1 (|0 - w| / |w|); a kept one's is below 1
                    rel.masked_fill_(rel == 1.0, 0.0)
                result.max_rel_error = max(result.max_rel_error, float(rel.amax()))
                result.rel_sum += float(rel.sum(dtype=torch.float64))
        return result
