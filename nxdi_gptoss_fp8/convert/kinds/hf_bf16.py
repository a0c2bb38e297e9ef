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
from ...errors import ConversionError
from ...safeio.safetensors_header import TensorInfo
from ..fp8 import quantize_expertwise
from ..output import ExpertStats, Output, Workspace, hf_biases, put_biases, require_finite, require_normal_scales
from ..source import FLOAT_DTYPES, SourceReader, SourceSpec, expert_source_name, non_expert_specs
from .base import ExpertRows

__all__ = ["NAME", "HfBf16"]

NAME = "hf-bf16"


class HfBf16:
    """The HF BF16 source kind (see the module docstring)."""

    name = NAME
    description = "HF BF16 (model.layers.N.mlp.experts.gate_up_proj)"

    def recognizes(self, names: set[str]) -> bool:
        return expert_source_name(0, "gate_up_proj") in names

    def resolve(self, config: dict[str, Any], dims: fmt.ModelDims, tensors: dict[str, tuple[str, TensorInfo]],
                config_path: str, options: dict[str, Any]) -> dict[str, Any]:
        quant = config.get("quantization_config")
        method = quant.get("quant_method") if isinstance(quant, dict) else None
        if method is not None:
            raise ConversionError(
                f"{config_path}: tensors are dense but quantization_config.quant_method is {method!r}: "
                "config and weights come from different sets"
            )
        return {}

    def specs(self, dims: fmt.ModelDims, options: dict[str, Any]) -> dict[str, SourceSpec]:
        specs = non_expert_specs(dims)
        e, h, i = dims.num_local_experts, dims.hidden_size, dims.intermediate_size
        experts = {
            "gate_up_proj": (e, h, 2 * i),
            "gate_up_proj_bias": (e, 2 * i),
            "down_proj": (e, i, h),
            "down_proj_bias": (e, h),
        }
        for layer in range(dims.num_hidden_layers):
            for short, shape in experts.items():
                name = expert_source_name(layer, short)
                specs[name] = SourceSpec(name, shape, FLOAT_DTYPES)
        return specs

    def convert_experts(self, reader: SourceReader, layer: int, out: Output, layout: fmt.Layout,
                        workspace: Workspace) -> list[ExpertStats]:
        put_biases(out, layer, *hf_biases(reader, layer), layout)
        return [_projection(reader, layer, proj, out) for proj in (fmt.GATE_UP, fmt.DOWN)]

    def reference_rows(self, reader: SourceReader, layer: int, proj: str, expert: int) -> ExpertRows:
        short = "gate_up_proj" if proj == fmt.GATE_UP else "down_proj"
        rows = reader.slice(expert_source_name(layer, short))[expert].t()  # [2I, H] or [H, I], as stored
        return ExpertRows(rows, tuple(rows.shape), torch.float32)

    def reference_biases(self, reader: SourceReader, layer: int) -> tuple[torch.Tensor, torch.Tensor]:
        return hf_biases(reader, layer)


def _projection(reader: SourceReader, layer: int, proj: str, out: Output) -> ExpertStats:
    """All experts of one dense projection, one expert at a time, amax/240 scales."""
    short = "gate_up_proj" if proj == fmt.GATE_UP else "down_proj"
    name = f"{fmt.layer_prefix(layer)}{proj}"
    experts, rows_out, cols_out = out.shape(f"{name}.weight")
    scales_out = torch.empty((experts, 1, cols_out), dtype=torch.float32)
    stats = ExpertStats(f"{name}.weight")
    rel_sum, nonzero = 0.0, 0
    source_name = expert_source_name(layer, short)
    path = reader.source.tensors[source_name][0]
    for expert in range(experts):
        weight = reader.slice(source_name)[expert].float()  # gate_up [H, 2I]; down [I, H]
        reader.release()
        require_finite(weight, path, f"{source_name}[{expert}]")
        dense = torch.zeros((rows_out, cols_out), dtype=torch.float32)
        if proj == fmt.GATE_UP:
            h, two_i = weight.shape
            dense.view(rows_out, 2, cols_out // 2)[:h, :, : two_i // 2] = weight.view(h, two_i // 2, 2).permute(0, 2, 1)
        else:
            dense[: weight.shape[0], : weight.shape[1]] = weight
        q, scale = quantize_expertwise(dense.unsqueeze(0))
        scales_out[expert] = scale[0]
        error = (q.float() * scale - dense).abs()[0]
        mask = dense != 0
        kept = mask & (q[0].float() != 0)  # a value flushed to zero is counted apart, not as error 1
        rel = error[kept] / dense.abs()[kept]
        stats.values += weight.numel()
        stats.inexact += int((error != 0).sum())
        stats.flushed_to_zero += int((mask & (q[0].float() == 0)).sum())
        if rel.numel():
            stats.max_rel_error = max(stats.max_rel_error, float(rel.max()))
            rel_sum += float(rel.double().sum())
            nonzero += rel.numel()
        out.put(f"{name}.weight", q[0], offset=expert * rows_out * cols_out)
    require_normal_scales(scales_out, f"{name}.scale")
    out.put(f"{name}.scale", scales_out)
    stats.mean_rel_error = rel_sum / nonzero if nonzero else 0.0
    return stats
