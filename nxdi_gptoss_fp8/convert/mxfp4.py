"""MXFP4 decoding, and its exact re-encoding as FP8-E4M3 with power-of-two channel scales.

An HF GPT-OSS MXFP4 tensor is ``blocks`` uint8 [experts, rows, K/32, 16] and ``scales`` uint8
[experts, rows, K/32]: each byte packs two FP4-E2M1 codes (low nibble = even element), each block
of 32 elements shares the exponent ``2^(scale - 127)``. ``decode`` takes any leading dims; the
encoder works on one expert's rows, [rows, K/32, 16], a row being one output channel. Every non-zero MXFP4 value is
``m × 2^x`` with ``m`` ∈ {1, 1.5}, so with a power-of-two channel scale ``2^t`` it is an exact
E4M3 value whenever ``x − t`` lies in E4M3's range (normals up to Neuron's 240, subnormals down
to 2^-9). Choosing ``t`` so the channel's largest value lands on exponent 7 (128 or 192) keeps
the most small values exact; the rest round to nearest even and are counted.

Each output byte then depends only on a 4-bit code and the block's exponent offset
``d = scale − 127 − t``, so encoding is one table lookup per packed byte (two FP8 bytes out),
with no float arithmetic in the hot loop. Requires torch.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ..format import FP8_MAX
from .fp8 import FP8_DTYPE

__all__ = [
    "BLOCK_SIZE",
    "EXACT_OFFSET_MAX",
    "EXACT_OFFSET_MIN",
    "FP4_VALUES",
    "MAX_SCALE_BYTE",
    "MAX_SCALE_EXPONENT",
    "MIN_SCALE_EXPONENT",
    "OFFSET_MAX",
    "OFFSET_MIN",
    "SCALE_BIAS",
    "STAT_OFFSET_MAX",
    "STAT_OFFSET_MIN",
    "TOP_EXPONENT",
    "Exactness",
    "ExpertEncoder",
    "block_offsets",
    "build_byte_table",
    "channel_exponents",
    "decode",
    "encode",
    "exactness",
    "exactness_table",
    "offset_table",
    "scale_values",
]

FP4_VALUES = (0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0, -0.0, -0.5, -1.0, -1.5, -2.0, -3.0, -4.0, -6.0)
BLOCK_SIZE = 32
SCALE_BIAS = 127
# 6 × 2^(252 − 127) is the largest MXFP4 magnitude that float32 (and BF16) can hold; 255 is NaN.
MAX_SCALE_BYTE = 252
# The largest E4M3 exponent whose values (1 × 2^7 = 128, 1.5 × 2^7 = 192) stay within ±240.
TOP_EXPONENT = 7
# float32 normal range for the channel scale 2^t.
MIN_SCALE_EXPONENT, MAX_SCALE_EXPONENT = -126, 127
# Offsets d covered by the byte table; below OFFSET_MIN every code rounds to ±0, above
# OFFSET_MAX only all-zero blocks can occur (a larger value would have raised t).
OFFSET_MIN, OFFSET_MAX = -16, 8
# Blocks with EXACT_OFFSET_MIN <= d <= EXACT_OFFSET_MAX are exact for every code:
# 0.5 × 2^-8 = 2^-9 is E4M3's smallest subnormal; 6 × 2^5 = 192 <= 240.
EXACT_OFFSET_MIN, EXACT_OFFSET_MAX = -8, 5

# For each packed byte: the values of its low nibble (the even element) and its high nibble.
_VALUE_PAIRS = torch.tensor([[FP4_VALUES[byte & 0x0F], FP4_VALUES[byte >> 4]] for byte in range(256)],
                            dtype=torch.float32)
_DECODE_BLOCKS = 4096
_NO_VALUE = -(1 << 12)
# The exponent p of each magnitude code written as m × 2^p, m ∈ {1, 1.5}; code 0 has none.
_CODE_EXPONENT = torch.tensor([_NO_VALUE, -1, 0, 0, 1, 1, 2, 2], dtype=torch.int32)
# For a byte of one-hot code bits (bit c set for code c): the exponent of its highest code.
_TOP_EXPONENT_OF_BITS = _CODE_EXPONENT[
    torch.tensor([max(value.bit_length() - 1, 0) for value in range(256)], dtype=torch.long)
]


def decode(blocks: torch.Tensor, scales: torch.Tensor) -> torch.Tensor:
    """Dequantize MXFP4 to float32 [..., rows, K] the plain way: each packed byte's two values
    from a value table, times the block's ``2^(scale − 127)``.

    This is the reference the verifier compares against; it shares nothing with the byte-table
    encoder below. Exact for scale bytes up to ``MAX_SCALE_BYTE`` (a product with a power of two
    is exact in float32 down to its subnormals).
    """
    if blocks.shape[:-1] != scales.shape or blocks.shape[-1] != BLOCK_SIZE // 2:
        raise ValueError(f"blocks {list(blocks.shape)} do not match scales {list(scales.shape)}")
    flat_blocks, flat_scales = blocks.reshape(-1, BLOCK_SIZE // 2), scales.reshape(-1)
    values = torch.empty((flat_scales.numel(), BLOCK_SIZE), dtype=torch.float32)
    step = _DECODE_BLOCKS  # a cache-sized piece at a time: several times faster than whole tensors
    for start in range(0, flat_scales.numel(), step):
        stop = min(start + step, flat_scales.numel())
        index = flat_blocks[start:stop].reshape(-1).to(torch.int32)
        part = values[start:stop]
        torch.index_select(_VALUE_PAIRS, 0, index, out=part.view(-1, 2))  # [bytes, (low, high)]
        exponents = (flat_scales[start:stop].to(torch.int32) - SCALE_BIAS).float()
        part.mul_(torch.ldexp(torch.ones(stop - start, dtype=torch.float32), exponents).unsqueeze(-1))
    return values.reshape(*blocks.shape[:-2], blocks.shape[-2] * BLOCK_SIZE)


def channel_exponents(blocks: torch.Tensor, scales: torch.Tensor) -> torch.Tensor:
    """int32 [rows]: the exponent t of each channel's power-of-two scale 2^t.

    t puts the channel's largest value on E4M3 exponent ``TOP_EXPONENT`` (at most 192, within
    ±240); any larger t would make more small values inexact, any smaller one would overflow.
    An all-zero channel gets t = 0 (scale 1.0). t is kept in float32's normal range.
    """
    return ExpertEncoder(*scales.shape).channel_exponents(blocks, scales)


def scale_values(t: torch.Tensor) -> torch.Tensor:
    """float32 2^t, exactly."""
    return torch.ldexp(torch.ones(t.shape, dtype=torch.float32), t.float())


def _fp8_bytes(values: torch.Tensor) -> torch.Tensor:
    """E4M3 bytes of float32 ``values`` (round to nearest even), saturated to ±FP8_MAX."""
    return values.float().clamp(-FP8_MAX, FP8_MAX).to(FP8_DTYPE).view(torch.uint8)


def offset_table() -> torch.Tensor:
    """float32 [offsets, 16]: code value × 2^d for d in OFFSET_MIN..OFFSET_MAX (exact)."""
    offsets = torch.arange(OFFSET_MIN, OFFSET_MAX + 1, dtype=torch.float32)
    return torch.ldexp(torch.tensor(FP4_VALUES).unsqueeze(0).expand(len(offsets), 16), offsets.unsqueeze(1))


def build_byte_table(*, low_nibble_first: bool = True) -> torch.Tensor:
    """int16 [offsets × 256]: for (offset d, packed byte) the two E4M3 output bytes, the even
    element's byte first in memory (the int16 is a native-endian view of the byte pair)."""
    per_code = _fp8_bytes(offset_table())  # [offsets, 16] uint8
    packed = torch.arange(256)
    low, high = per_code[:, packed & 0x0F], per_code[:, packed >> 4]
    pair = torch.stack((low, high) if low_nibble_first else (high, low), dim=-1)  # [offsets, 256, 2]
    return pair.contiguous().view(torch.int16).reshape(-1)


_BYTE_TABLE = build_byte_table()


def block_offsets(scales: torch.Tensor, t: torch.Tensor) -> torch.Tensor:
    """int32 [..., rows, K/32]: d = scale − 127 − t, each block's exponent relative to its channel."""
    return scales.to(torch.int32) - (SCALE_BIAS + t).unsqueeze(-1)


def encode(blocks: torch.Tensor, scales: torch.Tensor, t: torch.Tensor) -> torch.Tensor:
    """uint8 [rows, K]: the E4M3 bytes of MXFP4 ``blocks`` [rows, K/32, 16] / ``scales``
    [rows, K/32] divided by 2^t."""
    return ExpertEncoder(*scales.shape).encode(blocks, scales, t).clone()


class ExpertEncoder:
    """The MXFP4 → E4M3 hot loop for up to ``capacity`` rows of ``groups`` blocks, with its
    buffers allocated once.

    Reusing the buffers matters: fresh tensors of this size cost page faults on every call
    (several times the arithmetic) and let the heap fragment, so RSS would creep up. Callers
    feed large tensors a few hundred rows at a time, which also keeps the work in cache.
    """

    def __init__(self, capacity: int, groups: int) -> None:
        self.capacity, self.groups = capacity, groups
        shape = (capacity, groups, BLOCK_SIZE // 2)
        self._ones = torch.ones(shape, dtype=torch.uint8)
        self._low = torch.empty(shape, dtype=torch.uint8)
        self._high = torch.empty(shape, dtype=torch.uint8)
        self._index = torch.empty(shape, dtype=torch.int32)
        self._pairs = torch.empty(self._index.numel(), dtype=torch.int16)

    def _rows(self, blocks: torch.Tensor, scales: torch.Tensor) -> int:
        rows = scales.shape[0]
        if (scales.dim() != 2 or tuple(blocks.shape) != (rows, scales.shape[1], BLOCK_SIZE // 2)
                or scales.shape[1] != self.groups or rows > self.capacity):
            raise ValueError(f"blocks {list(blocks.shape)} / scales {list(scales.shape)} do not fit the encoder's "
                             f"block shape [≤{self.capacity}, {self.groups}]")
        return rows

    def block_top_exponents(self, blocks: torch.Tensor) -> torch.Tensor:
        """int32 [rows, K/32]: the exponent p of each block's largest |code| (a large negative
        sentinel for an all-zero block).

        Each nibble's magnitude code c (0..7, ordered like the values) becomes the bit 1 << c;
        OR-ing the 32 bits of a block (two int64 words, then folded) leaves the largest code as
        the highest set bit. Elementwise byte ops only: a max-reduction over 16 bytes costs
        several times more."""
        rows = blocks.shape[0]
        ones, low, high = self._ones[:rows], self._low[:rows], self._high[:rows]
        torch.bitwise_and(blocks, 0x07, out=low)
        torch.bitwise_left_shift(ones, low, out=low)
        torch.bitwise_right_shift(blocks, 4, out=high)
        high.bitwise_and_(0x07)
        torch.bitwise_left_shift(ones, high, out=high)
        low.bitwise_or_(high)
        words = low.view(torch.int64)  # [rows, K/32, 2]: a block's 16 bytes
        bits = words[..., 0] | words[..., 1]
        for shift in (32, 16, 8):  # arithmetic shifts are fine: only the low byte is kept
            bits |= bits >> shift
        return _TOP_EXPONENT_OF_BITS[bits & 0xFF]

    def channel_exponents(self, blocks: torch.Tensor, scales: torch.Tensor) -> torch.Tensor:
        """int32 [rows]: t for each channel (see the module function)."""
        self._rows(blocks, scales)
        top = self.block_top_exponents(blocks)
        exponents = torch.where(top > _NO_VALUE, scales.to(torch.int32) - SCALE_BIAS + top, _NO_VALUE)
        largest = exponents.amax(dim=-1)
        t = torch.where(largest > _NO_VALUE, largest - TOP_EXPONENT, 0)
        return t.clamp(MIN_SCALE_EXPONENT, MAX_SCALE_EXPONENT)

    def encode(self, blocks: torch.Tensor, scales: torch.Tensor, t: torch.Tensor) -> torch.Tensor:
        """uint8 [rows, K]: one gather per packed byte from the (offset, byte) table, no float
        math. The result is a view of a reused buffer, valid until the next call."""
        rows = self._rows(blocks, scales)
        index, pairs = self._index[:rows], self._pairs[: rows * self.groups * BLOCK_SIZE // 2]
        d = block_offsets(scales, t).clamp_(OFFSET_MIN, OFFSET_MAX).sub_(OFFSET_MIN).mul_(256)
        torch.add(d.unsqueeze(-1).expand(index.shape), blocks, out=index)
        torch.index_select(_BYTE_TABLE, 0, index.view(-1), out=pairs)
        return pairs.view(torch.uint8).view(rows, self.groups * BLOCK_SIZE)


@dataclass
class Exactness:
    """How many values did not survive exactly: ``flushed_to_zero`` of them became 0, the rest
    were rounded to a non-zero value, ``max_rel_error`` the worst relative error among those
    (a flushed value's error is 1 by definition: counted, never folded into the worst error)."""

    values: int = 0
    inexact: int = 0
    flushed_to_zero: int = 0
    max_rel_error: float = 0.0

    def add(self, other: Exactness) -> None:
        self.values += other.values
        self.inexact += other.inexact
        self.flushed_to_zero += other.flushed_to_zero
        self.max_rel_error = max(self.max_rel_error, other.max_rel_error)


def exactness(blocks: torch.Tensor, scales: torch.Tensor, t: torch.Tensor) -> Exactness:
    """Count the values ``encode`` cannot represent exactly (only blocks whose offset lies
    outside the always-exact window are examined, so this is cheap in the common case)."""
    d = block_offsets(scales, t)
    result = Exactness(values=blocks.numel() * 2)
    suspect = (d < EXACT_OFFSET_MIN) | (d > EXACT_OFFSET_MAX)
    if not bool(suspect.any()):
        return result
    chosen, offsets = blocks[suspect], d[suspect]  # [n, 16], [n]
    codes = torch.stack((chosen & 0x0F, chosen >> 4), dim=-1).reshape(len(chosen), BLOCK_SIZE).long()
    wanted, got = _judged(codes, offsets.double().unsqueeze(-1))
    wrong = got != wanted
    result.inexact = int(wrong.sum())
    if result.inexact:
        result.flushed_to_zero = int((wrong & (got == 0)).sum())
        rounded = wrong & (got != 0)
        if bool(rounded.any()):
            result.max_rel_error = float(((got - wanted).abs()[rounded] / wanted.abs()[rounded]).max())
    return result


def _judged(codes: torch.Tensor, offsets: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """float64 (wanted, got): the values of FP4 ``codes`` (long) times 2^``offsets`` (float64,
    broadcast), and what E4M3 makes of them (nearest even, saturated at ±FP8_MAX)."""
    table = torch.tensor(FP4_VALUES, dtype=torch.float64)
    wanted = torch.ldexp(table[codes], offsets)
    got = _fp8_bytes(wanted.clamp(-2 * FP8_MAX, 2 * FP8_MAX).float()).view(FP8_DTYPE).double()
    # float32 may round ``wanted`` before the E4M3 rounding: only exact float32 inputs are safe
    return wanted, torch.where(wanted.float().double() == wanted, got, _fp8_round_exact(wanted))


# every offset d = scale − 127 − t can take (scale bytes 0…252, t within float32's normal range)
STAT_OFFSET_MIN, STAT_OFFSET_MAX = -MAX_SCALE_EXPONENT - SCALE_BIAS, MAX_SCALE_BYTE - SCALE_BIAS - MIN_SCALE_EXPONENT


def exactness_table() -> tuple[torch.Tensor, torch.Tensor]:
    """What ``exactness`` says of each packed byte at each block offset d (``STAT_OFFSET_MIN`` …
    ``STAT_OFFSET_MAX``), judged the same way, element by element: (uint8 [offsets, 256]: values
    not exact | flushed to zero << 2, float64 [offsets, 256]: the worst relative error of its
    values rounded to non-zero, 0 when none). For compiled encoders (``kernels``)."""
    offsets = torch.arange(STAT_OFFSET_MIN, STAT_OFFSET_MAX + 1, dtype=torch.float64).reshape(-1, 1, 1)
    packed = torch.arange(256)
    codes = torch.stack((packed & 0x0F, packed >> 4), dim=-1).unsqueeze(0)  # [1, 256, 2]
    wanted, got = _judged(codes, offsets)
    wrong = got != wanted
    flushed = wrong & (got == 0)
    rounded = wrong & (got != 0)
    rel = torch.where(rounded, (got - wanted).abs() / wanted.abs(), torch.zeros_like(wanted)).amax(dim=-1)
    return (wrong.sum(dim=-1) | (flushed.sum(dim=-1) << 2)).to(torch.uint8), rel.contiguous()


def _fp8_round_exact(values: torch.Tensor) -> torch.Tensor:
    """float64 E4M3 rounding (nearest even, saturated at ±FP8_MAX) of values too small for
    float32: everything below half the smallest subnormal (2^-10) is ±0."""
    small = values.abs() <= 2.0**-10
    safe = torch.where(small, torch.zeros_like(values), values)
    rounded = _fp8_bytes(safe.float()).view(FP8_DTYPE).double()
    return torch.where(small, values * 0.0, rounded)
