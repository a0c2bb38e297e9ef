"""MXFP4 decoding and the byte-table FP8 encoder, against independent references."""

from __future__ import annotations

from fractions import Fraction

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from nxdi_gptoss_fp8.convert import mxfp4
from nxdi_gptoss_fp8.convert.fp8 import FP8_DTYPE


def e4m3_value(byte: int) -> Fraction:
    """The value of an E4M3 byte (bias 7, subnormals at exponent 0), from the bit layout."""
    sign = -1 if byte & 0x80 else 1
    exponent, mantissa = (byte >> 3) & 0x0F, byte & 0x07
    if exponent == 0:
        return sign * Fraction(mantissa, 8) * Fraction(1, 2**6)
    return sign * (1 + Fraction(mantissa, 8)) * Fraction(2) ** (exponent - 7)


NEURON_BYTES = list(range(0x78))  # every non-negative byte with |value| <= 240


def reference_e4m3(value: Fraction, negative: bool) -> int:
    """Round to the nearest E4M3 byte within ±240 (ties to the even mantissa), saturating."""
    magnitude = abs(value)
    best = min(NEURON_BYTES, key=lambda b: (abs(e4m3_value(b) - magnitude), b & 1))
    return best | (0x80 if negative else 0)


def mxfp4_value(code: int, offset: int) -> Fraction:
    return Fraction(mxfp4.FP4_VALUES[code]).limit_denominator() * Fraction(2) ** offset


def test_byte_table_matches_an_independent_rounding() -> None:
    table = mxfp4.build_byte_table().view(torch.uint8).reshape(-1, 256, 2)
    for row, offset in enumerate(range(mxfp4.OFFSET_MIN, mxfp4.OFFSET_MAX + 1)):
        for code in range(16):
            expected = reference_e4m3(mxfp4_value(code, offset), negative=code >= 8)
            # code in the low nibble → first byte; in the high nibble → second byte
            assert int(table[row, code, 0]) == expected, (offset, code)
            assert int(table[row, code << 4, 1]) == expected, (offset, code)


def test_byte_table_never_leaves_neurons_range() -> None:
    table = mxfp4.build_byte_table().view(torch.uint8)
    assert not bool(((table & 0x78) == 0x78).any())
    assert float(table.view(FP8_DTYPE).float().abs().max()) <= 240.0


def test_low_nibble_is_the_even_element() -> None:
    blocks = torch.zeros((1, 1, 16), dtype=torch.uint8)
    blocks[0, 0, 0] = 0x21  # low nibble 1 (0.5), high nibble 2 (1.0)
    scales = torch.full((1, 1), 127, dtype=torch.uint8)
    decoded = mxfp4.decode(blocks, scales)
    assert decoded[0, :2].tolist() == [0.5, 1.0]
    t = mxfp4.channel_exponents(blocks, scales)
    assert int(t[0]) == -mxfp4.TOP_EXPONENT  # the largest value 1.0 = 2^0 lands on 2^7: t = 0 − 7
    encoded = mxfp4.encode(blocks, scales, t).view(FP8_DTYPE).float() * mxfp4.scale_values(t)[:, None]
    assert encoded[0, :2].tolist() == [0.5, 1.0]


def test_decode_matches_the_definition() -> None:
    generator = torch.Generator().manual_seed(1)
    blocks = torch.randint(0, 256, (3, 2, 16), dtype=torch.uint8, generator=generator)
    scales = torch.randint(100, 140, (3, 2), dtype=torch.uint8, generator=generator)
    decoded = mxfp4.decode(blocks, scales)
    for row in range(3):
        for column in range(64):
            block, within = divmod(column, 32)
            byte = int(blocks[row, block, within // 2])
            code = byte & 0x0F if within % 2 == 0 else byte >> 4
            expected = mxfp4_value(code, int(scales[row, block]) - 127)
            assert Fraction(float(decoded[row, column])) == expected


def _dequantized(blocks: torch.Tensor, scales: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    t = mxfp4.channel_exponents(blocks, scales)
    encoded = mxfp4.encode(blocks, scales, t)
    return encoded, encoded.view(FP8_DTYPE).double() * mxfp4.scale_values(t).double()[:, None]


@given(st.integers(0, 2**31), st.integers(1, 12), st.integers(1, 4), st.integers(2, 250))
def test_encode_is_exact_when_the_channel_spread_fits(seed: int, rows: int, groups: int, base: int) -> None:
    generator = torch.Generator().manual_seed(seed)
    blocks = torch.randint(0, 256, (rows, groups, 16), dtype=torch.uint8, generator=generator)
    low = min(base, 252 - 13)
    scales = torch.randint(low, low + 14, (rows, groups), dtype=torch.uint8, generator=generator)
    _, got = _dequantized(blocks, scales)
    assert torch.equal(got, mxfp4.decode(blocks, scales).double())
    t = mxfp4.channel_exponents(blocks, scales)
    assert mxfp4.exactness(blocks, scales, t).inexact == 0


@given(st.integers(0, 2**31), st.integers(1, 8), st.integers(1, 6))
def test_exactness_counts_what_a_brute_force_compare_finds(seed: int, rows: int, groups: int) -> None:
    generator = torch.Generator().manual_seed(seed)
    blocks = torch.randint(0, 256, (rows, groups, 16), dtype=torch.uint8, generator=generator)
    scales = torch.randint(0, mxfp4.MAX_SCALE_BYTE + 1, (rows, groups), dtype=torch.uint8, generator=generator)
    encoded, got = _dequantized(blocks, scales)
    wanted = mxfp4.decode(blocks, scales).double()
    wrong = got != wanted
    result = mxfp4.exactness(blocks, scales, mxfp4.channel_exponents(blocks, scales))
    assert result.values == blocks.numel() * 2
    assert result.inexact == int(wrong.sum())
    assert result.flushed_to_zero == int((wrong & (got == 0)).sum())
    rounded = wrong & (got != 0)  # flushed values are counted apart, never as relative error 1
    expected = float(((got - wanted).abs() / wanted.abs())[rounded].max()) if bool(rounded.any()) else 0.0
    assert result.max_rel_error == pytest.approx(expected) and result.max_rel_error < 1.0
    assert not bool(((encoded & 0x78) == 0x78).any())


@given(st.integers(0, 2**31), st.integers(1, 8), st.integers(1, 6))
def test_each_channels_largest_value_lands_on_128_or_192(seed: int, rows: int, groups: int) -> None:
    generator = torch.Generator().manual_seed(seed)
    blocks = torch.randint(0, 256, (rows, groups, 16), dtype=torch.uint8, generator=generator)
    scales = torch.randint(60, 200, (rows, groups), dtype=torch.uint8, generator=generator)
    blocks[0] = torch.where(torch.rand(blocks[0].shape, generator=generator) < 0.5, 0, 0x88)  # ±0 only
    encoded, _ = _dequantized(blocks, scales)
    largest = encoded.view(FP8_DTYPE).float().abs().amax(dim=1)
    assert float(largest[0]) == 0.0
    assert float(mxfp4.scale_values(mxfp4.channel_exponents(blocks, scales))[0]) == 1.0
    for value in largest[1:].tolist():
        assert value in (128.0, 192.0)


def test_signed_zero_survives() -> None:
    blocks = torch.full((1, 1, 16), 0x88, dtype=torch.uint8)  # every element −0
    scales = torch.full((1, 1), 127, dtype=torch.uint8)
    encoded = mxfp4.encode(blocks, scales, mxfp4.channel_exponents(blocks, scales))
    assert set(encoded.reshape(-1).tolist()) == {0x80}


def test_encoder_refuses_other_shapes() -> None:
    encoder = mxfp4.ExpertEncoder(4, 2)
    with pytest.raises(ValueError, match="block shape"):
        encoder.channel_exponents(torch.zeros((4, 3, 16), dtype=torch.uint8), torch.zeros((4, 3), dtype=torch.uint8))


def test_encoder_buffers_are_reused_between_experts() -> None:
    encoder = mxfp4.ExpertEncoder(4, 2)
    generator = torch.Generator().manual_seed(3)
    results = []
    for rows in (4, 3):  # up to the capacity
        blocks = torch.randint(0, 256, (rows, 2, 16), dtype=torch.uint8, generator=generator)
        scales = torch.randint(120, 125, (rows, 2), dtype=torch.uint8, generator=generator)
        t = encoder.channel_exponents(blocks, scales)
        out = encoder.encode(blocks, scales, t)
        results.append(out.data_ptr())
        assert torch.equal(out, mxfp4.encode(blocks, scales, t))
    assert results[0] == results[1]


@given(st.integers(0, 2**31), st.integers(1, 6), st.integers(1, 5))
def test_block_top_exponents_follow_the_largest_code(seed: int, rows: int, groups: int) -> None:
    generator = torch.Generator().manual_seed(seed)
    blocks = torch.randint(0, 256, (rows, groups, 16), dtype=torch.uint8, generator=generator)
    keep = torch.randint(0, 8, (rows, groups, 1), generator=generator)  # sparse blocks: small codes only
    blocks = torch.where(torch.rand(blocks.shape, generator=generator) < 0.5, blocks & (keep * 0x11).to(torch.uint8), blocks)
    blocks[0, 0] = 0x88  # a block of −0 only has no value
    top = mxfp4.ExpertEncoder(rows, groups).block_top_exponents(blocks)
    exponent_of_code = {0: None, 1: -1, 2: 0, 3: 0, 4: 1, 5: 1, 6: 2, 7: 2}
    for row in range(rows):
        for group in range(groups):
            codes = [b & 7 for b in blocks[row, group].tolist()] + [(b >> 4) & 7 for b in blocks[row, group].tolist()]
            expected = exponent_of_code[max(codes)]
            got = int(top[row, group])
            assert (got < -100) if expected is None else got == expected
