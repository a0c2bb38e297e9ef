"""One decoder layer's experts of a normalized checkpoint in the vLLM Neuron plugin's layouts:
what a plugin GPT-OSS class holding FP8 experts would call (docs/vllm-neuron-plugin.md).

The plugin's GPT-OSS (and AWS's CPU reference of it, the NKI library's ``gptoss_mxfp4_golden``)
takes gate/up as ``[E, H', 2, I']`` (dim 2: gate, up), the up bias with the 1 of
*(clamped up + 1)* already added, and down as ``[E, I', H']``, with H' = I' = 3072 (the
``nki-moe`` target). ``plugin_experts`` maps a checkpoint's stored tensors to that: the FP8 bytes
as bytes (the gate|up weight only reshaped), the per-channel scales viewed to pair with them, the
bias raised by 1 on its up half, and any lesser padding widened to the target's with the
format's own padding (zero weights and biases, scale 1.0), which is exact. ``PluginExperts.dense``
gives the dequantized form at the model's real H and I, the golden's natural order. Requires torch.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

import torch

from .. import format as fmt
from ..errors import LoadError
from ..padding import TARGETS, ConversionTarget
from ..units import plural

__all__ = ["PLUGIN_TARGET", "PluginExperts", "plugin_experts"]

PLUGIN_TARGET = TARGETS["nki-moe"]


@dataclass(frozen=True)
class PluginExperts:
    """One layer's experts as an FP8 expert class of the plugin would hold them (E experts,
    padded H' and I', the model's real H and I)."""

    layer: int
    hidden_size: int  # H
    intermediate_size: int  # I
    gate_up: torch.Tensor  # FP8 [E, H', 2, I']: gate_up[e, :, 0] gate, [e, :, 1] up
    gate_up_scale: torch.Tensor  # float32 [E, 2, I']: the scale of gate_up[e, :, g, i]
    gate_up_bias: torch.Tensor  # float32 [E, 2, I'], 1 added to the up half
    down: torch.Tensor  # FP8 [E, I', H']
    down_scale: torch.Tensor  # float32 [E, H']: the scale of down[e, :, h]
    down_bias: torch.Tensor  # float32 [E, H']

    @property
    def padded_sizes(self) -> tuple[int, int]:
        """(H', I')."""
        return self.gate_up.shape[1], self.gate_up.shape[3]

    def dense(self, dtype: torch.dtype = torch.float32) -> dict[str, torch.Tensor]:
        """The dequantized experts at the real H and I (padding cropped), as the golden's
        ``gptoss_mxfp4_decode_layer`` takes them: ``gate_up_weight`` [E, H, 2, I],
        ``gate_up_bias`` [E, 2, I] (up + 1), ``down_weight`` [E, I, H], ``down_bias`` [E, H]."""
        h, i = self.hidden_size, self.intermediate_size
        experts = self.gate_up.shape[0]
        gate_up = torch.empty((experts, h, 2, i), dtype=dtype)
        down = torch.empty((experts, i, h), dtype=dtype)
        for expert in range(experts):  # one expert's float32 copy at a time; E4M3 → float32 and × are exact
            values = self.gate_up[expert, :h].float() * self.gate_up_scale[expert][None].float()
            gate_up[expert] = values[:, :, :i]
            down[expert] = (self.down[expert, :i].float() * self.down_scale[expert][None].float())[:, :h]
        return {"gate_up_weight": gate_up, "gate_up_bias": self.gate_up_bias[:, :, :i].to(dtype),
                "down_weight": down, "down_bias": self.down_bias[:, :h].to(dtype)}


def _widened(values: torch.Tensor, shape: tuple[int, ...], fill: float = 0.0) -> torch.Tensor:
    """``values`` at the leading corner of a ``shape`` tensor filled with ``fill`` (``values`` itself
    when the shapes agree); FP8 is copied as bytes."""
    if tuple(values.shape) == shape:
        return values
    raw = values.view(torch.uint8) if values.dtype == torch.float8_e4m3fn else values
    out = torch.full(shape, fill, dtype=raw.dtype)
    out[tuple(slice(0, n) for n in values.shape)] = raw
    return out.view(values.dtype) if raw is not values else out


def plugin_experts(stored: Mapping[str, torch.Tensor], dims: fmt.ModelDims, layer: int, *,
                   target: ConversionTarget | None = PLUGIN_TARGET) -> PluginExperts:
    """Layer ``layer``'s experts of a normalized checkpoint (``stored``: its tensors by stored
    name, as ``loader.load_state_dict`` or safetensors return them) in the plugin's layouts.

    ``target``: the geometry to hold them at (default ``nki-moe``: H' = I' = 3072); a checkpoint
    padded less is widened with zero weights and biases and scale 1.0 (the format's padding,
    exact), one padded more or to other dimensions is refused (``LoadError``). ``None`` keeps the
    checkpoint's own padded sizes.
    """
    prefix = fmt.layer_prefix(layer)
    gate_up_name, down_name = f"{prefix}{fmt.GATE_UP}", f"{prefix}{fmt.DOWN}"
    missing = [name for name in (f"{gate_up_name}.weight", f"{gate_up_name}.scale", f"{gate_up_name}.bias",
                                 f"{down_name}.weight", f"{down_name}.scale", f"{down_name}.bias") if name not in stored]
    if missing:
        raise LoadError(f"{missing[0]}: not in the tensors given for layer {layer} ({plural(len(missing), 'expert tensor')} "
                        "missing); pass every tensor of a normalized checkpoint (loader.load_state_dict)")
    gate_up, down = stored[f"{gate_up_name}.weight"], stored[f"{down_name}.weight"]
    experts, hp, two_ip = gate_up.shape
    ip = two_ip // 2
    h, i = dims.hidden_size, dims.intermediate_size
    if experts != dims.num_local_experts or tuple(down.shape) != (experts, ip, hp) or hp < h or ip < i:
        raise LoadError(f"{gate_up_name}.weight: shape {list(gate_up.shape)} (down {list(down.shape)}) is not a "
                        f"normalized checkpoint's for {plural(experts, 'expert')}, H={h}, I={i}; validate the checkpoint")
    want_h, want_i = (hp, ip) if target is None else (target.padded_hidden_size, target.padded_intermediate_size)
    if target is not None and (hp > want_h or ip > want_i):
        raise LoadError(f"{gate_up_name}.weight: padded to H'={hp}, I'={ip}, beyond the {target.name} target's "
                        f"H'={want_h}, I'={want_i}; convert the source again with --target {target.name}")
    gate_up_pairs = gate_up.reshape(experts, hp, 2, ip)  # chunked: the gate columns, then the up columns
    scale_pairs = stored[f"{gate_up_name}.scale"].reshape(experts, 2, ip)
    bias = _widened(stored[f"{gate_up_name}.bias"].to(torch.float32, copy=True).reshape(experts, 2, ip),
                    (experts, 2, want_i))
    bias[:, 1, :] += 1.0  # transformers' (clamped up + 1), folded into the bias as the plugin does
    return PluginExperts(
        layer=layer, hidden_size=h, intermediate_size=i,
        gate_up=_widened(gate_up_pairs, (experts, want_h, 2, want_i)),
        gate_up_scale=_widened(scale_pairs.to(torch.float32), (experts, 2, want_i), 1.0),
        gate_up_bias=bias,
        down=_widened(down, (experts, want_i, want_h)),
        down_scale=_widened(stored[f"{down_name}.scale"].to(torch.float32).reshape(experts, hp), (experts, want_h), 1.0),
        down_bias=_widened(stored[f"{down_name}.bias"].to(torch.float32), (experts, want_h)),
    )
