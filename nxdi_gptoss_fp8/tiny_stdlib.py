"""Tiny, valid normalized checkpoints written with the standard library alone (no torch).

``demo`` uses this, so the first command of the README runs on a bare Python. The bytes are
produced directly: FP8-E4M3 codes drawn from the codes within ±240 (never an all-ones
exponent), float32 scales as positive powers of two, BF16 values as the top half of float32
normals; padding (the format's padded rows and columns) is zero. Deterministic for a seed.
``tiny.make_tiny`` (torch) writes more realistic values by quantizing random weights.
"""

from __future__ import annotations

import os
import random
import struct
from collections.abc import Iterable
from typing import Any

from . import format as fmt
from .deep_scan import padding_region
from .writer import CheckpointWriter

TINY_DIMS = fmt.ModelDims(
    num_hidden_layers=2, num_local_experts=4, hidden_size=64, intermediate_size=64,
    head_dim=16, num_attention_heads=4, num_key_value_heads=2, vocab_size=128,
    num_experts_per_tok=2, sliding_window=8,
)
TINY_MAX_SHARD_SIZE = 64_000
_FP8_MAGNITUDES = range(0x01, 0x78)  # E4M3 codes up to 240 (0x77); 0x78 and up: |x| > 240 or NaN


def _bf16(value: float) -> bytes:
    return struct.pack("<f", value)[2:]  # little-endian: the high half is BF16 (truncated)


def tensor_bytes(spec: fmt.TensorSpec, layout: fmt.Layout, rng: random.Random) -> bytes:
    """The bytes of tensor ``spec``: random values, zero where the format's padding is."""
    experts, rows, cols = (1, 1, *spec.shape)[-3:]
    region = padding_region(spec.name, spec.shape, layout)
    norm = spec.name.endswith("norm.weight")
    out = bytearray()
    for _expert in range(experts):
        for row in range(rows):
            for col in range(cols):
                padded = region is not None and (
                    row >= region.row_start or any(start <= col < stop for start, stop in region.col_ranges)
                )
                if spec.dtype == fmt.F8_E4M3:
                    out.append(0 if padded else rng.choice(_FP8_MAGNITUDES) | rng.choice((0, 0x80)))
                elif spec.dtype == fmt.F32:  # expert scales: finite, > 0, also in padded channels
                    out += struct.pack("<f", 2.0 ** rng.randint(-12, -8))
                elif padded:
                    out += b"\x00\x00"
                else:
                    out += _bf16(1.0 + 0.1 * rng.gauss(0.0, 1.0) if norm else 0.05 * rng.gauss(0.0, 1.0))
    return bytes(out)


def tiny_layout(dims: fmt.ModelDims, padded_hidden_size: int | None, padded_intermediate_size: int | None) -> fmt.Layout:
    """The layout of a tiny checkpoint (unpadded where no padded size is given); ``ValueError``
    naming the problem when a padded size is smaller or not a multiple of 32 larger."""
    layout = fmt.Layout(dims, padded_hidden_size or dims.hidden_size, padded_intermediate_size or dims.intermediate_size)
    problems = layout.padding_problems()
    if problems:
        raise ValueError("; ".join(problems))
    return layout


def write_tiny(out: str | os.PathLike[str], layout: fmt.Layout, tensors: Iterable[tuple[str, Any]], *,
               generator: str, seed: int, max_shard_size: int, overwrite: bool) -> str:
    """Write ``tensors`` (every name of the namespace, with data the writer accepts) as a
    checkpoint of ``layout`` at ``out``, with provenance; returns the directory."""
    source = {"generator": generator, "seed": seed}
    with CheckpointWriter(out, layout, fmt.profile_for_dims(layout.dims), fmt.hf_config(layout.dims),
                          max_shard_size=max_shard_size, source=source, overwrite=overwrite) as writer:
        for name, data in tensors:
            writer.put(name, data)
        return writer.commit()


def make_tiny_stdlib(
    out: str | os.PathLike[str],
    *,
    dims: fmt.ModelDims = TINY_DIMS,
    padded_hidden_size: int | None = None,
    padded_intermediate_size: int | None = None,
    max_shard_size: int = TINY_MAX_SHARD_SIZE,
    seed: int = 0,
    overwrite: bool = False,
) -> str:
    """Write a valid tiny normalized checkpoint to ``out`` without torch; returns the directory."""
    layout = tiny_layout(dims, padded_hidden_size, padded_intermediate_size)
    rng = random.Random(seed)
    tensors = ((name, tensor_bytes(spec, layout, rng)) for name, spec in fmt.expected_namespace(layout).items())
    return write_tiny(out, layout, tensors, generator="nxdi-gptoss-fp8 (standard library)", seed=seed,
                      max_shard_size=max_shard_size, overwrite=overwrite)
