"""The two sides of ``test_nki_golden``: GPT-OSS as AWS's CPU golden of the vLLM Neuron plugin
(the NKI library's ``gptoss_mxfp4_golden``) takes it, built from a normalized checkpoint (the
package's mapping: ``forward.hf_reference.renamed_tensors`` and ``nxdi.plugin_experts``) and from
the MXFP4 source (the golden's own loader); its paged-KV decode driven for both alike; the
negative controls as misreadings of the plugin's expert layout.
"""

from __future__ import annotations

import importlib
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import replace
from pathlib import Path
from types import ModuleType
from typing import Any

import torch

from nxdi_gptoss_fp8 import format as fmt
from nxdi_gptoss_fp8.forward.hf_reference import renamed_tensors
from nxdi_gptoss_fp8.nxdi.plugin_experts import PluginExperts

PACKAGE = "gptoss_mxfp4_golden"
COMMIT = "e9ef98fc47b3323bf0de8ebcc984b8e2f3adff07"
ASSEMBLE = (f"set NKILIB_GOLDEN_SRC to a directory holding {PACKAGE}/: the files of github:aws-neuron/nki-library at "
            f"{COMMIT[:12]}, test/integration/nkilib/experimental/gpt_oss/{PACKAGE}/, copied one by one "
            "(docs/vllm-neuron-plugin.md, Assembling the golden)")
BLOCK_SIZE = 16


@contextmanager
def golden(src: str) -> Iterator[ModuleType]:
    """The golden package imported from ``src`` (then removed from ``sys.path`` and ``sys.modules``)."""
    sys.path.insert(0, src)
    try:
        yield importlib.import_module(PACKAGE)
    finally:
        sys.path.remove(src)
        for name in [name for name in sys.modules if name == PACKAGE or name.startswith(f"{PACKAGE}.")]:
            del sys.modules[name]


def golden_config(gold: ModuleType, source: Path) -> Any:
    """The golden's configuration of ``source`` (its own config.json reader), computing in float32."""
    config = gold.GptOssConfig.from_hf_json(str(source / fmt.CONFIG_FILE))
    config.torch_dtype = torch.float32
    return config


def golden_state(stored: dict[str, torch.Tensor], dims: fmt.ModelDims,
                 experts: Callable[[int], dict[str, torch.Tensor]]) -> dict[str, torch.Tensor]:
    """The golden ``GptOssForCausalLM``'s state dict (float32) from a normalized checkpoint: the
    renamed tensors in its fused-attention layout (as its own loader fuses them), and each layer's
    dense experts from ``experts(layer)``."""
    f32 = torch.float32
    top = renamed_tensors(stored, dims, f32, layer=None)
    state = {"model.embed_tokens.weight": top["model.embed_tokens.weight"], "model.norm.weight": top["model.norm.weight"],
             "lm_head.weight": top["lm_head.weight"]}
    for layer in range(dims.num_hidden_layers):
        hf = renamed_tensors(stored, dims, f32, layer=layer)
        p = f"model.layers.{layer}."
        attn = f"{p}self_attn."
        state[f"{p}input_layernorm.weight"] = hf[f"{p}input_layernorm.weight"]
        state[f"{attn}qkv_proj_weight"] = torch.cat([hf[f"{attn}{x}_proj.weight"] for x in "qkv"]).t().contiguous()
        state[f"{attn}qkv_proj_bias"] = torch.cat([hf[f"{attn}{x}_proj.bias"] for x in "qkv"])
        state[f"{attn}o_proj_weight"] = hf[f"{attn}o_proj.weight"].t().contiguous()
        state[f"{attn}o_proj_bias"] = hf[f"{attn}o_proj.bias"]
        state[f"{attn}sinks"] = hf[f"{attn}sinks"]
        moe = f"{p}mlp.experts."
        state[f"{moe}post_attention_layernorm.weight"] = hf[f"{p}post_attention_layernorm.weight"]
        state[f"{moe}router_weight"] = hf[f"{p}mlp.router.weight"]
        state[f"{moe}router_bias"] = hf[f"{p}mlp.router.bias"]
        state.update({f"{moe}{name}": value for name, value in experts(layer).items()})
    return state


def layer_weights(model: Any, layer: int) -> dict[str, torch.Tensor]:
    """Decoder layer ``layer``'s weights of a golden model, as ``gptoss_mxfp4_decode_layer``'s keywords."""
    block = model.model.layers[layer]
    attn, moe = block.self_attn, block.mlp.experts
    return {
        "input_layernorm_weight": block.input_layernorm.weight, "qkv_proj_weight": attn.qkv_proj_weight,
        "qkv_proj_bias": attn.qkv_proj_bias, "o_proj_weight": attn.o_proj_weight, "o_proj_bias": attn.o_proj_bias,
        "sinks": attn.sinks, "post_attention_layernorm_weight": moe.post_attention_layernorm.weight,
        "router_weight": moe.router_weight, "router_bias": moe.router_bias, "gate_up_weight": moe.gate_up_weight,
        "gate_up_bias": moe.gate_up_bias, "down_weight": moe.down_weight, "down_bias": moe.down_bias,
    }


def _cache(gold: ModuleType, config: Any, layers: int, sequences: int, prior: int, seed: int) -> Any:
    """A paged KV cache (fragmented: blocks shuffled) holding ``prior`` random tokens per sequence."""
    per_sequence = (prior + 16) // BLOCK_SIZE + 2
    manager = gold.PagedKVManager(num_blocks=sequences * per_sequence, block_size=BLOCK_SIZE,
                                  kv_heads=config.num_key_value_heads, head_dim=config.head_dim, num_layers=layers,
                                  dtype=torch.float32, shuffle_blocks=True, seed=seed)
    generator = torch.Generator().manual_seed(seed)
    for sequence in range(sequences):
        manager.allocate_sequence(sequence, prior)
        for layer in range(layers):
            shape = (prior, config.num_key_value_heads, config.head_dim)
            manager.prefill_write(layer, sequence, torch.randn(shape, generator=generator),
                                  torch.randn(shape, generator=generator))
    return manager


def decode_layer(gold: ModuleType, config: Any, weights: dict[str, torch.Tensor], *, sliding: bool, sequences: int,
                 prior: int, seed: int = 0) -> torch.Tensor:
    """One decode step of one decoder layer through the golden's flat entry: the layer's
    contribution ``out − hidden`` [sequences, H] for random hidden states after ``prior`` cached tokens."""
    manager = _cache(gold, config, 1, sequences, prior, seed)
    ids = list(range(sequences))
    positions = manager.current_positions(ids)
    table = manager.block_table(ids)
    slots = manager.decode_slot_mapping(ids)
    hidden = torch.randn((sequences, config.hidden_size), generator=torch.Generator().manual_seed(seed + 1))
    cos, sin = gold.model.GptOssRotaryEmbedding(config)(positions, dtype=hidden.dtype)
    out = gold.gptoss_mxfp4_decode_layer(
        config, hidden, positions, cos, sin, **weights, k_cache=manager.k_caches[0], v_cache=manager.v_caches[0],
        block_table=table, slot_mapping=slots, sliding_window=config.sliding_window if sliding else None)
    return out - hidden


def decode_model(gold: ModuleType, model: Any, tokens: list[int], steps: int, *, prior: int,
                 seed: int = 0) -> tuple[list[torch.Tensor], list[list[int]]]:
    """``steps`` greedy decode steps of the whole golden model from ``tokens`` (one sequence
    each), after ``prior`` random cached tokens: each step's logits [sequences, vocab] and the
    greedy tokens it chose."""
    config = model.config
    manager = _cache(gold, config, config.num_hidden_layers, len(tokens), prior, seed)
    ids = list(range(len(tokens)))
    current, logits, chosen = torch.tensor(tokens), [], []
    for _ in range(steps):
        positions = manager.current_positions(ids)
        table = manager.block_table(ids)
        slots = manager.decode_slot_mapping(ids)
        step = gold.gptoss_mxfp4_decode(model, current, positions, manager.k_caches, manager.v_caches, table, slots)
        logits.append(step)
        current = step.argmax(dim=-1)
        chosen.append(current.tolist())
    return logits, chosen


# --------------------------------------------------------------------------- negative controls


def _gate_up_scale_read_interleaved(experts: PluginExperts) -> PluginExperts:
    stored = experts.gate_up_scale.reshape(experts.gate_up_scale.shape[0], -1)  # the checkpoint's [gate | up] order
    return replace(experts, gate_up_scale=stored.view(stored.shape[0], -1, 2).transpose(1, 2).contiguous())


def _gate_up_swapped(experts: PluginExperts) -> PluginExperts:
    raw = experts.gate_up_bias.clone()
    raw[:, 1] -= 1.0
    bias = raw.flip(1).contiguous()
    bias[:, 1] += 1.0  # the 1 still goes to what the misreading loader takes for up
    return replace(experts, gate_up=experts.gate_up.view(torch.uint8).flip(2).contiguous().view(experts.gate_up.dtype),
                   gate_up_scale=experts.gate_up_scale.flip(1).contiguous(), gate_up_bias=bias)


def _up_bias(delta: float) -> Callable[[PluginExperts], PluginExperts]:
    def control(experts: PluginExperts) -> PluginExperts:
        bias = experts.gate_up_bias.clone()
        bias[:, 1] += delta
        return replace(experts, gate_up_bias=bias)
    return control


CONTROLS: dict[str, Callable[[PluginExperts], PluginExperts]] = {
    "scales dropped": lambda experts: replace(experts, gate_up_scale=torch.ones_like(experts.gate_up_scale),
                                              down_scale=torch.ones_like(experts.down_scale)),
    "gate|up scale read interleaved": _gate_up_scale_read_interleaved,
    "+1 on the up bias missing": _up_bias(-1.0),
    "+1 on the up bias added twice": _up_bias(1.0),
    "gate and up swapped": _gate_up_swapped,
}


def relative_l2(found: torch.Tensor, expected: torch.Tensor) -> float:
    """‖found − expected‖ / ‖expected‖ in float64."""
    found64, expected64 = found.double(), expected.double()
    return float(torch.linalg.vector_norm(found64 - expected64) / torch.linalg.vector_norm(expected64))
