"""The format on the vLLM Neuron plugin's own GPT-OSS math: AWS's pure-CPU golden of the plugin's
GPT-OSS (the NKI library's ``gptoss_mxfp4_golden``, "extracted from vllm_neuron/model/gpt_oss/
model_mxfp4.py"), fed a normalized FP8 checkpoint mapped by the package's own functions
(``nxdi.plugin_experts`` for the experts, ``forward.hf_reference.renamed_tensors`` for the rest),
computes what the same golden computes from the MXFP4 source through its own loader: one decoder
layer (sliding and full attention, paged KV cache, fragmented blocks) at gpt-oss-20b's and
gpt-oss-120b's layer shapes, the checkpoint converted with the default padding and with
``--target nki-moe``; and the whole model's greedy decode for several steps (a tiny model of four
layers, and a two-layer gpt-oss-120b-shaped one). Negative controls, misreadings of the plugin's
expert layout, must fail the bound by far.

Opt-in (marker ``nki``): ``NKILIB_GOLDEN_SRC`` = a directory holding ``gptoss_mxfp4_golden/``
(never part of this repository; docs/vllm-neuron-plugin.md says how to assemble it).

Bound: relative L2 ≤ 2^-20 (float32 rounding of a few reductions), for the layer's contribution
(its output less its input) and for the logits; the greedy tokens must be equal. Converting a
published-style MXFP4 source is exact (docs/accuracy.md), so both sides hold the same float32
values and any difference is the mapping's. The controls must exceed even FP8's bound (2^-4), on a
source whose output channels differ in scale (``_source``).
Scale: the 20b layer holds its real 32 experts; the 120b-shaped layer and model hold 16 and 8
(a real 120b layer's experts are 12.7 GB of float32 for each side); vocabularies cut to 2048.
"""

from __future__ import annotations

import gc
import os
from collections.abc import Iterator
from dataclasses import dataclass, field, replace
from pathlib import Path
from types import ModuleType
from typing import Any

import nki_golden as ng
import pytest
import torch

from nxdi_gptoss_fp8 import format as fmt
from nxdi_gptoss_fp8.convert import SOURCE_MXFP4, convert
from nxdi_gptoss_fp8.loader import load_checkpoint
from nxdi_gptoss_fp8.nxdi.plugin_experts import PluginExperts, plugin_experts
from nxdi_gptoss_fp8.synthetic.sources import REALISTIC_SCALE_RANGE, source_config, source_tensors, write_source
from nxdi_gptoss_fp8.synthetic.tiny_stdlib import SOURCE_DIMS

NKILIB_GOLDEN_SRC = os.environ.get("NKILIB_GOLDEN_SRC")
pytestmark = [pytest.mark.nki, pytest.mark.skipif(not NKILIB_GOLDEN_SRC, reason=ng.ASSEMBLE)]

BOUND = 2**-20
FP8_BOUND = 2**-4
PADDINGS: dict[str, dict[str, Any]] = {"default": {}, "nki-moe": {"target": "nki-moe"}}
LAYER_SHAPES = {"20b": (fmt.PROFILE_20B, 32), "120b": (fmt.PROFILE_120B, 16)}
MODELS = {"tiny": replace(SOURCE_DIMS, num_hidden_layers=4),
          "120b-2-layers": replace(fmt.PROFILES[fmt.PROFILE_120B], num_hidden_layers=2, num_local_experts=8,
                                   vocab_size=2048)}
SEQUENCES, PRIOR, STEPS = 4, 160, 4  # PRIOR > the window (128): sliding and full attention differ


@pytest.fixture(scope="module")
def gold() -> Iterator[ModuleType]:
    assert NKILIB_GOLDEN_SRC is not None
    with ng.golden(NKILIB_GOLDEN_SRC) as module:
        yield module


def _source(root: Path, dims: fmt.ModelDims) -> Path:
    """A published-style MXFP4 source: block scales in the published checkpoints' range, each output
    channel lowered by 0-4 binades so that channels differ in scale, as trained ones do (otherwise
    every channel's largest value is 6 × 2^0 and a scale read from the wrong channel goes unseen)."""
    tensors = source_tensors(dims, SOURCE_MXFP4, scale_range=REALISTIC_SCALE_RANGE)
    for name in [name for name in tensors if name.endswith("_scales")]:
        rows = tensors[name].shape[1]
        lowered = tensors[name].to(torch.int32) - (torch.arange(rows) * 7 % 5)[None, :, None].to(torch.int32)
        tensors[name] = lowered.to(torch.uint8)
    return write_source(root / "source", tensors, source_config(dims, SOURCE_MXFP4), shards=1, original=False,
                        kind=SOURCE_MXFP4)


def _converted(source: Path, out: Path, padding: str) -> dict[str, torch.Tensor]:
    """The source converted into ``out``, loaded by the package's loader (stored names, mapped)."""
    convert(source, out, progress=False, **PADDINGS[padding])
    return load_checkpoint(out, None, allow_custom_model=True).state_dict


def _ours(gold: ModuleType, config: Any, stored: dict[str, torch.Tensor], dims: fmt.ModelDims,
          experts: dict[int, PluginExperts]) -> Any:
    return gold.build_golden_model(config, weights=ng.golden_state(stored, dims, lambda layer: experts[layer].dense()))


@dataclass
class LayerCase:
    """One decoder layer: the golden's outputs from the source and from each conversion, and what
    the controls need (the nki-moe conversion's non-expert weights and its mapped experts)."""

    name: str
    config: Any
    expected: dict[str, torch.Tensor] = field(default_factory=dict)  # attention → [T, H]
    found: dict[tuple[str, str], torch.Tensor] = field(default_factory=dict)  # (padding, attention) → [T, H]
    rest: dict[str, torch.Tensor] = field(default_factory=dict)
    experts: PluginExperts | None = None


def _decode(gold: ModuleType, case_config: Any, weights: dict[str, torch.Tensor], attention: str) -> torch.Tensor:
    return ng.decode_layer(gold, case_config, weights, sliding=attention == "sliding", sequences=SEQUENCES, prior=PRIOR)


@pytest.fixture(scope="module", params=list(LAYER_SHAPES))
def layer(request: pytest.FixtureRequest, gold: ModuleType, tmp_path_factory: pytest.TempPathFactory) -> LayerCase:
    profile, experts = LAYER_SHAPES[request.param]
    dims = replace(fmt.PROFILES[profile], num_hidden_layers=1, num_local_experts=experts, vocab_size=2048)
    root = tmp_path_factory.mktemp(f"golden-layer-{request.param}")
    source = _source(root, dims)
    case = LayerCase(request.param, ng.golden_config(gold, source))
    model = gold.build_golden_model(case.config, ckpt_dir=str(source))  # the golden's own MXFP4 loader
    case.expected = {attention: _decode(gold, case.config, ng.layer_weights(model, 0), attention)
                     for attention in ("sliding", "full")}
    del model
    for padding in PADDINGS:
        stored = _converted(source, root / padding, padding)
        mapped = {0: plugin_experts(stored, dims, 0)}
        model = _ours(gold, case.config, stored, dims, mapped)
        weights = ng.layer_weights(model, 0)
        for attention in ("sliding", "full"):
            case.found[padding, attention] = _decode(gold, case.config, weights, attention)
        if padding == "nki-moe":
            case.rest = {name: value for name, value in weights.items() if "gate_up" not in name and "down" not in name}
            case.experts = mapped[0]
        del model, weights
        gc.collect()
    return case


@pytest.mark.parametrize("attention", ["sliding", "full"])
@pytest.mark.parametrize("padding", list(PADDINGS))
def test_one_layer_of_the_checkpoint_computes_what_the_mxfp4_source_does(layer: LayerCase, padding: str,
                                                                           attention: str) -> None:
    found, expected = layer.found[padding, attention], layer.expected[attention]
    error = ng.relative_l2(found, expected)
    print(f"\n{layer.name} layer, {padding} padding, {attention} attention: relative L2 {error:.3g}, "
          f"max abs {float((found - expected).abs().max()):.3g}")
    assert error <= BOUND


def test_sliding_and_full_attention_differ_at_this_context(layer: LayerCase) -> None:
    """The window matters here, so both attention kinds are really exercised."""
    assert ng.relative_l2(layer.expected["sliding"], layer.expected["full"]) > FP8_BOUND


@pytest.mark.parametrize("layer", ["20b"], indirect=True)  # one shape: the controls fail by orders of magnitude
@pytest.mark.parametrize("control", list(ng.CONTROLS))
def test_a_misread_expert_layout_fails_the_bound(gold: ModuleType, layer: LayerCase, control: str) -> None:
    assert layer.experts is not None
    weights = {**layer.rest, **ng.CONTROLS[control](layer.experts).dense()}
    found = _decode(gold, layer.config, weights, "sliding")
    error = ng.relative_l2(found, layer.expected["sliding"])
    print(f"\n{layer.name} layer, {control}: relative L2 {error:.3g}")
    assert error > FP8_BOUND


@pytest.fixture(scope="module", params=list(MODELS))
def decoded(request: pytest.FixtureRequest, gold: ModuleType,
            tmp_path_factory: pytest.TempPathFactory) -> dict[str, tuple[list[torch.Tensor], list[list[int]]]]:
    """Greedy decode of the whole model from the source (the golden's loader) and from each conversion."""
    dims = MODELS[request.param]
    root = tmp_path_factory.mktemp(f"golden-model-{request.param}")
    source = _source(root, dims)
    config = ng.golden_config(gold, source)
    tokens = [(7 * sequence + 3) % dims.vocab_size for sequence in range(SEQUENCES)]
    prior = 20 if dims.sliding_window < PRIOR // 2 else PRIOR  # beyond the window either way
    model = gold.build_golden_model(config, ckpt_dir=str(source))
    runs = {"source": ng.decode_model(gold, model, tokens, STEPS, prior=prior)}
    del model
    paddings = list(PADDINGS) if request.param == "tiny" else ["nki-moe"]
    for padding in paddings:
        stored = _converted(source, root / padding, padding)
        experts = {layer: plugin_experts(stored, dims, layer) for layer in range(dims.num_hidden_layers)}
        model = _ours(gold, config, stored, dims, experts)
        runs[padding] = ng.decode_model(gold, model, tokens, STEPS, prior=prior)
        del model
        gc.collect()
    return runs


def test_the_whole_model_decodes_the_same_logits_and_tokens(decoded: dict[str, Any],
                                                            request: pytest.FixtureRequest) -> None:
    expected_logits, expected_tokens = decoded["source"]
    for padding in [name for name in decoded if name != "source"]:
        logits, tokens = decoded[padding]
        errors = [ng.relative_l2(found, expected) for found, expected in zip(logits, expected_logits, strict=True)]
        worst = max(float((f - e).abs().max()) for f, e in zip(logits, expected_logits, strict=True))
        print(f"\n{request.node.callspec.id} model, {padding} padding, {STEPS} steps: relative L2 per step "
              f"{', '.join(f'{e:.3g}' for e in errors)}, max abs {worst:.3g}; tokens {tokens}")
        assert max(errors) <= BOUND
        assert tokens == expected_tokens
