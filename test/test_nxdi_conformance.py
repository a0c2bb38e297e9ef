"""Conformance against the real NxDI: runs when NxDI is importable, or when ``NXDI_SRC`` points
to an NxDI source checkout (the Neuron-only packages are then stubbed so the pure-torch
conversion code runs on CPU); skipped otherwise.

* With the hook registered, NxDI's HF and legacy paths return exactly what they return without
  it (same keys, dtypes, bit-identical values), through NxDI's own ``checkpoint_loader_fn``.
* The normalized path returns, for the same FP8 weights, exactly what NxDI's legacy path returns
  for an FP8 legacy checkpoint (``mlp1_scale``/``mlp2_scale`` per (expert, row)) on every
  shared key; the keys that differ are exactly the documented ones.

Run: ``NXDI_SRC=/path/to/neuronx-distributed-inference python3 -m pytest -s test/test_nxdi_conformance.py``
"""

from __future__ import annotations

import contextlib
import importlib.util
import json
import os
import sys
import warnings
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
import torch
from safetensors.torch import save_file

sys.path.insert(0, os.path.dirname(__file__))

from nxdi_standin import neuron_stubs

from nxdi_gptoss_fp8 import format as fmt
from nxdi_gptoss_fp8 import nxdi_hook
from nxdi_gptoss_fp8.loader import load_state_dict
from nxdi_gptoss_fp8.tiny import TINY_DIMS

pytestmark = [pytest.mark.nxdi, pytest.mark.filterwarnings("ignore")]

SRC = os.environ.get("NXDI_SRC")
DIMS = TINY_DIMS
LAYERS = DIMS.num_hidden_layers


def _nxdi_context() -> contextlib.AbstractContextManager[None]:
    if importlib.util.find_spec("neuronx_distributed_inference") is not None and not SRC:
        return contextlib.nullcontext()
    if not SRC:
        pytest.skip("NxDI is not installed and NXDI_SRC is not set")
    src = os.path.join(SRC, "src")
    if not os.path.isdir(os.path.join(src, "neuronx_distributed_inference")):
        pytest.fail(f"NXDI_SRC={SRC} has no src/neuronx_distributed_inference")
    return neuron_stubs.installed(src)


@pytest.fixture(scope="module")
def modeling() -> Iterator[ModuleType]:
    """NxDI's real ``modeling_gpt_oss`` module (imported for this test module only)."""
    saved = {k: os.environ.get(k) for k in ("NEURON_PLATFORM_TARGET_OVERRIDE", fmt.ALLOW_CUSTOM_ENV, nxdi_hook.ENV_VAR)}
    os.environ.setdefault("NEURON_PLATFORM_TARGET_OVERRIDE", "trn2")  # else NeuronConfig asks the hardware
    os.environ[fmt.ALLOW_CUSTOM_ENV] = "1"
    try:
        with _nxdi_context():
            yield __import__(nxdi_hook.MODELING_MODULE, fromlist=["NeuronGptOssForCausalLM"])
            nxdi_hook.unregister()
    finally:
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value


@contextlib.contextmanager
def checkpoint_format(value: str | None, *, hooked: bool) -> Iterator[None]:
    previous = os.environ.get(nxdi_hook.ENV_VAR)
    if value is None:
        os.environ.pop(nxdi_hook.ENV_VAR, None)
    else:
        os.environ[nxdi_hook.ENV_VAR] = value
    if hooked:
        nxdi_hook.register()
    try:
        yield
    finally:
        nxdi_hook.unregister()
        if previous is None:
            os.environ.pop(nxdi_hook.ENV_VAR, None)
        else:
            os.environ[nxdi_hook.ENV_VAR] = previous


def loader_output(modeling: ModuleType, ckpt: Path, neuron_kwargs: dict[str, Any]) -> dict[str, torch.Tensor]:
    """NxDI's ``checkpoint_loader_fn`` output for ``ckpt`` with a GPT-OSS config built like NxDI's drivers do."""
    layers = [f"layers.{i}.self_attn" for i in range(LAYERS)]
    kwargs = {"quantized": True, "quantized_checkpoints_path": str(ckpt), "quantization_type": fmt.QUANTIZATION_TYPE,
              "quantization_dtype": fmt.QUANTIZATION_DTYPE, "modules_to_not_convert": ["lm_head", *layers],
              "logical_nc_config": 1, **neuron_kwargs}
    neuron_config = modeling.GptOssNeuronConfig(**kwargs)

    def load_config(config: Any) -> None:  # what NxDI's load_pretrained_config sets
        values = json.loads((ckpt / fmt.CONFIG_FILE).read_text())
        values.pop("torch_dtype", None)
        config.__dict__.update(values)
        config._name_or_path = str(ckpt)

    config = modeling.GptOssInferenceConfig(neuron_config, load_config=load_config)
    app = modeling.NeuronGptOssForCausalLM(str(ckpt), config)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return app.checkpoint_loader_fn()


def raw(tensor: torch.Tensor) -> bytes:
    return tensor.contiguous().reshape(-1).view(torch.uint8).numpy().tobytes()


def assert_identical(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor], keys: set[str]) -> None:
    for key in sorted(keys):
        assert a[key].dtype == b[key].dtype, f"{key}: {a[key].dtype} != {b[key].dtype}"
        assert a[key].shape == b[key].shape, f"{key}: {tuple(a[key].shape)} != {tuple(b[key].shape)}"
        assert raw(a[key]) == raw(b[key]), f"{key}: values differ"


# --------------------------------------------------------------------------- tiny source checkpoints


def write_indexed(out: Path, tensors: dict[str, torch.Tensor], config: dict[str, Any]) -> Path:
    """Two shards plus index and config, the way published checkpoints are laid out."""
    out.mkdir(parents=True)
    names = sorted(tensors)
    halves = {"model-00001-of-00002.safetensors": names[: len(names) // 2], "model-00002-of-00002.safetensors": names[len(names) // 2:]}
    weight_map = {}
    for shard, keys in halves.items():
        save_file({k: tensors[k].contiguous() for k in keys}, str(out / shard))
        weight_map.update(dict.fromkeys(keys, shard))
    total = sum(t.numel() * t.element_size() for t in tensors.values())
    (out / fmt.INDEX_FILE).write_text(json.dumps({"metadata": {"total_size": total}, "weight_map": weight_map}))
    (out / fmt.CONFIG_FILE).write_text(json.dumps(config))
    return out


def write_hf_mxfp4(out: Path, seed: int = 0) -> Path:
    """A tiny checkpoint in the published HF MXFP4 layout (``model.`` names, FP4 blocks + E8M0 scales)."""
    g = torch.Generator().manual_seed(seed)
    d = DIMS
    h, i, e, q, kv = d.hidden_size, d.intermediate_size, d.num_local_experts, d.num_attention_heads * d.head_dim, d.num_key_value_heads * d.head_dim

    def bf16(*shape: int) -> torch.Tensor:
        return (0.05 * torch.randn(shape, generator=g)).to(torch.bfloat16)

    def blocks(rows: int, cols: int) -> tuple[torch.Tensor, torch.Tensor]:
        packed = torch.randint(0, 256, (e, rows, cols // 32, 16), generator=g, dtype=torch.uint8)
        scales = torch.randint(118, 128, (e, rows, cols // 32), generator=g, dtype=torch.uint8)
        return packed, scales

    tensors = {"model.embed_tokens.weight": bf16(d.vocab_size, h), "lm_head.weight": bf16(d.vocab_size, h),
               "model.norm.weight": 1 + bf16(h)}
    for layer in range(LAYERS):
        p = f"model.layers.{layer}."
        gate_up_blocks, gate_up_scales = blocks(2 * i, h)
        down_blocks, down_scales = blocks(h, i)
        tensors |= {
            p + "input_layernorm.weight": 1 + bf16(h), p + "post_attention_layernorm.weight": 1 + bf16(h),
            p + "self_attn.q_proj.weight": bf16(q, h), p + "self_attn.q_proj.bias": bf16(q),
            p + "self_attn.k_proj.weight": bf16(kv, h), p + "self_attn.k_proj.bias": bf16(kv),
            p + "self_attn.v_proj.weight": bf16(kv, h), p + "self_attn.v_proj.bias": bf16(kv),
            p + "self_attn.o_proj.weight": bf16(h, q), p + "self_attn.o_proj.bias": bf16(h),
            p + "self_attn.sinks": bf16(d.num_attention_heads),
            p + "mlp.router.weight": bf16(e, h), p + "mlp.router.bias": bf16(e),
            p + "mlp.experts.gate_up_proj_blocks": gate_up_blocks, p + "mlp.experts.gate_up_proj_scales": gate_up_scales,
            p + "mlp.experts.gate_up_proj_bias": bf16(e, 2 * i),
            p + "mlp.experts.down_proj_blocks": down_blocks, p + "mlp.experts.down_proj_scales": down_scales,
            p + "mlp.experts.down_proj_bias": bf16(e, h),
        }
    config = fmt.hf_config(DIMS)
    config["quantization_config"] = {"quant_method": "mxfp4", "modules_to_not_convert": ["model.layers.*.self_attn"]}
    return write_indexed(out, tensors, config)


def _interleave(chunked: torch.Tensor, dim: int) -> torch.Tensor:
    """[gate | up] halves along ``dim`` → rows alternating gate, up (the OpenAI layout)."""
    gate, up = chunked.view(torch.uint8).chunk(2, dim=dim) if chunked.dtype == torch.float8_e4m3fn else chunked.chunk(2, dim=dim)
    woven = torch.stack([gate, up], dim=dim + 1).flatten(dim, dim + 1)
    return woven.view(torch.float8_e4m3fn) if chunked.dtype == torch.float8_e4m3fn else woven


def write_legacy_fp8(out: Path, normalized: Path) -> Path:
    """The same weights as the normalized checkpoint ``normalized``, in NxDI's legacy ``block.N``
    layout with FP8 experts and per-(expert, row) scales ``mlp1_scale`` [E,2I,1] / ``mlp2_scale`` [E,H,1]."""
    sd = load_state_dict(normalized, allow_custom_model=True)
    t = {"embedding.weight": sd["embed_tokens.weight"], "unembedding.weight": sd["lm_head.weight"], "norm.scale": sd["norm.weight"]}
    for layer in range(LAYERS):
        n, b = f"layers.{layer}.", f"block.{layer}."
        t |= {
            b + "attn.norm.scale": sd[n + "input_layernorm.weight"], b + "mlp.norm.scale": sd[n + "post_attention_layernorm.weight"],
            b + "attn.qkv.weight": torch.cat([sd[n + f"self_attn.{p}_proj.weight"] for p in "qkv"]),
            b + "attn.qkv.bias": torch.cat([sd[n + f"self_attn.{p}_proj.bias"] for p in "qkv"]),
            b + "attn.sinks": sd[n + "self_attn.learned_sinks.sink"],
            b + "attn.out.weight": sd[n + "self_attn.o_proj.weight"], b + "attn.out.bias": sd[n + "self_attn.o_proj.bias"],
            b + "mlp.gate.weight": sd[n + "feed_forward.moe.router.linear_router.weight"],
            b + "mlp.gate.bias": sd[n + "feed_forward.moe.router.linear_router.bias"],
            b + "mlp.mlp1_weight": _interleave(sd[n + f"{fmt.GATE_UP}.weight"].transpose(1, 2), 1),
            b + "mlp.mlp1_scale": _interleave(sd[n + f"{fmt.GATE_UP}.scale"].transpose(1, 2), 1),
            b + "mlp.mlp1_bias": _interleave(sd[n + f"{fmt.GATE_UP}.bias"], 1),
            b + "mlp.mlp2_weight": sd[n + f"{fmt.DOWN}.weight"].transpose(1, 2),
            b + "mlp.mlp2_scale": sd[n + f"{fmt.DOWN}.scale"].transpose(1, 2),
            b + "mlp.mlp2_bias": sd[n + f"{fmt.DOWN}.bias"],
        }
    return write_indexed(out, t, json.loads((normalized / fmt.CONFIG_FILE).read_text()))


# --------------------------------------------------------------------------- the checks


VARIANTS: dict[str, dict[str, Any]] = {
    "defaults": {},
    "tp2-fused-vocab-dp-padlm": {"tp_degree": 2, "fused_qkv": True, "vocab_parallel": True, "attention_dp_degree": 2,
                                 "batch_size": 2, "is_continuous_batching": True, "lm_head_pad": True,
                                 "lm_head_pad_alignment_size": 3},
    "float32": {"torch_dtype": "float32", "lm_head_pad": True, "lm_head_pad_alignment_size": 3},
}


@pytest.mark.parametrize("value", [None, "hf", "HF"])
@pytest.mark.parametrize("variant", list(VARIANTS))
def test_hf_path_is_untouched_by_the_hook(modeling: ModuleType, tmp_path: Path, value: str | None, variant: str) -> None:
    source = write_hf_mxfp4(tmp_path / "hf")
    with checkpoint_format(value, hooked=False):
        plain = loader_output(modeling, source, VARIANTS[variant])
    with checkpoint_format(value, hooked=True):
        hooked = loader_output(modeling, source, VARIANTS[variant])
    assert list(hooked) == list(plain)
    assert_identical(hooked, plain, set(plain))
    assert f"layers.0.{fmt.GATE_UP}.weight" in plain and plain[f"layers.0.{fmt.GATE_UP}.weight"].dtype == torch.bfloat16
    print(f"conformance hf[{value}] {variant}: {len(plain)} keys identical with and without the hook")


@pytest.mark.parametrize("value", ["legacy", "neuron", ""])
@pytest.mark.parametrize("variant", list(VARIANTS))
def test_legacy_path_is_untouched_by_the_hook(modeling: ModuleType, tiny_template: Path, tmp_path: Path,
                                              value: str, variant: str) -> None:
    source = write_legacy_fp8(tmp_path / "legacy", tiny_template)
    with checkpoint_format(value, hooked=False):
        plain = loader_output(modeling, source, VARIANTS[variant])
    with checkpoint_format(value, hooked=True):
        hooked = loader_output(modeling, source, VARIANTS[variant])
    assert list(hooked) == list(plain)
    assert_identical(hooked, plain, set(plain))
    print(f"conformance legacy[{value!r}] {variant}: {len(plain)} keys identical with and without the hook")


NORMALIZED_VARIANTS: dict[str, tuple[dict[str, Any], str]] = {
    **{name: (kwargs, "tiny_template") for name, kwargs in VARIANTS.items()},
    "padded-96-128": ({"padded_hidden_size": 96, "padded_intermediate_size": 128}, "tiny_padded_template"),
}


@pytest.mark.parametrize("variant", list(NORMALIZED_VARIANTS))
def test_normalized_equals_nxdi_legacy_fp8_on_every_shared_key(modeling: ModuleType, tmp_path: Path, variant: str,
                                                              request: pytest.FixtureRequest) -> None:
    kwargs, template = NORMALIZED_VARIANTS[variant]
    normalized = request.getfixturevalue(template)
    legacy = write_legacy_fp8(tmp_path / "legacy", normalized)
    with checkpoint_format("legacy", hooked=True):
        expected = loader_output(modeling, legacy, kwargs)
    with checkpoint_format("normalized_fp8", hooked=True):
        ours = loader_output(modeling, normalized, kwargs)
    shared = set(ours) & set(expected)
    assert_identical(ours, expected, shared)
    # what differs is exactly what the contract documents (b.2): the legacy branch keeps its
    # source scale keys and adds neither post-attention nor final-norm unpadded weights
    leftovers = {f"block.{i}.mlp.{w}_scale" for i in range(LAYERS) for w in ("mlp1", "mlp2")}
    unpadded = {"norm.weight_unpadded"} | {f"layers.{i}.post_attention_layernorm.weight_unpadded" for i in range(LAYERS)}
    assert set(expected) - set(ours) == leftovers
    assert set(ours) - set(expected) == unpadded
    for key in unpadded:
        weight = ours[key.replace("weight_unpadded", "weight")]
        assert raw(ours[key]) == raw(weight[: DIMS.hidden_size])
    assert ours[f"layers.0.{fmt.GATE_UP}.weight"].dtype == torch.float8_e4m3fn
    assert ours[f"layers.0.{fmt.GATE_UP}.scale"].shape == (DIMS.num_local_experts, 1, 2 * (kwargs.get("padded_intermediate_size") or DIMS.intermediate_size))
    print(f"conformance normalized vs legacy FP8 {variant}: {len(shared)} shared keys bit-identical "
          f"(legacy-only: {len(set(expected) - set(ours))} source scales; ours-only: {len(unpadded)} unpadded norms)")


def test_config_opt_in_survives_nxdi_json_round_trip(modeling: ModuleType, tiny_template: Path) -> None:
    with checkpoint_format(None, hooked=True):
        neuron_config = modeling.GptOssNeuronConfig(checkpoint_format="normalized_fp8", logical_nc_config=1)
        config = modeling.GptOssInferenceConfig(neuron_config, load_config=lambda c: c.__dict__.update(
            {k: v for k, v in json.loads((tiny_template / fmt.CONFIG_FILE).read_text()).items() if k != "torch_dtype"}))
        reloaded = modeling.GptOssInferenceConfig.from_json_string(config.to_json_string())
        assert reloaded.neuron_config.checkpoint_format == "normalized_fp8"
        assert nxdi_hook.normalized_mode(reloaded, {}) is True


def test_cli_inference_demo_accepts_gpt_oss_in_nxdi_demo(modeling: ModuleType, capsys: pytest.CaptureFixture) -> None:
    """NxDI's inference_demo has no gpt_oss model type; after our CLI registers, it accepts it."""
    from nxdi_gptoss_fp8 import cli

    rng = torch.random.get_rng_state()  # importing inference_demo reseeds torch's global RNG
    try:
        with checkpoint_format(None, hooked=False), pytest.raises(SystemExit) as exited:
            cli.main(["inference-demo", "--model-type", "gpt_oss", "--task-type", "causal-lm", "run", "--help"])
    finally:
        torch.random.set_rng_state(rng)
    assert exited.value.code == 0, capsys.readouterr().err
    assert "--quantized-checkpoints-path" in capsys.readouterr().out
    demo = sys.modules[nxdi_hook.DEMO_MODULE]
    assert "gpt_oss" not in demo.MODEL_TYPES  # unregister removed the entry it added
