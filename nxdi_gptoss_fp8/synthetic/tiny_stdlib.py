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
from collections.abc import Callable, Iterable, Iterator
from typing import Any

from .. import format as fmt
from ..padding import padding_region
from ..units import plural
from ..validate.config_fields import config_field_problems
from ..writer import CheckpointWriter

__all__ = [
    "MAX_TINY_BYTES", "MAX_TINY_TENSORS", "SEED_RANGE", "SOURCE_DIMS", "TINY_DIMS", "TINY_MAX_SHARD_SIZE",
    "check_seed", "count_problems", "dims_problems", "make_tiny_stdlib", "size_problems", "tensor_bytes", "tiny_layout", "write_tiny",
]

TINY_DIMS = fmt.ModelDims(
    num_hidden_layers=2, num_local_experts=4, hidden_size=64, intermediate_size=64,
    head_dim=16, num_attention_heads=4, num_key_value_heads=2, vocab_size=128,
    num_experts_per_tok=2, sliding_window=8,
)
# make-tiny --hf-* / --ct-fp8 sources: H ≠ I, so a missing transpose cannot hide behind a square shape
SOURCE_DIMS = fmt.ModelDims(
    num_hidden_layers=2, num_local_experts=3, hidden_size=64, intermediate_size=96,
    head_dim=16, num_attention_heads=4, num_key_value_heads=2, vocab_size=40,
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


# make-tiny writes test models: beyond these it is not tiny (minutes of work, gigabytes on disk);
# a full-size layout is scripts/sparse_checkpoint.py's job, or convert's.
MAX_TINY_BYTES = 256 * 10**6
MAX_TINY_TENSORS = 10_000
SEED_RANGE = (0, 2**63 - 1)


def dims_problems(dims: fmt.ModelDims, *, block: int | None = None) -> list[str]:
    """Why a checkpoint with these dimensions would not be valid, by the format's own rules: the
    ``config.json`` checks of the preflight (each field in 1 … 2^31, no more experts per token
    than experts, whole key/value head groups, a rotary embedding NxDI can compute) and, for an
    MXFP4 source (``block``), sizes that are whole MXFP4 blocks. Empty when it would be."""
    config = fmt.hf_config(dims)
    try:
        fmt.dims_from_config(config)
    except fmt.ConfigFieldError as exc:
        return [str(exc)]
    problems = [p.message.removeprefix(f"{fmt.CONFIG_FILE} has ")
                for p in config_field_problems(config, dims) if not p.warning]
    if block:
        problems += [f"{label}={size} is not a multiple of the MXFP4 block size {block} (convert would refuse the source)"
                     for label, size in (("hidden_size", dims.hidden_size), ("intermediate_size", dims.intermediate_size))
                     if size % block]
    return problems


def size_problems(layout: fmt.Layout) -> list[str]:
    """Why ``layout`` is too large for a tiny checkpoint (computed, never enumerated)."""
    per_layer = fmt.layer_specs(layout, 0)
    tensors = len(fmt.global_specs(layout)) + layout.dims.num_hidden_layers * len(per_layer)
    size = sum(spec.nbytes for spec in fmt.global_specs(layout)) + layout.dims.num_hidden_layers * sum(
        spec.nbytes for spec in per_layer)
    return count_problems(tensors, size)


def count_problems(tensors: int, size: int, what: str = "a tiny checkpoint") -> list[str]:
    """Why ``tensors`` tensors of ``size`` bytes in all are too many for ``what`` (the tiny caps,
    counted on what is written: the normalized checkpoint, or the source for a source writer)."""
    if tensors <= MAX_TINY_TENSORS and size <= MAX_TINY_BYTES:
        return []
    return [f"these dimensions mean {tensors:,} tensors and {plural(size, 'byte')}, more than {what}'s "
            f"{MAX_TINY_TENSORS:,} tensors and {MAX_TINY_BYTES:,} bytes: for a full-size layout use "
            "scripts/sparse_checkpoint.py (no data written), or convert a real checkpoint"]


def tiny_layout(dims: fmt.ModelDims, padded_hidden_size: int | None, padded_intermediate_size: int | None, *,
                block: int | None = None) -> fmt.Layout:
    """The layout of a tiny checkpoint (unpadded where no padded size is given), checked before
    anything is written: ``ValueError`` naming every problem of the dimensions (``dims_problems``),
    the padded sizes (smaller, or not a multiple of 32 larger) or the size (``size_problems``)."""
    problems = dims_problems(dims, block=block)
    if problems:
        raise ValueError("; ".join(problems))
    layout = fmt.Layout(dims, dims.hidden_size if padded_hidden_size is None else padded_hidden_size,
                        dims.intermediate_size if padded_intermediate_size is None else padded_intermediate_size)
    problems = layout.padding_problems() or size_problems(layout)
    if problems:
        raise ValueError("; ".join(problems))
    return layout


def check_seed(seed: int) -> int:
    """``seed`` if the random generators take it (0 … 2^63 - 1), else ``ValueError``."""
    if type(seed) is not int or not SEED_RANGE[0] <= seed <= SEED_RANGE[1]:
        raise ValueError(f"seed {seed!r} is not an integer in 0 … 2^63 - 1")
    return seed


def write_tiny(
    out: str | os.PathLike[str],
    values: Callable[[fmt.Layout, int], Iterable[tuple[str, Any]]],
    *,
    generator: str,
    dims: fmt.ModelDims = TINY_DIMS,
    padded_hidden_size: int | None = None,
    padded_intermediate_size: int | None = None,
    max_shard_size: int = TINY_MAX_SHARD_SIZE,
    seed: int = 0,
    overwrite: bool = False,
) -> str:
    """Write a valid tiny normalized checkpoint to ``out`` with provenance (``generator``, ``seed``);
    returns the directory. ``values(layout, seed)`` gives every name of the namespace with data the
    writer accepts: this module's bytes (``make_tiny_stdlib``) or ``tiny``'s torch tensors
    (``make_tiny``), the two sharing these options. ``ValueError`` before anything is written when
    the dimensions, padded sizes, size or seed are not ones it can write (``tiny_layout``,
    ``check_seed``). ``overwrite`` replaces only an earlier normalized output
    (``output_target.output_target``); anything else is a ``ConversionError``, nothing removed."""
    layout = tiny_layout(dims, padded_hidden_size, padded_intermediate_size)  # ValueError before any work
    tensors = values(layout, check_seed(seed))
    source = {"generator": generator, "seed": seed}
    with CheckpointWriter(out, layout, fmt.profile_for_dims(layout.dims), fmt.hf_config(layout.dims),
                          max_shard_size=max_shard_size, source=source, overwrite=overwrite) as writer:
        for name, data in tensors:
            writer.put(name, data)
        return writer.commit()


def _bytes_of_every_tensor(layout: fmt.Layout, seed: int) -> Iterator[tuple[str, bytes]]:
    rng = random.Random(seed)
    return ((name, tensor_bytes(spec, layout, rng)) for name, spec in fmt.expected_namespace(layout).items())


def make_tiny_stdlib(out: str | os.PathLike[str], **options: Any) -> str:
    """Write a valid tiny normalized checkpoint to ``out`` without torch; returns the directory.
    The options (``dims``, ``padded_hidden_size``, ``padded_intermediate_size``, ``max_shard_size``,
    ``seed``, ``overwrite``) and the errors are ``write_tiny``'s."""
    return write_tiny(out, _bytes_of_every_tensor, generator="nxdi-gptoss-fp8 (standard library)", **options)
