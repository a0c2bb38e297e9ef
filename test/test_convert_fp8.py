"""FP8 helpers: quantization within ±240, the table decode, and the blockwise encoder against the
one-piece quantization it replaces (0.3.0's masked statistics kept here as the oracle)."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from nxdi_gptoss_fp8.convert.fp8 import (
    FP8_DTYPE,
    DenseEncoder,
    channel_scales,
    column_amax,
    fp8_values,
    quantize_expertwise,
)


@pytest.mark.parametrize("shape", [(256, 256), (3, 5)], ids=["pairs", "odd-count"])
def test_fp8_values_match_torchs_cast(shape: tuple[int, int]) -> None:
    codes = torch.arange(256 * 256, dtype=torch.int32).to(torch.int16).view(torch.uint8)[: shape[0] * shape[1] * 2]
    q = codes[: shape[0] * shape[1]].reshape(shape)
    got, want = fp8_values(q), q.view(FP8_DTYPE).float()
    finite = ~torch.isnan(want)
    assert got.shape == want.shape and got.dtype == torch.float32
    assert torch.equal(got[finite], want[finite]) and bool(torch.isnan(got[~finite]).all())
    assert torch.equal(fp8_values(q.view(FP8_DTYPE)[:, ::2]).nan_to_num(), want[:, ::2].nan_to_num())


def test_quantize_expertwise_stays_within_neurons_range() -> None:
    weight = torch.randn((2, 8, 4), generator=torch.Generator().manual_seed(0))
    weight[1, :, 2] = 0.0
    q, scale = quantize_expertwise(weight)
    assert float(q.float().abs().max()) == 240.0
    assert float(scale[1, 0, 2]) == 1.0  # an all-zero channel keeps a finite, positive scale
    assert bool(((q.float() * scale - weight).abs() <= 8 * scale).all())  # half E4M3's largest step (16) below 240


# --------------------------------------------------------------------------- the blockwise encoder


def _oracle(weight: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, tuple[int, int, int, float, float]]:
    """The one-piece way with boolean masks: bytes, scales and (inexact, flushed, values kept
    non-zero, max relative error, summed relative error); a value flushed to zero is counted
    apart and left out of the relative errors."""
    dense = weight.float()
    q, scale = quantize_expertwise(dense.unsqueeze(0))
    error = (q.float() * scale - dense).abs()[0]
    mask = dense != 0
    kept = mask & (q[0].float() != 0)
    rel = error[kept] / dense.abs()[kept]
    stats = (int((error != 0).sum()), int((mask & (q[0].float() == 0)).sum()), rel.numel(),
             float(rel.max()) if rel.numel() else 0.0, float(rel.double().sum()))
    return q[0].view(torch.uint8), scale.reshape(-1), stats


def _weights(case: str) -> torch.Tensor:
    generator = torch.Generator().manual_seed(7)
    weight = 0.02 * torch.randn((96, 130), generator=generator)
    if case == "zeros":
        weight[weight.abs() < 0.01] = 0.0
        weight[:, 3] = 0.0  # an all-zero channel: scale 1.0
    elif case == "wide-range":
        weight *= torch.logspace(-45, 30, weight.shape[1], base=2.0)  # subnormal scales … huge values
    elif case == "subnormal":
        weight[::3] = 2.0**-130 * torch.sign(weight[::3])
    elif case == "negative-zero":
        weight[weight < 0] = -0.0
    return weight.to(torch.float32 if case == "float32" else torch.bfloat16)


@pytest.mark.parametrize("block_values", [1 << 17, 260, 3], ids=["one-block", "many-blocks", "two-rows"])
@pytest.mark.parametrize("case", ["normal", "zeros", "wide-range", "subnormal", "negative-zero", "float32"])
def test_dense_encoder_matches_the_one_piece_quantization(case: str, block_values: int) -> None:
    weight = _weights(case)
    want_q, want_scale, (inexact, flushed, nonzero, max_rel, rel_sum) = _oracle(weight)
    amax, finite = column_amax(weight)
    assert finite
    scale = channel_scales(amax)
    assert torch.equal(scale, want_scale)
    got = torch.full(want_q.shape, 0xAA, dtype=torch.uint8)

    def place(block: torch.Tensor, first: int) -> None:
        got[first:first + block.shape[0]] = block

    error = DenseEncoder(block_values).encode(weight, scale, place)
    assert torch.equal(got, want_q)
    assert (error.values, error.inexact, error.flushed_to_zero, error.nonzero) == (weight.numel(), inexact, flushed,
                                                                                  nonzero)
    assert error.max_rel_error == max_rel
    assert error.rel_sum == pytest.approx(rel_sum, rel=1e-12)  # the same terms; only the order of the sum differs


@pytest.mark.parametrize("value", [float("nan"), float("inf"), -float("inf")])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_column_amax_reports_non_finite_values(value: float, dtype: torch.dtype) -> None:
    weight = _weights("normal").to(dtype)
    assert column_amax(weight)[1]
    weight[5, 7] = value
    assert not column_amax(weight)[1]


@given(st.lists(st.floats(allow_nan=False, allow_infinity=False, width=32), min_size=6, max_size=60))
def test_column_amax_is_the_largest_magnitude(values: list[float]) -> None:
    weight = torch.tensor(values[: len(values) // 3 * 3]).reshape(-1, 3).to(torch.bfloat16)
    amax, finite = column_amax(weight)
    want = weight.float().abs().amax(dim=0)
    assert finite == bool(torch.isfinite(want).all())
    if finite:
        assert torch.equal(amax, want)
