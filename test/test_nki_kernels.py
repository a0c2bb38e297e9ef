"""The format on the vLLM Neuron plugin's MoE kernels: a checkpoint converted with ``--target
nki-moe``, fed to the NKI library's torch references of ``moe_block_tkg`` (decode) and
``moe_cte`` (prefill, ``shard_on_I``) in the plugin's views (``nki_moe.plugin_views``), agrees with
transformers' GPT-OSS expert block holding the same dequantized weights, and with the BF16 source
within FP8's bound; the negative controls (scales left out, scales read as interleaved, an
unpadded checkpoint) fail. Opt-in: ``NKILIB_SRC`` = a checkout of github:aws-neuron/nki-library;
its proprietary ``nki`` import is stood in (``nki_standin``: import only, no kernel runs).

Bounds, relative L2 over the real H columns (float64):
- same dequantized weights: 2^-7. Both sides compute in float32 from the same BF16 input; the
  references round the expert outputs (decode) or their accumulation (prefill) to BF16, and a
  BF16 rounding is at most 2^-8 relative: a few of them stay under 2^-7.
- the BF16 source: 2^-4, the worst relative rounding of one E4M3 weight (half a step of its
  3-bit mantissa); amax/240 per-channel scaling keeps the values in E4M3's normal range.
Layer shapes: gpt-oss-20b's and gpt-oss-120b's (H = I = 2880, top-4, the published attention
shape) with 5 and 6 experts and one layer, padded to H' = I' = 3072.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import nki_moe
import nki_standin
import pytest
import torch
from safetensors.torch import load_file

from nxdi_gptoss_fp8 import format as fmt
from nxdi_gptoss_fp8.convert import SOURCE_BF16, convert
from nxdi_gptoss_fp8.forward.hf_reference import dequantized_layer
from nxdi_gptoss_fp8.forward.reference import reference_model, source_state_dict
from nxdi_gptoss_fp8.synthetic.sources import source_config, source_tensors, write_source

NKILIB_SRC = os.environ.get("NKILIB_SRC")
pytestmark = [
    pytest.mark.nki,
    pytest.mark.skipif(not NKILIB_SRC, reason="set NKILIB_SRC to a checkout of the NKI library (aws-neuron/nki-library)"),
]

SAME_WEIGHTS_BOUND = 2**-7
FP8_BOUND = 2**-4
SHAPES = {"20b": (fmt.PROFILE_20B, 5), "120b": (fmt.PROFILE_120B, 6)}
DECODE_TOKENS, PREFILL_TOKENS, BLOCK_SIZE = 4, 24, 8
RMS_NORM_EPS = 1e-5


@pytest.fixture(scope="module")
def refs() -> Iterator[dict[str, Any]]:
    """The two torch references and the enums they take, imported from NKILIB_SRC."""
    assert NKILIB_SRC is not None
    with nki_standin.installed(NKILIB_SRC):
        from nkilib.core.moe.moe_cte.moe_cte_torch import moe_cte_torch_ref
        from nkilib.core.moe_block.moe_block_tkg_torch import moe_block_tkg_torch_ref
        from nkilib.core.utils import common_types

        yield {"decode": moe_block_tkg_torch_ref, "prefill": moe_cte_torch_ref, "types": common_types}


@dataclass
class Layer:
    """One GPT-OSS layer: its source, its conversions with and without the target, and inputs."""

    dims: fmt.ModelDims
    config: dict[str, Any]
    source_state: dict[str, torch.Tensor]
    padded: dict[str, torch.Tensor]
    dequantized: dict[str, torch.Tensor]  # transformers' layer 0 from the converted checkpoint (the package's dequantizer)
    source: Path
    x: torch.Tensor  # [T, H] BF16 residual stream entering the block (decode)
    y: torch.Tensor  # [T, H] BF16 normalized hidden states (prefill)
    expected: dict[tuple[str, str], tuple[torch.Tensor, torch.Tensor]] = field(default_factory=dict)
    found: dict[str, torch.Tensor] = field(default_factory=dict)

    def unpadded(self) -> dict[str, torch.Tensor]:
        """The same source converted without the target (H' = H, I' = I)."""
        return nki_moe.layer_tensors(_converted(self.source, self.source.parent / "unpadded", self.dims), self.dims, 0)

    def transformers(self, weights: str, kernel: str) -> tuple[torch.Tensor, torch.Tensor]:
        """transformers' output [T, H] and routing [T, E] for the kernel's input, holding the
        ``"dequantized"`` converted weights or the BF16 ``"source"``'s (computed once)."""
        if (weights, kernel) not in self.expected:
            state = self.source_state if weights == "source" else self.dequantized
            self.expected[weights, kernel] = _expected(self, state, kernel)
        return self.expected[weights, kernel]


def _converted(source: Path, out: Path, dims: fmt.ModelDims, **options: Any) -> dict[str, torch.Tensor]:
    """Every tensor of ``source`` converted into ``out`` (NxDI's names)."""
    convert(source, out, progress=False, **options)
    tensors: dict[str, torch.Tensor] = {}
    for shard in sorted(out.glob("*.safetensors")):
        tensors.update(load_file(str(shard)))
    return tensors


@pytest.fixture(scope="module", params=list(SHAPES))
def layer(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Layer:
    profile, experts = SHAPES[request.param]
    dims = replace(fmt.PROFILES[profile], num_hidden_layers=1, num_local_experts=experts, vocab_size=64)
    root = tmp_path_factory.mktemp(f"nki-{request.param}")
    # above a tiny source's size cap (make_source's): written directly, seeded as make_source seeds
    source = write_source(root / "source", source_tensors(dims, SOURCE_BF16), source_config(dims, SOURCE_BF16),
                          shards=1, original=False, kind=SOURCE_BF16)
    converted = _converted(source, root / "nki-moe", dims, target="nki-moe")
    padded = nki_moe.layer_tensors(converted, dims, 0)
    dequantized = dequantized_layer(converted, 0, dims, torch.float32)
    config, state = source_state_dict(source, 1)
    generator = torch.Generator().manual_seed(len(request.param))
    x = torch.randn((DECODE_TOKENS, dims.hidden_size), generator=generator).to(torch.bfloat16)
    y = torch.randn((PREFILL_TOKENS, dims.hidden_size), generator=generator).to(torch.bfloat16)
    return Layer(dims, config, state, padded, dequantized, source, x, y)


def _block(layer: Layer, state: dict[str, torch.Tensor]) -> Any:
    """transformers' GptOssForCausalLM's layer 0 (float32) holding ``state``'s norm, router and experts."""
    wanted = ("post_attention_layernorm.weight", ".mlp.")
    held = {name: tensor for name, tensor in state.items() if name.startswith("model.layers.0.") and
            (name.endswith(wanted[0]) or wanted[1] in name)}
    return reference_model(layer.config, held, 1, strict=False).model.layers[0]


def _pad(values: torch.Tensor, width: int) -> torch.Tensor:
    out = torch.zeros((*values.shape[:-1], width), dtype=values.dtype)
    out[..., : values.shape[-1]] = values
    return out


def _clamps(layer: Layer) -> dict[str, float]:
    """transformers clamps the up projection to ±limit before adding 1; with the 1 folded into
    the up bias (``plugin_views``), the kernels clamp it to [1 − limit, 1 + limit]."""
    limit = float(layer.config["swiglu_limit"])
    return {"gate_clamp_upper_limit": limit, "up_clamp_lower_limit": 1.0 - limit, "up_clamp_upper_limit": 1.0 + limit}


def decode(refs: dict[str, Any], layer: Layer, views: nki_moe.KernelInputs) -> torch.Tensor:
    """``moe_block_tkg``'s reference (RMSNorm, router, experts) on ``layer.x``: [T, H']."""
    types = refs["types"]
    hp = views.gate_up.shape[1]
    out = refs["decode"](
        inp=_pad(layer.x, hp).reshape(DECODE_TOKENS, 1, hp), gamma=views.gamma,
        router_weights=views.router_weight, router_bias=views.router_bias,
        expert_gate_up_weights=views.gate_up, expert_down_weights=views.down,
        expert_gate_up_weights_scale=views.decode_gate_up_scale, expert_down_weights_scale=views.decode_down_scale,
        expert_gate_up_bias=views.gate_up_bias, expert_down_bias=views.down_bias,
        eps=RMS_NORM_EPS, top_k=layer.dims.num_experts_per_tok, router_act_fn=types.RouterActFnType.SOFTMAX,
        router_pre_norm=False, norm_topk_prob=False,
        expert_affinities_scaling_mode=types.ExpertAffinityScaleMode.POST_SCALE,
        hidden_act_fn=types.ActFnType.Swish, hidden_actual=layer.dims.hidden_size, **_clamps(layer),
    )["out"]
    return out.reshape(DECODE_TOKENS, hp)


def prefill(refs: dict[str, Any], layer: Layer, views: nki_moe.KernelInputs, affinities: torch.Tensor) -> torch.Tensor:
    """``moe_cte``'s reference (``shard_on_I``) on ``layer.y`` routed by ``affinities`` [T, E]: [T, H']."""
    hp = views.gate_up.shape[1]
    hidden = torch.cat([_pad(layer.y, hp), torch.zeros((1, hp), dtype=layer.y.dtype)])  # the padding token
    positions, owners = nki_moe.blocks(affinities, BLOCK_SIZE)
    masked = torch.cat([affinities, torch.zeros((1, affinities.shape[1]))]).reshape(-1, 1)
    out = refs["prefill"](
        hidden_states=hidden, expert_affinities_masked=masked, gate_up_proj_weight=views.gate_up,
        down_proj_weight=views.down, token_position_to_id=positions, block_to_expert=owners, block_size=BLOCK_SIZE,
        bwmm_func=nki_standin.BWMMFunc.SHARD_ON_INTERMEDIATE, gate_and_up_proj_bias=views.gate_up_bias,
        down_proj_bias=views.down_bias, gate_up_proj_scale=views.gate_up_scale, down_proj_scale=views.down_scale,
        activation_function=refs["types"].ActFnType.Swish, top_k=layer.dims.num_experts_per_tok, **_clamps(layer),
    )["output"]
    return out[:PREFILL_TOKENS]


def _expected(layer: Layer, state: dict[str, torch.Tensor], kernel: str) -> tuple[torch.Tensor, torch.Tensor]:
    """transformers' output of the block for the kernel's input, and the routing it chose ([T, E])."""
    block = _block(layer, state)
    with torch.no_grad():
        hidden = block.post_attention_layernorm(layer.x.float()) if kernel == "decode" else layer.y.float()
        out, scores = block.mlp(hidden[None])
    return out.reshape(hidden.shape), scores


def _run(refs: dict[str, Any], layer: Layer, views: nki_moe.KernelInputs, kernel: str) -> torch.Tensor:
    """The kernel reference's output [T, H'] (prefill routed as transformers routes)."""
    if kernel == "decode":
        return decode(refs, layer, views)
    return prefill(refs, layer, views, layer.transformers("dequantized", kernel)[1])


def _as_converted(refs: dict[str, Any], layer: Layer, kernel: str) -> torch.Tensor:
    """The kernel reference's output on the checkpoint in the plugin's views (computed once)."""
    if kernel not in layer.found:
        layer.found[kernel] = _run(refs, layer, nki_moe.plugin_views(layer.padded, layer.dims), kernel)
    return layer.found[kernel]


@pytest.mark.parametrize("kernel", ["decode", "prefill"])
def test_the_kernels_read_the_checkpoint_as_transformers_does(refs: dict[str, Any], layer: Layer, kernel: str) -> None:
    found, expected = _as_converted(refs, layer, kernel), layer.transformers("dequantized", kernel)[0]
    h = layer.dims.hidden_size
    error = nki_moe.relative_l2(found[:, :h], expected)
    print(f"\n{kernel} {layer.dims.num_local_experts} experts, same dequantized weights: relative L2 {error:.3g}")
    assert error <= SAME_WEIGHTS_BOUND
    assert not found[:, h:].any(), "the padded hidden columns must stay zero"


@pytest.mark.parametrize("kernel", ["decode", "prefill"])
def test_the_kernels_stay_within_fp8_of_the_source(refs: dict[str, Any], layer: Layer, kernel: str) -> None:
    found, expected = _as_converted(refs, layer, kernel), layer.transformers("source", kernel)[0]
    error = nki_moe.relative_l2(found[:, : layer.dims.hidden_size], expected)
    # the FP8 error as transformers itself sees it: the kernels add nothing beyond BF16 rounding
    own = nki_moe.relative_l2(layer.transformers("dequantized", kernel)[0], expected)
    print(f"\n{kernel} {layer.dims.num_local_experts} experts, BF16 source: relative L2 {error:.3g} "
          f"(transformers on the dequantized weights: {own:.3g})")
    assert error <= FP8_BOUND and abs(error - own) <= SAME_WEIGHTS_BOUND


@pytest.mark.parametrize("layer", ["20b"], indirect=True)  # one shape: the controls fail by orders of magnitude
@pytest.mark.parametrize("control", ["without_scales", "scales_read_interleaved"])
@pytest.mark.parametrize("kernel", ["decode", "prefill"])
def test_a_misread_checkpoint_fails_the_bound(refs: dict[str, Any], layer: Layer, kernel: str, control: str) -> None:
    views = getattr(nki_moe.plugin_views(layer.padded, layer.dims), control)()
    found, expected = _run(refs, layer, views, kernel), layer.transformers("dequantized", kernel)[0]
    error = nki_moe.relative_l2(found[:, : layer.dims.hidden_size], expected)
    print(f"\n{kernel} {layer.dims.num_local_experts} experts, {control}: relative L2 {error:.3g}")
    assert error > FP8_BOUND


@pytest.mark.parametrize("layer", ["20b"], indirect=True)
def test_an_unpadded_checkpoint_is_refused(layer: Layer) -> None:
    with pytest.raises(nki_moe.ShapeRefused, match=r"size mismatch.*--target nki-moe"):
        nki_moe.plugin_views(layer.unpadded(), layer.dims)
