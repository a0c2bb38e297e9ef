"""Expert-wise, per-output-channel symmetric FP8-E4M3 quantization within Neuron's ±240.

``W[e, :, c] ≈ float(q[e, :, c]) × scale[e, 0, c]`` with ``|q| ≤ 240``: the layout NxD's
``expert_wise_per_channel_symmetric`` layers consume (docs/format.md, Layout rules). Requires torch.
"""

from __future__ import annotations

import torch

from ..format import FP8_MAX

__all__ = ["FP8_DTYPE", "MIN_NORMAL_SCALE", "fp8_values", "quantize_expertwise"]

FP8_DTYPE = torch.float8_e4m3fn
MIN_NORMAL_SCALE = torch.finfo(torch.float32).tiny  # 2^-126
# float32 values of every pair of E4M3 bytes, indexed by the pair read as one uint16: decoding
# by table is about twice as fast as torch's own float8 → float32 cast
_FP8_PAIRS = (torch.arange(1 << 16, dtype=torch.int32).to(torch.int16).view(torch.uint8).view(FP8_DTYPE)
              .float().view(torch.int64))


def fp8_values(q: torch.Tensor) -> torch.Tensor:
    """float32 values of the E4M3 bytes ``q`` (uint8 or float8, any shape), exactly."""
    q = q.contiguous().view(torch.uint8)
    if q.numel() % 2:
        return q.view(FP8_DTYPE).float()
    index = q.reshape(-1).view(torch.uint16).to(torch.int32)
    return _FP8_PAIRS.index_select(0, index).view(torch.float32).view(q.shape)


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
    amax = w.abs().amax(dim=1, keepdim=True)
    scale = torch.where(amax > 0, (amax / FP8_MAX).clamp(min=MIN_NORMAL_SCALE), torch.ones_like(amax))
    q = (w / scale).clamp(-FP8_MAX, FP8_MAX).to(FP8_DTYPE)
    return q, scale.contiguous()
