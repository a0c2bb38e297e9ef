"""``nxdi.plugin_experts``: a normalized checkpoint's experts in the vLLM Neuron plugin's layouts.

The FP8 bytes stay the checkpoint's bytes; the scales pair with them; the up bias carries the 1;
widening to the target's padding is exact; the dense form equals the package's one dequantizer
(``forward.hf_reference.dequantized_layer``) de-interleaved; what cannot be mapped is refused.
Runs on tiny synthetic checkpoints (no golden, no NxDI). The golden's own comparison is
``test_nki_golden.py`` (opt-in).
"""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch

from nxdi_gptoss_fp8 import format as fmt
from nxdi_gptoss_fp8.errors import LoadError
from nxdi_gptoss_fp8.forward.hf_reference import dequantized_layer
from nxdi_gptoss_fp8.nxdi.plugin_experts import PLUGIN_TARGET, plugin_experts
from nxdi_gptoss_fp8.padding import ConversionTarget
from nxdi_gptoss_fp8.synthetic.tiny import TINY_DIMS, tiny_tensors

DIMS = replace(TINY_DIMS, num_hidden_layers=2, hidden_size=64, intermediate_size=96)
TARGET = ConversionTarget("tiny-target", 128, 160, "a tiny geometry for the tests", "tests only")
# (padded H', padded I') of the checkpoints mapped: unpadded, padded less than the target, the target's
PADDINGS = {"unpadded": (64, 96), "padded-less": (96, 128), "at-target": (128, 160)}


def _stored(padding: str, seed: int = 0) -> dict[str, torch.Tensor]:
    hp, ip = PADDINGS[padding]
    return tiny_tensors(fmt.Layout(DIMS, hp, ip), seed=seed)


def _names(layer: int) -> tuple[str, str]:
    prefix = fmt.layer_prefix(layer)
    return f"{prefix}{fmt.GATE_UP}", f"{prefix}{fmt.DOWN}"


@pytest.mark.parametrize("padding", list(PADDINGS))
@pytest.mark.parametrize("layer", [0, 1])
def test_the_fp8_bytes_are_the_checkpoints_bytes_in_the_plugins_layout(padding: str, layer: int) -> None:
    stored = _stored(padding)
    experts = plugin_experts(stored, DIMS, layer, target=TARGET)
    gate_up, down = _names(layer)
    hp, ip = PADDINGS[padding]
    e = DIMS.num_local_experts
    assert experts.gate_up.dtype == experts.down.dtype == torch.float8_e4m3fn
    assert tuple(experts.gate_up.shape) == (e, 128, 2, 160) and tuple(experts.down.shape) == (e, 160, 128)
    assert experts.padded_sizes == (128, 160)
    raw = stored[f"{gate_up}.weight"].view(torch.uint8)
    held = experts.gate_up.view(torch.uint8)
    assert torch.equal(held[:, :hp, 0, :ip], raw[:, :, :ip]) and torch.equal(held[:, :hp, 1, :ip], raw[:, :, ip:])
    assert torch.equal(experts.down.view(torch.uint8)[:, :ip, :hp], stored[f"{down}.weight"].view(torch.uint8))
    scale = stored[f"{gate_up}.scale"]
    assert torch.equal(experts.gate_up_scale[:, 0, :ip], scale[:, 0, :ip])
    assert torch.equal(experts.gate_up_scale[:, 1, :ip], scale[:, 0, ip:])
    assert torch.equal(experts.down_scale[:, :hp], stored[f"{down}.scale"][:, 0])


@pytest.mark.parametrize("padding", ["unpadded", "padded-less"])
def test_widening_to_the_target_adds_only_the_formats_padding(padding: str) -> None:
    experts = plugin_experts(_stored(padding), DIMS, 0, target=TARGET)
    hp, ip = PADDINGS[padding]
    assert not experts.gate_up.view(torch.uint8)[:, hp:].any() and not experts.gate_up.view(torch.uint8)[..., ip:].any()
    assert not experts.down.view(torch.uint8)[:, ip:].any() and not experts.down.view(torch.uint8)[..., hp:].any()
    assert torch.all(experts.gate_up_scale[..., ip:] == 1.0) and torch.all(experts.down_scale[:, hp:] == 1.0)
    assert not experts.gate_up_bias[:, 0, ip:].any() and torch.all(experts.gate_up_bias[:, 1, ip:] == 1.0)
    assert not experts.down_bias[:, hp:].any()


def test_the_up_bias_carries_the_one_and_the_gate_bias_does_not() -> None:
    stored = _stored("padded-less")
    experts = plugin_experts(stored, DIMS, 1, target=None)
    gate_up, _ = _names(1)
    raw = stored[f"{gate_up}.bias"].float()
    ip = PADDINGS["padded-less"][1]
    assert torch.equal(experts.gate_up_bias[:, 0], raw[:, :ip])
    assert torch.equal(experts.gate_up_bias[:, 1], raw[:, ip:] + 1.0)
    assert torch.equal(stored[f"{gate_up}.bias"].float(), raw), "the checkpoint's bias must stay as stored"


@pytest.mark.parametrize("padding", list(PADDINGS))
def test_the_dense_form_is_the_packages_dequantizer_deinterleaved(padding: str) -> None:
    stored = _stored(padding, seed=3)
    dense = plugin_experts(stored, DIMS, 1, target=TARGET).dense()
    hf = dequantized_layer(stored, 1, DIMS, torch.float32)
    experts = "model.layers.1.mlp.experts."
    gate_up = hf[f"{experts}gate_up_proj"]  # [E, H, 2I] interleaved: even gate, odd up
    assert torch.equal(dense["gate_up_weight"][:, :, 0], gate_up[..., 0::2])
    assert torch.equal(dense["gate_up_weight"][:, :, 1], gate_up[..., 1::2])
    bias = hf[f"{experts}gate_up_proj_bias"]
    assert torch.equal(dense["gate_up_bias"][:, 0], bias[:, 0::2])
    assert torch.equal(dense["gate_up_bias"][:, 1], bias[:, 1::2] + 1.0)
    assert torch.equal(dense["down_weight"], hf[f"{experts}down_proj"])
    assert torch.equal(dense["down_bias"], hf[f"{experts}down_proj_bias"])


def test_without_a_target_the_checkpoints_padding_is_kept() -> None:
    experts = plugin_experts(_stored("padded-less"), DIMS, 0, target=None)
    assert experts.padded_sizes == PADDINGS["padded-less"]


def test_the_default_target_is_the_plugins() -> None:
    assert (PLUGIN_TARGET.name, PLUGIN_TARGET.padded_hidden_size, PLUGIN_TARGET.padded_intermediate_size) == (
        "nki-moe", 3072, 3072)


def _drop_scale(stored: dict[str, torch.Tensor]) -> None:
    del stored[f"{_names(0)[0]}.scale"]


def _too_few_experts(stored: dict[str, torch.Tensor]) -> None:
    name = f"{_names(0)[0]}.weight"
    stored[name] = stored[name][:-1]


def _down_transposed(stored: dict[str, torch.Tensor]) -> None:
    name = f"{_names(0)[1]}.weight"
    stored[name] = stored[name].transpose(1, 2).contiguous()


FAULTS = {
    "a scale missing": (_drop_scale, "padded-less", r"gate_up_proj\.scale: not in the tensors"),
    "an expert missing": (_too_few_experts, "padded-less", r"is not a normalized checkpoint's for 3 experts"),
    "down stored transposed": (_down_transposed, "padded-less", r"is not a normalized checkpoint's"),
}


@pytest.mark.parametrize("fault", list(FAULTS))
def test_what_cannot_be_mapped_is_refused_naming_the_tensor(fault: str) -> None:
    corrupt, padding, message = FAULTS[fault]
    stored = _stored(padding)
    corrupt(stored)
    with pytest.raises(LoadError, match=message):
        plugin_experts(stored, DIMS, 0, target=TARGET)


def test_a_checkpoint_padded_beyond_the_target_is_refused_with_the_fix() -> None:
    smaller = ConversionTarget("small", 64, 96, "", "")
    with pytest.raises(LoadError, match=r"beyond the small target's H'=64, I'=96; convert the source again with "
                                        r"--target small"):
        plugin_experts(_stored("padded-less"), DIMS, 0, target=smaller)
