"""A converted checkpoint's expert layer as the NKI library's MoE kernels take it, and the same
layer as transformers' GPT-OSS holds it: the two sides of ``test_nki_kernels``.

The views are what a GPT-OSS model class of the vLLM Neuron plugin would hand the kernels
(docs/vllm-neuron-plugin.md), the experts mapped by the package's ``nxdi.plugin_experts``: the
chunked gate|up weight ``[E, H', 2I']`` reshaped to ``[E, H', 2, I']`` (no copy), its ``[E, 1, 2I']`` scale viewed as ``[E, 2, I']`` for decode and
kept as stored for prefill, the down scale squeezed to ``[E, H']`` for decode, and the up half of
the gate|up bias raised by 1 (transformers adds 1 to the clamped up projection; the kernels have
no such step, so it is folded into the bias and the up clamp limits move by 1 with it). Geometry
other than the target's is refused, as the plugin's ``load_state_dict`` refuses a size mismatch.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

import torch

from nxdi_gptoss_fp8 import format as fmt
from nxdi_gptoss_fp8.convert import non_expert_names
from nxdi_gptoss_fp8.nxdi.plugin_experts import PLUGIN_TARGET, plugin_experts

DECODE_H_MULTIPLE = 256  # the decode kernel's hidden-size tiling


class ShapeRefused(ValueError):
    """The checkpoint's expert tensors do not have the plugin's geometry."""


@dataclass(frozen=True)
class KernelInputs:
    """One layer's MoE parameters in the kernels' views (scales None: left out)."""

    gamma: torch.Tensor  # [H'] post-attention RMSNorm weight
    router_weight: torch.Tensor  # [H', E]
    router_bias: torch.Tensor  # [E]
    gate_up: torch.Tensor  # [E, H', 2, I'] FP8
    down: torch.Tensor  # [E, I', H'] FP8
    gate_up_bias: torch.Tensor  # [E, 2, I'], +1 on the up half
    down_bias: torch.Tensor  # [E, H']
    gate_up_scale: torch.Tensor | None  # [E, 1, 2I'] as stored
    down_scale: torch.Tensor | None  # [E, 1, H'] as stored

    @property
    def decode_gate_up_scale(self) -> torch.Tensor | None:
        return None if self.gate_up_scale is None else self.gate_up_scale.view(self.gate_up.shape[0], 2, -1)

    @property
    def decode_down_scale(self) -> torch.Tensor | None:
        return None if self.down_scale is None else self.down_scale.squeeze(1)

    def without_scales(self) -> KernelInputs:
        """Negative control: the FP8 bytes passed without their scales."""
        return replace(self, gate_up_scale=None, down_scale=None)

    def scales_read_interleaved(self) -> KernelInputs:
        """Negative control: the concatenated gate|up scale read as if gate and up alternated."""
        assert self.gate_up_scale is not None
        experts, _, two_i = self.gate_up_scale.shape
        misread = self.gate_up_scale.view(experts, two_i // 2, 2).transpose(1, 2).reshape(experts, 1, two_i)
        return replace(self, gate_up_scale=misread.contiguous())


def layer_tensors(tensors: dict[str, torch.Tensor], dims: fmt.ModelDims, layer: int) -> dict[str, torch.Tensor]:
    """One layer's MoE tensors of a converted checkpoint, keyed by their transformers role
    (``router.weight``, ``post_attention_layernorm.weight``, …) or our expert name."""
    hf_prefix = f"model.layers.{layer}."
    roles = ("mlp.router.weight", "mlp.router.bias", "post_attention_layernorm.weight")
    found = {hf.removeprefix(hf_prefix).removeprefix("mlp."): tensors[ours]
             for hf, ours in non_expert_names(dims).items() if hf.removeprefix(hf_prefix) in roles}
    prefix = fmt.layer_prefix(layer)
    for proj in (fmt.GATE_UP, fmt.DOWN):
        for part in ("weight", "scale", "bias"):
            found[f"{proj}.{part}"] = tensors[f"{prefix}{proj}.{part}"]
    return found


def plugin_views(found: dict[str, torch.Tensor], dims: fmt.ModelDims, *, target: Any = PLUGIN_TARGET) -> KernelInputs:
    """The kernels' views of one layer (``layer_tensors``) of a model of ``dims``; ``ShapeRefused``
    unless H' and I' are the target's (and H' tiles the decode kernel), as the plugin's
    ``load_state_dict`` refuses a size mismatch. The experts come from the package's mapping
    (``nxdi.plugin_experts``), the scales viewed as each kernel takes them."""
    gate_up, down = found[f"{fmt.GATE_UP}.weight"], found[f"{fmt.DOWN}.weight"]
    experts, hp, _ = gate_up.shape
    wanted = (experts, target.padded_hidden_size, 2 * target.padded_intermediate_size)
    if tuple(gate_up.shape) != wanted or tuple(down.shape) != (experts, wanted[2] // 2, wanted[1]):
        raise ShapeRefused(f"size mismatch for the experts: the plugin's GPT-OSS declares gate_up {list(wanted)} and "
                           f"down {[experts, wanted[2] // 2, wanted[1]]}, the checkpoint holds {list(gate_up.shape)} and "
                           f"{list(down.shape)} (convert with --target {target.name})")
    if hp % DECODE_H_MULTIPLE:
        raise ShapeRefused(f"H'={hp} is not a multiple of {DECODE_H_MULTIPLE}: the decode kernel cannot tile it")
    prefix = fmt.layer_prefix(0)
    stored = {f"{prefix}{proj}.{part}": found[f"{proj}.{part}"] for proj in (fmt.GATE_UP, fmt.DOWN)
              for part in ("weight", "scale", "bias")}
    mapped = plugin_experts(stored, dims, 0, target=target)
    return KernelInputs(
        gamma=found["post_attention_layernorm.weight"],
        router_weight=found["router.weight"].transpose(0, 1).contiguous(),
        router_bias=found["router.bias"],
        gate_up=mapped.gate_up, down=mapped.down,
        gate_up_bias=mapped.gate_up_bias.to(torch.bfloat16), down_bias=found[f"{fmt.DOWN}.bias"],
        gate_up_scale=mapped.gate_up_scale.reshape(experts, 1, -1), down_scale=mapped.down_scale[:, None],
    )


def blocks(affinities: torch.Tensor, block_size: int) -> tuple[torch.Tensor, torch.Tensor]:
    """``moe_cte``'s routing tables for dense ``affinities`` [T, E] (zero: not routed): each
    expert's tokens in blocks of ``block_size``, the unused slots pointing at the padding row T."""
    tokens, experts = affinities.shape
    positions, owners = [], []
    for expert in range(experts):
        routed = torch.nonzero(affinities[:, expert]).flatten().tolist()
        for start in range(0, len(routed), block_size):
            chunk = routed[start:start + block_size]
            positions += chunk + [tokens] * (block_size - len(chunk))
            owners.append(expert)
    return torch.tensor(positions, dtype=torch.int32), torch.tensor(owners, dtype=torch.int32)


def relative_l2(found: torch.Tensor, expected: torch.Tensor) -> float:
    """‖found − expected‖ / ‖expected‖ in float64."""
    found64, expected64 = found.double(), expected.double()
    return float(torch.linalg.vector_norm(found64 - expected64) / torch.linalg.vector_norm(expected64))
