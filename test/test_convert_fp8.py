"""FP8 helpers: quantization within ±240 and the table decode."""

from __future__ import annotations

import pytest
import torch

from nxdi_gptoss_fp8.convert.fp8 import FP8_DTYPE, fp8_values, quantize_expertwise


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
