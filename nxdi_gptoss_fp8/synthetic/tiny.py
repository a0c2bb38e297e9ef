"""Tiny, valid normalized checkpoints (custom profile) for demos and tests. Requires torch.

The values are random but real: BF16 tensors drawn from a seeded generator, expert weights
quantized expert-wise per channel to FP8 within ±240, padded rows and columns zero.
"""

from __future__ import annotations

import os
from typing import Any

import torch

from .. import format as fmt
from ..convert.fp8 import quantize_expertwise
from .tiny_stdlib import TINY_DIMS, TINY_MAX_SHARD_SIZE, write_tiny

__all__ = ["TINY_DIMS", "TINY_MAX_SHARD_SIZE", "make_tiny", "tiny_tensors"]


def _padded(values: torch.Tensor, shape: tuple[int, ...]) -> torch.Tensor:
    out = torch.zeros(shape, dtype=values.dtype)
    out[tuple(slice(0, n) for n in values.shape)] = values
    return out


def tiny_tensors(layout: fmt.Layout, *, seed: int = 0) -> dict[str, torch.Tensor]:
    """Every tensor of the namespace, with random values and zero padding."""
    dims, generator = layout.dims, torch.Generator().manual_seed(seed)
    h, i = dims.hidden_size, dims.intermediate_size
    hp, ip = layout.padded_hidden_size, layout.padded_intermediate_size

    def unpadded_shape(spec: fmt.TensorSpec) -> tuple[int, ...]:
        sizes = {hp: h, 2 * ip: 2 * i, ip: i} if (hp, ip) != (h, i) else {}
        return tuple(sizes.get(n, n) for n in spec.shape)

    tensors: dict[str, torch.Tensor] = {}
    for name, spec in fmt.expected_namespace(layout).items():
        if spec.dtype == fmt.F32:
            continue  # scales come with their weight
        shape = unpadded_shape(spec)
        if name.endswith(f"{fmt.GATE_UP}.weight"):
            # gate and up halves are each padded to I' (chunked layout)
            gate, up = torch.randn((dims.num_local_experts, h, 2 * i), generator=generator).chunk(2, dim=2)
            dense = torch.cat([_padded(gate, (gate.shape[0], hp, ip)), _padded(up, (up.shape[0], hp, ip))], dim=2)
        elif name.endswith(f"{fmt.GATE_UP}.bias"):
            gate, up = (0.1 * torch.randn((dims.num_local_experts, 2 * i), generator=generator)).chunk(2, dim=1)
            dense = torch.cat([_padded(gate, (gate.shape[0], ip)), _padded(up, (up.shape[0], ip))], dim=1)
        else:
            scale = 1.0 if "layernorm" in name or name == "norm.weight" else 0.05
            values = scale * torch.randn(shape, generator=generator)
            if "layernorm" in name or name == "norm.weight":
                values = 1.0 + 0.1 * values
            dense = _padded(values, spec.shape)
        if spec.dtype == fmt.F8_E4M3:
            q, s = quantize_expertwise(dense)
            tensors[name] = q
            tensors[fmt.scale_key_for(name)] = s  # type: ignore[index]
        else:
            tensors[name] = dense.to(torch.bfloat16)
    return tensors


def make_tiny(out: str | os.PathLike[str], **options: Any) -> str:
    """Write a valid tiny normalized checkpoint to ``out`` (custom profile unless the dimensions
    are a published profile's); returns the directory. The options (``dims``,
    ``padded_hidden_size``, ``padded_intermediate_size``, ``max_shard_size``, ``seed``,
    ``overwrite``) and the errors are ``tiny_stdlib.write_tiny``'s: ``ValueError`` before anything
    is written for dimensions, sizes or a seed it cannot write; ``overwrite`` replaces only an
    earlier normalized output, anything else is a ``ConversionError``."""
    return write_tiny(out, lambda layout, seed: tiny_tensors(layout, seed=seed).items(),
                      generator="nxdi-gptoss-fp8 make-tiny", **options)
