"""HF MXFP4 sources (the published openai/gpt-oss-20b and -120b HF sets).

Experts are fused per layer: ``gate_up_proj_blocks`` uint8 [E, 2I, H/32, 16] with
``…_scales`` [E, 2I, H/32] (rows interleaved: even = gate, odd = up), ``down_proj_blocks``
[E, H, I/32, 16]; biases ``gate_up_proj_bias`` [E, 2I], ``down_proj_bias`` [E, H]. Each
expert is re-encoded through the byte table of ``mxfp4`` with power-of-two channel scales,
exact wherever E4M3 can hold the value; the rest are counted.
"""

from __future__ import annotations

from typing import Any

import torch

from ... import format as fmt
from ...errors import ConversionError
from ...safeio.safetensors_header import TensorInfo
from .. import kernels, mxfp4
from ..layout import place_down, place_gate_up, scale_row
from ..output import CHUNK_BYTES, ExpertStats, Lane, Output, Workspace, stream_experts
from ..source import FLOAT_DTYPES, SourceReader, SourceSpec, expert_source_name
from .base import ExpertRows, FusedHfKind

__all__ = ["ENCODE_ROWS", "NAME", "HfMxfp4"]

NAME = "hf-mxfp4"
ENCODE_ROWS = 1024


class HfMxfp4(FusedHfKind):
    """The HF MXFP4 source kind (see the module docstring)."""

    name = NAME
    description = "HF MXFP4 (model.layers.N.mlp.experts.gate_up_proj_blocks/_scales)"
    marker, quant_method, tensors_are = "gate_up_proj_blocks", "mxfp4", "MXFP4 (…_blocks/_scales)"

    def resolve(self, config: dict[str, Any], dims: fmt.ModelDims, tensors: dict[str, tuple[str, TensorInfo]],
                config_path: str, options: dict[str, Any]) -> dict[str, Any]:
        self.check_quant_method(config, config_path)
        for label, size in (("hidden_size", dims.hidden_size), ("intermediate_size", dims.intermediate_size)):
            if size % mxfp4.BLOCK_SIZE:
                raise ConversionError(f"{config_path}: {label}={size} is not a multiple of the MXFP4 block size 32")
        return {}

    def specs(self, dims: fmt.ModelDims, options: dict[str, Any]) -> dict[str, SourceSpec]:
        e, h, i, b = dims.num_local_experts, dims.hidden_size, dims.intermediate_size, mxfp4.BLOCK_SIZE
        return self.fused_specs(dims, {
            "gate_up_proj_blocks": ((e, 2 * i, h // b, b // 2), ("U8",)),
            "gate_up_proj_scales": ((e, 2 * i, h // b), ("U8",)),
            "gate_up_proj_bias": ((e, 2 * i), FLOAT_DTYPES),
            "down_proj_blocks": ((e, h, i // b, b // 2), ("U8",)),
            "down_proj_scales": ((e, h, i // b), ("U8",)),
            "down_proj_bias": ((e, h), FLOAT_DTYPES),
        })

    @staticmethod
    def projection(*args: Any) -> ExpertStats:
        return _projection(*args)

    def reference_rows(self, reader: SourceReader, layer: int, proj: str, expert: int) -> ExpertRows:
        short = "gate_up_proj" if proj == fmt.GATE_UP else "down_proj"
        blocks = reader.slice(expert_source_name(layer, f"{short}_blocks"))[expert]
        scales = reader.slice(expert_source_name(layer, f"{short}_scales"))[expert]
        return _DecodedRows(blocks, scales)

class _DecodedRows(ExpertRows):
    """MXFP4 rows through ``mxfp4.decode`` (a value table and a power of two: shares nothing
    with the byte table), exact in float32."""

    def __init__(self, blocks: torch.Tensor, scales: torch.Tensor) -> None:
        super().__init__(blocks, (scales.shape[0], scales.shape[1] * mxfp4.BLOCK_SIZE), torch.float32)
        self.scales = scales

    def decode(self, raw_rows: torch.Tensor, index: slice | torch.Tensor) -> torch.Tensor:
        return mxfp4.decode(raw_rows, self.scales[index])


def _encode_expert(lane: Lane, blocks: torch.Tensor, scales: torch.Tensor, proj: str, padded_i: int,
                   where: str) -> tuple[mxfp4.Exactness, torch.Tensor]:
    """Encode one MXFP4 expert into ``lane.buffer``, ``ENCODE_ROWS`` source rows at a time;
    returns its exactness and scale row."""
    largest = int(scales.max())
    if largest > mxfp4.MAX_SCALE_BYTE:
        raise ConversionError(
            f"{where} holds scale byte {largest} (above {mxfp4.MAX_SCALE_BYTE}: NaN or beyond float32/BF16 "
            "range): corrupt source"
        )
    if kernels.AVAILABLE and blocks.is_contiguous() and scales.is_contiguous():
        rows = scales.shape[0]
        dest = (kernels.gate_up_destinations(rows, lane.buffer.shape[1] // 2) if proj == fmt.GATE_UP
                else torch.arange(rows, dtype=torch.int64))
        exponents, exactness = kernels.mxfp4_expert(blocks, scales, lane.buffer, dest)
        return exactness, scale_row(mxfp4.scale_values(exponents), proj == fmt.GATE_UP, padded_i, lane.buffer.shape[1])
    encoder: mxfp4.ExpertEncoder = lane.tools
    rows = scales.shape[0]
    exponents = torch.empty(rows, dtype=torch.int32)
    exactness = mxfp4.Exactness()
    place = place_gate_up if proj == fmt.GATE_UP else place_down
    for start in range(0, rows, encoder.capacity):
        stop = min(rows, start + encoder.capacity)
        part_blocks, part_scales = blocks[start:stop], scales[start:stop]
        t = encoder.channel_exponents(part_blocks, part_scales)
        place(encoder.encode(part_blocks, part_scales, t), lane.buffer, start)
        exactness.add(mxfp4.exactness(part_blocks, part_scales, t))
        exponents[start:stop] = t
    return exactness, scale_row(mxfp4.scale_values(exponents), proj == fmt.GATE_UP, padded_i, lane.buffer.shape[1])


def _projection(reader: SourceReader, layer: int, proj: str, out: Output, layout: fmt.Layout,
                workspace: Workspace) -> ExpertStats:
    """All experts of one MXFP4 projection through the byte table."""
    short = "gate_up_proj" if proj == fmt.GATE_UP else "down_proj"
    name = f"{fmt.layer_prefix(layer)}{proj}"
    blocks_name, scales_name = expert_source_name(layer, f"{short}_blocks"), expert_source_name(layer, f"{short}_scales")
    _, rows_out, cols_out = out.shape(f"{name}.weight")
    block_shape = reader.source.tensors[blocks_name][1].shape
    groups = block_shape[2]
    lanes = workspace.lanes((rows_out, cols_out), ("mxfp4", groups, ENCODE_ROWS),
                            lambda: mxfp4.ExpertEncoder(ENCODE_ROWS, groups))

    def load(expert: int) -> tuple[Any, ...]:
        return (reader.slice(blocks_name)[expert], reader.slice(scales_name)[expert], proj,
                layout.padded_intermediate_size, f"{scales_name}[{expert}]")

    per_chunk = max(1, CHUNK_BYTES // (block_shape[1] * block_shape[2] * block_shape[3]))
    exactness = stream_experts(reader, out, workspace, name, lanes, load, _encode_expert, release_every=per_chunk)
    return ExpertStats.from_exactness(f"{name}.weight", exactness)
