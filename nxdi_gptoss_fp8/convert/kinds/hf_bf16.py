"""HF BF16 sources (transformers' ``GptOssExperts`` saved unquantized).

Experts are fused per layer and already input-dim first: ``gate_up_proj`` [E, H, 2I] (gate/up
interleaved on the last dim), ``down_proj`` [E, I, H]; biases as in MXFP4 sources. Each expert
is quantized afresh, per output channel, with ``amax / 240`` scales (at least float32's smallest
normal, 2^-126, for a channel of subnormal values); the report gives the relative errors. A NaN
or ±inf anywhere is refused.
"""

from __future__ import annotations

from typing import Any

import torch

from ... import format as fmt
from ...safeio.safetensors_header import TensorInfo
from .. import kernels
from ..fp8 import DenseEncoder, channel_scales, column_amax
from ..layout import scale_row
from ..mxfp4 import Exactness
from ..output import CHUNK_BYTES, ExpertStats, Lane, Output, Workspace, require_finite, stream_experts
from ..source import FLOAT_DTYPES, SourceReader, SourceSpec, expert_source_name
from .base import ExpertRows, FusedHfKind

__all__ = ["NAME", "HfBf16"]

NAME = "hf-bf16"
_TILE = 64


class HfBf16(FusedHfKind):
    """The HF BF16 source kind (see the module docstring)."""

    name = NAME
    description = "HF BF16 (model.layers.N.mlp.experts.gate_up_proj)"
    marker, quant_method, tensors_are = "gate_up_proj", None, "dense"

    def resolve(self, config: dict[str, Any], dims: fmt.ModelDims, tensors: dict[str, tuple[str, TensorInfo]],
                config_path: str, options: dict[str, Any]) -> dict[str, Any]:
        self.check_quant_method(config, config_path)
        return {}

    def specs(self, dims: fmt.ModelDims, options: dict[str, Any]) -> dict[str, SourceSpec]:
        e, h, i = dims.num_local_experts, dims.hidden_size, dims.intermediate_size
        shapes = {"gate_up_proj": (e, h, 2 * i), "gate_up_proj_bias": (e, 2 * i), "down_proj": (e, i, h),
                  "down_proj_bias": (e, h)}
        return self.fused_specs(dims, {short: (shape, FLOAT_DTYPES) for short, shape in shapes.items()})

    @staticmethod
    def projection(*args: Any) -> ExpertStats:
        return _projection(*args)

    def reference_rows(self, reader: SourceReader, layer: int, proj: str, expert: int) -> ExpertRows:
        short = "gate_up_proj" if proj == fmt.GATE_UP else "down_proj"
        rows = reader.slice(expert_source_name(layer, short))[expert].t()  # [2I, H] or [H, I], as stored
        return _DenseRows(rows, tuple(rows.shape), torch.float32)

class _DenseRows(ExpertRows):
    """Source rows [out, in] of an expert stored input-dim first: each block of rows is a
    transposed view, brought into float32 in tiles of ``_TILE`` columns (a strided copy in one
    piece misses the cache on every element and costs about three times as much)."""

    def decode(self, raw_rows: torch.Tensor, index: slice | torch.Tensor) -> torch.Tensor:
        if raw_rows.dim() != 2 or raw_rows.stride(-1) == 1:
            return raw_rows.to(self.dtype)
        values = torch.empty(raw_rows.shape, dtype=self.dtype)
        for start in range(0, raw_rows.shape[1], _TILE):
            values[:, start:start + _TILE].copy_(raw_rows[:, start:start + _TILE])
        return values


class _Requantized(Exactness):
    """``Exactness`` with what the mean relative error needs, summed over a projection's experts."""

    def __init__(self) -> None:
        super().__init__()
        self.nonzero, self.rel_sum = 0, 0.0

    def add(self, other: Exactness) -> None:
        super().add(other)
        if isinstance(other, _Requantized):
            self.nonzero += other.nonzero
            self.rel_sum += other.rel_sum


def _encode_expert(lane: Lane, weight: torch.Tensor, proj: str, padded_i: int, path: str,
                   where: str) -> tuple[Exactness, torch.Tensor]:
    """Quantize one dense expert (gate_up [H, 2I], interleaved columns; down [I, H]) into
    ``lane.buffer`` [in', out'] with amax/240 channel scales; returns its exactness and scale row."""
    compiled = kernels.AVAILABLE and weight.dtype == torch.bfloat16
    if compiled:
        bits = kernels.bf16_amax(weight)
        amax, finite = bits.view(torch.bfloat16).float(), not bool((bits >= 0x7F80).any())
    else:
        amax, finite = column_amax(weight)
    if not finite:
        require_finite(weight, path, where)
    scale = channel_scales(amax)
    result = _Requantized()
    if compiled:
        cols = weight.shape[1]
        dest = (kernels.gate_up_destinations(cols, padded_i) if proj == fmt.GATE_UP
                else torch.arange(cols, dtype=torch.int64))
        kept, inexact, nonzero, worst, rel_sum = kernels.bf16_encode(weight, scale, lane.buffer, dest)
        result.values, result.inexact, result.flushed_to_zero = weight.numel(), inexact, nonzero - kept
        result.max_rel_error, result.nonzero, result.rel_sum = worst, kept, rel_sum
        return result, scale_row(scale, proj == fmt.GATE_UP, padded_i, lane.buffer.shape[1])
    encoder: DenseEncoder = lane.tools
    if proj == fmt.GATE_UP:
        half = weight.shape[1] // 2
        gate, up = lane.buffer[:, :half], lane.buffer[:, padded_i:padded_i + half]

        def place(block: torch.Tensor, first: int) -> None:
            pairs = block.view(block.shape[0], half, 2)
            gate[first:first + block.shape[0]].copy_(pairs[..., 0])
            up[first:first + block.shape[0]].copy_(pairs[..., 1])
    else:
        columns = lane.buffer[:, : weight.shape[1]]

        def place(block: torch.Tensor, first: int) -> None:
            columns[first:first + block.shape[0]].copy_(block)

    error = encoder.encode(weight, scale, place)
    result.values, result.inexact, result.flushed_to_zero = error.values, error.inexact, error.flushed_to_zero
    result.max_rel_error, result.nonzero, result.rel_sum = error.max_rel_error, error.nonzero, error.rel_sum
    return result, scale_row(scale, proj == fmt.GATE_UP, padded_i, lane.buffer.shape[1])


def _projection(reader: SourceReader, layer: int, proj: str, out: Output, layout: fmt.Layout,
                workspace: Workspace) -> ExpertStats:
    """All experts of one dense projection, ``Workspace.LANES`` at a time, amax/240 scales."""
    short = "gate_up_proj" if proj == fmt.GATE_UP else "down_proj"
    name = f"{fmt.layer_prefix(layer)}{proj}"
    _, rows_out, cols_out = out.shape(f"{name}.weight")
    source_name = expert_source_name(layer, short)
    path, info = reader.source.tensors[source_name]
    lanes = workspace.lanes((rows_out, cols_out), "bf16", DenseEncoder)

    def load(expert: int) -> tuple[Any, ...]:
        return (reader.slice(source_name)[expert], proj, layout.padded_intermediate_size, path,
                f"{source_name}[{expert}]")

    per_expert = info.shape[1] * info.shape[2] * (fmt.DTYPE_BITS[info.dtype] // 8)
    total = _Requantized()
    stream_experts(reader, out, workspace, name, lanes, load, _encode_expert,
                   release_every=max(1, CHUNK_BYTES // per_expert), total=total)
    stats = ExpertStats.from_exactness(f"{name}.weight", total)
    stats.mean_rel_error = total.rel_sum / total.nonzero if total.nonzero else 0.0
    return stats
