"""The NxDI hook against our stand-in of NxDI: registration, mode selection, pass-through,
the normalized path through NxDI's own loader entry points, fail-closed findings, the
save-quantized guard, the config round trip, the CLI and the vLLM plugin entry point."""

from __future__ import annotations

import hashlib
import json
import logging
import os
import re
import subprocess
import sys
import warnings
from collections.abc import Callable, Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import ckpt_edit
import nxdi_standin
import pytest
import torch

from nxdi_gptoss_fp8 import cli, errors
from nxdi_gptoss_fp8 import format as fmt
from nxdi_gptoss_fp8.errors import (
    CheckpointFormatError,
    IntegrityError,
    LoadError,
    LoadRefusedError,
    PreflightError,
    RegistrationError,
)
from nxdi_gptoss_fp8.nxdi import hook as nxdi_hook
from nxdi_gptoss_fp8.nxdi import vllm_plugin
from nxdi_gptoss_fp8.synthetic.sources import SOURCE_BF16, make_source, write_legacy_fp8

REPO = Path(__file__).resolve().parent.parent
# the stand-in's cast rule, like NxDI's, warns about every float32 scale it leaves alone
pytestmark = pytest.mark.filterwarnings("ignore:stand-in cast rule keeps scale")
FP8_NEURON_CONFIG: dict[str, Any] = {
    "quantized": True,
    "quantization_type": fmt.QUANTIZATION_TYPE,
    "quantization_dtype": fmt.QUANTIZATION_DTYPE,
    "modules_to_not_convert": ["lm_head", "self_attn"],
}


@pytest.fixture
def nxdi(monkeypatch: pytest.MonkeyPatch) -> Iterator[SimpleNamespace]:
    """Fresh stand-in NxDI modules under the real names; the hook is removed afterwards."""
    monkeypatch.delenv(nxdi_hook.ENV_VAR, raising=False)
    monkeypatch.setenv(fmt.ALLOW_CUSTOM_ENV, "1")
    with nxdi_standin.installed() as modules:
        yield modules


def make_config(nxdi: SimpleNamespace, ckpt: Path, **overrides: Any) -> Any:
    """NxDI's GPT-OSS InferenceConfig for ``ckpt`` as an application builds it."""
    modeling = nxdi.modeling_gpt_oss
    neuron_config = modeling.GptOssNeuronConfig(**{**FP8_NEURON_CONFIG, "quantized_checkpoints_path": str(ckpt), **overrides})

    def load(config: Any) -> None:
        for key, value in json.loads((ckpt / fmt.CONFIG_FILE).read_text()).items():
            setattr(config, key, value)
        config._name_or_path = str(ckpt)

    return modeling.GptOssInferenceConfig(neuron_config, load_config=load)


def app_state_dict(nxdi: SimpleNamespace, ckpt: Path, **overrides: Any) -> dict[str, torch.Tensor]:
    """What NxDI's ``checkpoint_loader_fn`` hands NxD, with ``_cast_helper`` warnings refused."""
    app_cls = nxdi.modeling_gpt_oss.NeuronGptOssForCausalLM
    app = app_cls(str(ckpt), make_config(nxdi, ckpt, **overrides))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        state_dict = app.checkpoint_loader_fn()
    casts = [str(w.message) for w in caught if "cast rule casts" in str(w.message)]
    assert not casts, f"_cast_helper had to copy: {casts}"
    return state_dict


def class_attrs(cls: type) -> dict[str, Any]:
    return dict(vars(cls))


# --------------------------------------------------------------------------- import isolation


def test_importing_the_package_imports_neither_nxdi_nor_torch() -> None:
    code = (
        "import sys, nxdi_gptoss_fp8, nxdi_gptoss_fp8.nxdi.hook, nxdi_gptoss_fp8.nxdi.vllm_plugin\n"
        "bad = sorted(m for m in sys.modules if m.split('.')[0] in ('neuronx_distributed_inference', 'torch'))\n"
        "print(bad)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO, check=True)
    assert out.stdout.strip() == "[]"


# --------------------------------------------------------------------------- registration


def test_register_patches_every_route_and_unregister_restores_exactly(nxdi: SimpleNamespace) -> None:
    app_cls = nxdi.modeling_gpt_oss.NeuronGptOssForCausalLM
    config_cls = nxdi.modeling_gpt_oss.GptOssNeuronConfig
    before_app, before_config = class_attrs(app_cls), class_attrs(config_cls)
    assert "gpt_oss" not in nxdi.inference_demo.MODEL_TYPES

    nxdi_hook.register()
    assert nxdi_hook.is_registered()
    installed = class_attrs(app_cls)
    for name in ("get_state_dict", "convert_hf_to_neuron_state_dict", "load_hf_model",
                 "save_quantized_state_dict", "generate_quantized_state_dict"):
        assert installed[name] is not before_app.get(name), name
    assert config_cls.__dict__["__init__"] is not before_config["__init__"]
    assert nxdi.constants.MODEL_TYPES["gpt_oss"]["causal-lm"] is app_cls  # the same, patched, class
    assert nxdi.inference_demo.MODEL_TYPES["gpt_oss"]["causal-lm"] is app_cls

    nxdi_hook.register()  # idempotent: nothing wrapped twice
    assert class_attrs(app_cls) == installed

    nxdi_hook.unregister()
    assert not nxdi_hook.is_registered()
    after_app, after_config = class_attrs(app_cls), class_attrs(config_cls)
    assert after_app.keys() == before_app.keys() and all(after_app[k] is before_app[k] for k in before_app)
    assert after_config.keys() == before_config.keys() and all(after_config[k] is before_config[k] for k in before_config)
    assert "gpt_oss" not in nxdi.inference_demo.MODEL_TYPES
    nxdi_hook.unregister()  # a second unregister is harmless


def test_register_leaves_an_unloaded_inference_demo_alone(monkeypatch: pytest.MonkeyPatch) -> None:
    with nxdi_standin.installed(with_demo=False) as modules:
        nxdi_hook.register()
        assert nxdi_hook.is_registered() and not hasattr(modules, "inference_demo")
        assert nxdi_hook.DEMO_MODULE not in sys.modules


def _drop(name: str) -> Callable[[SimpleNamespace], None]:
    def change(nxdi: SimpleNamespace) -> None:
        delattr(nxdi.application_base.NeuronApplicationBase, name)
    return change


def _static_get_state_dict(nxdi: SimpleNamespace) -> None:
    nxdi.application_base.NeuronApplicationBase.get_state_dict = staticmethod(lambda model_name_or_path, config: {})


def _renamed_convert_param(nxdi: SimpleNamespace) -> None:
    nxdi.modeling_gpt_oss.NeuronGptOssForCausalLM.convert_hf_to_neuron_state_dict = staticmethod(lambda sd, config: sd)


def _extra_required_param(nxdi: SimpleNamespace) -> None:
    def save_quantized_state_dict(cls: type, model_path: str, config: Any, target: str) -> None:
        return None
    nxdi.application_base.NeuronApplicationBase.save_quantized_state_dict = classmethod(save_quantized_state_dict)


def _foreign_model_type(nxdi: SimpleNamespace) -> None:
    nxdi.constants.MODEL_TYPES["gpt_oss"]["causal-lm"] = type("SomethingElse", (), {})


@pytest.mark.parametrize(("change", "expected"), [
    (_drop("generate_quantized_state_dict"), "generate_quantized_state_dict does not exist"),
    (_drop("checkpoint_loader_fn"), "checkpoint_loader_fn does not exist"),
    (_static_get_state_dict, "get_state_dict is a staticmethod, expected a classmethod"),
    (_renamed_convert_param, "convert_hf_to_neuron_state_dict(sd, config)"),
    (_extra_required_param, "save_quantized_state_dict(cls, model_path, config, target)"),
    (_foreign_model_type, "MODEL_TYPES['gpt_oss']['causal-lm'] is"),
], ids=["missing-method", "missing-loader", "wrong-kind", "renamed-param", "extra-param", "foreign-model-type"])
def test_register_refuses_an_nxdi_it_does_not_understand(nxdi: SimpleNamespace, change: Callable, expected: str) -> None:
    change(nxdi)
    app_cls = nxdi.modeling_gpt_oss.NeuronGptOssForCausalLM
    before = class_attrs(app_cls)
    with pytest.raises(RegistrationError, match="nothing was patched") as caught:
        nxdi_hook.register()
    assert expected in str(caught.value)
    assert class_attrs(app_cls) == before and not nxdi_hook.is_registered()


def test_register_without_nxdi_says_how_to_get_it(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, nxdi_hook.NXDI_PACKAGE, None)  # makes the import fail
    with pytest.raises(RegistrationError, match="install neuronx-distributed-inference"):
        nxdi_hook.register()
    assert not nxdi_hook.is_registered()


# --------------------------------------------------------------------------- mode selection


PASS_THROUGH = [None, "hf", "HF", "Hf", "legacy", "neuron", "original", "", " hf", "something-else"]
NEAR_MISSES = ["normalized-fp8", "normalised_fp8", "Normalized FP8", "fp8", "FP8", "normalized", "nfp8",
               "normalizedfp8", "normalized_fp16", "normalize_fp8", "normalized_f8", "nomralized_fp8",
               "e4m3", "norm_fp8",
               # look-alikes from other scripts, folded with NFKC
               "ｎｏｒｍａｌｉｚｅｄ＿ｆｐ８", "ＮＯＲＭＡＬＩＺＥＤ_ＦＰ８", "ＦＰ８", "𝐧𝐨𝐫𝐦𝐚𝐥𝐢𝐳𝐞𝐝_𝐟𝐩𝟖", "normalized_fp⁸"]


@pytest.mark.parametrize("value", PASS_THROUGH)
def test_other_values_are_not_near_misses(value: str | None) -> None:
    assert value is None or not nxdi_hook.is_near_miss(value)
    assert nxdi_hook.normalized_mode(None, {} if value is None else {nxdi_hook.ENV_VAR: value}) is False


@pytest.mark.parametrize("value", ["normalized_fp8", "NORMALIZED_FP8", " normalized_fp8\n"])
def test_exact_value_selects_the_normalized_path(value: str) -> None:
    assert nxdi_hook.normalized_mode(None, {nxdi_hook.ENV_VAR: value}) is True


@pytest.mark.parametrize("value", NEAR_MISSES)
def test_near_miss_spellings_are_errors(value: str) -> None:
    with pytest.raises(CheckpointFormatError, match="did you mean 'normalized_fp8'"):
        nxdi_hook.normalized_mode(None, {nxdi_hook.ENV_VAR: value})
    config = SimpleNamespace(neuron_config=SimpleNamespace(checkpoint_format=value))
    with pytest.raises(CheckpointFormatError, match=r"neuron_config\.checkpoint_format"):
        nxdi_hook.normalized_mode(config, {})


@pytest.mark.parametrize(("env", "config_value", "expected"), [
    (None, "normalized_fp8", True),
    ("normalized_fp8", "normalized_fp8", True),
    ("normalized_fp8", None, True),
    ("hf", "normalized_fp8", "contradicts"),
    ("legacy", "normalized_fp8", "contradicts"),
    ("", "normalized_fp8", "contradicts"),
    (None, "hf", "only opts in"),
    ("hf", "legacy", "only opts in"),
])
def test_config_opt_in_and_conflicts(env: str | None, config_value: str | None, expected: bool | str) -> None:
    config = SimpleNamespace(neuron_config=SimpleNamespace(checkpoint_format=config_value))
    environ = {} if env is None else {nxdi_hook.ENV_VAR: env}
    if isinstance(expected, bool):
        assert nxdi_hook.normalized_mode(config, environ) is expected
    else:
        with pytest.raises(CheckpointFormatError, match=expected):
            nxdi_hook.normalized_mode(config, environ)


# --------------------------------------------------------------------------- pass-through


def test_standin_cast_rule_reports_every_copy(nxdi: SimpleNamespace) -> None:
    """The harness above refuses casts by their warning: make sure a cast is reported."""
    state = {"w": torch.ones(2), "x.scale": torch.ones(2), "q": torch.ones(2, dtype=torch.float8_e4m3fn)}
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        nxdi.application_base.NeuronApplicationBase._cast_to_runtime_dtype(state, torch.bfloat16)
    assert [str(w.message) for w in caught if "cast rule casts" in str(w.message)] == [
        "stand-in cast rule casts w from torch.float32 to torch.bfloat16"]
    assert (state["w"].dtype, state["x.scale"].dtype, state["q"].dtype) == (torch.bfloat16, torch.float32, torch.float8_e4m3fn)


@pytest.fixture
def spies(nxdi: SimpleNamespace) -> dict[str, list]:
    """Replace the inherited loader methods by recording originals (before registering)."""
    calls: dict[str, list] = {"get_state_dict": [], "save_quantized_state_dict": [], "generate_quantized_state_dict": []}
    base = nxdi.application_base.NeuronApplicationBase

    def get_state_dict(cls: type, model_name_or_path: str, config: Any) -> Any:
        result = object()
        calls["get_state_dict"].append((cls, model_name_or_path, config, result))
        return result

    def save_quantized_state_dict(cls: type, model_path: str, config: Any) -> Any:
        result = object()
        calls["save_quantized_state_dict"].append((cls, model_path, config, result))
        return result

    def generate_quantized_state_dict(cls: type, model_path: str, config: Any) -> Any:
        result = object()
        calls["generate_quantized_state_dict"].append((cls, model_path, config, result))
        return result

    for func in (get_state_dict, save_quantized_state_dict, generate_quantized_state_dict):
        setattr(base, func.__name__, classmethod(func))
    nxdi_hook.register()
    return calls


@pytest.mark.parametrize("value", PASS_THROUGH)
def test_pass_through_calls_the_original_with_the_same_arguments(
    nxdi: SimpleNamespace, spies: dict[str, list], value: str | None, monkeypatch: pytest.MonkeyPatch,
) -> None:
    if value is not None:
        monkeypatch.setenv(nxdi_hook.ENV_VAR, value)
    app_cls = nxdi.modeling_gpt_oss.NeuronGptOssForCausalLM
    config = SimpleNamespace(neuron_config=SimpleNamespace())
    for name, kwargs in (("get_state_dict", {"config": config}), ("save_quantized_state_dict", {}),
                         ("generate_quantized_state_dict", {})):
        args = ("/some/path", config) if not kwargs else ("/some/path",)
        result = getattr(app_cls, name)(*args, **kwargs)
        (recorded,) = spies[name]
        assert recorded[:3] == (app_cls, "/some/path", config) and result is recorded[3], name

    state_dict: dict[str, Any] = {}
    model_config = SimpleNamespace(num_hidden_layers=1, neuron_config=SimpleNamespace(tp_degree=1))
    assert app_cls.convert_hf_to_neuron_state_dict(state_dict, model_config) is state_dict
    branch = "hf" if (value if value is not None else "hf").lower() == "hf" else "legacy"
    assert [(branch, id(state_dict))] == nxdi.modeling_gpt_oss.CALLS
    expected_error = FileNotFoundError if branch == "hf" else AssertionError
    with pytest.raises(expected_error):
        app_cls.load_hf_model("/some/hf/model")


def _write_hf_style(path: Path) -> Path:
    """A small indexed safetensors directory with ``model.`` names and a ``weight_scale``."""
    from safetensors.torch import save_file

    path.mkdir()
    tensors = {"model.embed_tokens.weight": torch.randn(8, 4), "model.layers.0.mlp.down.weight_scale": torch.ones(3),
               "lm_head.weight": torch.randn(8, 4, dtype=torch.bfloat16)}
    save_file(tensors, str(path / "model-00001-of-00001.safetensors"))
    index = {"metadata": {"total_size": 0}, "weight_map": dict.fromkeys(tensors, "model-00001-of-00001.safetensors")}
    (path / fmt.INDEX_FILE).write_text(json.dumps(index))
    return path


@pytest.mark.parametrize("value", [None, "hf", "legacy"])
def test_pass_through_output_is_bit_identical_to_nxdi_alone(
    nxdi: SimpleNamespace, tmp_path: Path, value: str | None, monkeypatch: pytest.MonkeyPatch,
) -> None:
    if value is not None:
        monkeypatch.setenv(nxdi_hook.ENV_VAR, value)
    source = _write_hf_style(tmp_path / "hf")
    app_cls = nxdi.modeling_gpt_oss.NeuronGptOssForCausalLM
    config = SimpleNamespace(num_hidden_layers=1, tie_word_embeddings=False,
                             neuron_config=SimpleNamespace(tp_degree=2, is_medusa=False))
    plain = app_cls.get_state_dict(str(source), config)
    nxdi_hook.register()
    hooked = app_cls.get_state_dict(str(source), config)
    assert list(hooked) == list(plain)
    for key in plain:
        assert hooked[key].dtype == plain[key].dtype and torch.equal(hooked[key], plain[key]), key


# --------------------------------------------------------------------------- normalized path


def canonical_keys(layout: fmt.Layout) -> set[str]:
    return set(fmt.expected_namespace(layout))


def derived_keys(layers: int, *, fused_qkv: bool = False, vocab_parallel: bool = False, tkg_sinks: bool = False,
                 lm_head_bias: bool = False) -> set[str]:
    keys = {"norm.weight_unpadded", "rank_util.rank"}
    for layer in range(layers):
        keys |= {f"layers.{layer}.input_layernorm.weight_unpadded", f"layers.{layer}.post_attention_layernorm.weight_unpadded",
                 f"layers.{layer}.self_attn.rank_util.rank"}
        if tkg_sinks:
            keys.add(f"layers.{layer}.self_attn.tkg_learned_sinks.sink")
        if fused_qkv:
            keys |= {f"layers.{layer}.self_attn.Wqkv.weight", f"layers.{layer}.self_attn.Wqkv.bias"}
    if vocab_parallel:
        keys.add("embed_tokens.rank_util.rank")
    if lm_head_bias:
        keys.add("lm_head.bias")
    return keys


def fused_away(layers: int) -> set[str]:
    return {f"layers.{i}.self_attn.{p}_proj.{part}" for i in range(layers) for p in "qkv" for part in ("weight", "bias")}


VARIANTS: dict[str, tuple[dict[str, Any], dict[str, bool]]] = {
    "defaults": ({}, {}),
    "tp2-fused-vocab-dp-padlm": (
        {"tp_degree": 2, "fused_qkv": True, "vocab_parallel": True, "attention_dp_degree": 2,
         "batch_size": 2, "is_continuous_batching": True, "lm_head_pad": True, "lm_head_pad_alignment_size": 3},
        {"fused_qkv": True, "vocab_parallel": True, "tkg_sinks": True, "lm_head_bias": True},
    ),
    "lnc2-no-pad-needed": ({"tp_degree": 4, "logical_nc_config": 2}, {}),
    "float32-no-cast": ({"torch_dtype": "float32", "lm_head_pad": True, "lm_head_pad_alignment_size": 3}, {"lm_head_bias": True}),
}


@pytest.mark.parametrize("variant", list(VARIANTS))
def test_normalized_output_is_canonical_plus_derived(
    nxdi: SimpleNamespace, tiny_template: Path, variant: str, monkeypatch: pytest.MonkeyPatch,
) -> None:
    overrides, derived = VARIANTS[variant]
    monkeypatch.setenv(nxdi_hook.ENV_VAR, "normalized_fp8")
    nxdi_hook.register()
    state_dict = app_state_dict(nxdi, tiny_template, **overrides)
    dims = fmt.dims_from_config(json.loads((tiny_template / fmt.CONFIG_FILE).read_text()))
    layout = fmt.Layout.unpadded(dims)
    expected = derived_keys(dims.num_hidden_layers, **derived) | canonical_keys(layout)
    if derived.get("fused_qkv"):
        expected -= fused_away(dims.num_hidden_layers)
    assert set(state_dict) == expected
    tp = overrides.get("tp_degree", 1)
    assert torch.equal(state_dict["rank_util.rank"], torch.arange(tp, dtype=torch.int32))
    final_float = torch.float32 if overrides.get("torch_dtype") == "float32" else torch.bfloat16
    for key, tensor in state_dict.items():
        spec = fmt.expected_namespace(layout).get(key)
        if spec is not None:
            assert tensor.dtype == {"BF16": torch.bfloat16, "F32": torch.float32, "F8_E4M3": torch.float8_e4m3fn}[spec.dtype]
            assert tuple(tensor.shape) == spec.shape
    if derived.get("lm_head_bias"):
        assert state_dict["lm_head.bias"].dtype == final_float and not state_dict["lm_head.bias"].any()
    if derived.get("vocab_parallel"):
        assert state_dict["embed_tokens.rank_util.rank"].dtype == torch.int64
    if derived.get("fused_qkv"):
        q = state_dict["layers.0.self_attn.Wqkv.weight"]
        assert q.shape == ((dims.num_attention_heads + 2 * dims.num_key_value_heads) * dims.head_dim, dims.hidden_size)


def test_padded_checkpoint_has_unpadded_norms_of_the_original_size(
    nxdi: SimpleNamespace, tiny_padded_template: Path, monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv(nxdi_hook.ENV_VAR, "normalized_fp8")
    nxdi_hook.register()
    state_dict = app_state_dict(nxdi, tiny_padded_template, padded_hidden_size=96, padded_intermediate_size=128)
    assert state_dict["norm.weight"].shape == (96,) and state_dict["norm.weight_unpadded"].shape == (64,)
    assert torch.equal(state_dict["layers.1.input_layernorm.weight_unpadded"], state_dict["layers.1.input_layernorm.weight"][:64])
    assert state_dict[f"layers.0.{fmt.GATE_UP}.weight"].shape == (4, 96, 256)


def test_config_opt_in_alone_selects_the_normalized_path(nxdi: SimpleNamespace, tiny_template: Path) -> None:
    nxdi_hook.register()
    state_dict = app_state_dict(nxdi, tiny_template, checkpoint_format="normalized_fp8")
    assert f"layers.0.{fmt.GATE_UP}.scale" in state_dict and nxdi.modeling_gpt_oss.CALLS == []


def test_fused_speculation_prefixes_draft_and_target(
    nxdi: SimpleNamespace, tiny_template: Path, monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv(nxdi_hook.ENV_VAR, "normalized_fp8")
    nxdi_hook.register()
    draft_config = make_config(nxdi, tiny_template)
    spec = SimpleNamespace(draft_model_path=str(tiny_template), draft_config=draft_config)
    config = make_config(nxdi, tiny_template, enable_fused_speculation=True)
    config.fused_spec_config = spec
    app = nxdi.modeling_gpt_oss.NeuronGptOssForCausalLM(str(tiny_template), config)
    state_dict = app.checkpoint_loader_fn()
    prefixes = {key.split(".", 1)[0] for key in state_dict}
    assert prefixes == {"draft_model", "target_model"}
    assert "draft_model.rank_util.rank" in state_dict and "target_model.lm_head.weight" in state_dict


def test_convert_and_load_hf_model_refuse_in_normalized_mode(nxdi: SimpleNamespace, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(nxdi_hook.ENV_VAR, "normalized_fp8")
    nxdi_hook.register()
    app_cls = nxdi.modeling_gpt_oss.NeuronGptOssForCausalLM
    with pytest.raises(LoadError, match="never converted"):
        app_cls.convert_hf_to_neuron_state_dict({}, SimpleNamespace(neuron_config=SimpleNamespace()))
    with pytest.raises(LoadError, match="no Hugging Face model"):
        app_cls.load_hf_model("/some/model")
    assert nxdi.modeling_gpt_oss.CALLS == []


def test_medusa_is_refused(nxdi: SimpleNamespace, tiny_template: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(nxdi_hook.ENV_VAR, "normalized_fp8")
    nxdi_hook.register()
    with pytest.raises(LoadError, match="Medusa"):
        app_state_dict(nxdi, tiny_template, is_medusa=True)


# --------------------------------------------------------------------------- fail closed


def _other_shard(ckpt: Path, key: str) -> str:
    return next(s for s in ckpt_edit.shards(ckpt) if s != ckpt_edit.shard_of(ckpt, key))


FAULTS: dict[str, tuple[Callable[[Path], None], str]] = {
    "filesystem": (lambda c: (c / "pytorch_model.bin").write_bytes(b"x"), "filesystem.stray_weight_file"),
    "index": (lambda c: ckpt_edit.edit_index(c, lambda i: i["metadata"].__setitem__("total_size", 1)), "index.total_size_mismatch"),
    "header": (lambda c: os.truncate(c / ckpt_edit.shards(c)[-1], 100), "header."),
    "ownership": (lambda c: ckpt_edit.edit_index(c, lambda i: i["weight_map"].__setitem__(
        "norm.weight", _other_shard(c, "norm.weight"))), "ownership.key_in_other_shard"),
    "collision": (lambda c: ckpt_edit.add_tensor(c, "norm.weight", torch.ones(64, dtype=torch.bfloat16),
                                                 shard=_other_shard(c, "norm.weight"), list_in_index=False), "collision.duplicate_tensor"),
    "namespace": (lambda c: ckpt_edit.add_tensor(c, "rank_util.rank", torch.arange(2, dtype=torch.int32)), "namespace.derived_key"),
    "dtype_shape": (lambda c: ckpt_edit.replace_tensor(c, "norm.weight", torch.ones(64)), "dtype_shape.wrong_dtype"),
    "sidecar": (lambda c: ckpt_edit.remove_tensor(c, ckpt_edit.DOWN_SCALE), "sidecar.missing_scale"),
    "values": (lambda c: ckpt_edit.replace_tensor(c, ckpt_edit.DOWN_SCALE, -torch.ones(4, 1, 64)), "values.bad_scale"),
    "config": (lambda c: ckpt_edit.edit_config(c, lambda d: d.__setitem__("model_type", "llama")), "config.wrong_model_type"),
}


@pytest.mark.parametrize("category", list(FAULTS))
def test_every_finding_category_fails_closed(
    nxdi: SimpleNamespace, tiny_checkpoint: Path, category: str, monkeypatch: pytest.MonkeyPatch,
) -> None:
    corrupt, code = FAULTS[category]
    corrupt(tiny_checkpoint)
    monkeypatch.setenv(nxdi_hook.ENV_VAR, "normalized_fp8")
    nxdi_hook.register()
    with pytest.raises(PreflightError) as caught:
        app_state_dict(nxdi, tiny_checkpoint)
    assert any(c.startswith(code) for c in caught.value.codes), caught.value.codes
    assert nxdi.modeling_gpt_oss.CALLS == []  # never fell back to a converter


@pytest.mark.parametrize(("overrides", "code"), [
    ({"quantized": False}, "neuron_config.not_quantized"),
    ({"quantization_type": "per_channel_symmetric"}, "neuron_config.wrong_quantization_type"),
    ({"modules_to_not_convert": ["lm_head"]}, "neuron_config.attention_not_excluded"),
    ({"tp_degree": 3}, "neuron_config.expert_tp_indivisible"),
    ({"padded_hidden_size": 96}, "neuron_config.padding_mismatch"),
])
def test_neuron_config_findings_fail_closed(
    nxdi: SimpleNamespace, tiny_template: Path, overrides: dict, code: str, monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv(nxdi_hook.ENV_VAR, "normalized_fp8")
    nxdi_hook.register()
    with pytest.raises(PreflightError) as caught:
        app_state_dict(nxdi, tiny_template, **overrides)
    assert code in caught.value.codes


WRONG_FORMATS: dict[str, tuple[Callable[[Path, Path], Path], str, tuple[str, ...]]] = {
    "hf-mxfp4": (lambda tmp, _: make_source(tmp / "hf", original=False), "an HF MXFP4 checkpoint",
                 ("unset CHECKPOINT_FORMAT", "nxdi-gptoss-fp8 convert")),
    "hf-bf16": (lambda tmp, _: make_source(tmp / "bf16", SOURCE_BF16, original=False), "an HF BF16 checkpoint",
                ("nxdi-gptoss-fp8 convert",)),
    "legacy-fp8": (lambda tmp, tiny: write_legacy_fp8(tmp / "legacy", tiny), "NxDI legacy-layout checkpoint",
                   ("CHECKPOINT_FORMAT=legacy",)),
}


@pytest.mark.parametrize("kind", list(WRONG_FORMATS))
def test_normalized_mode_on_another_format_names_it_and_the_fix(
    nxdi: SimpleNamespace, tiny_template: Path, tmp_path: Path, kind: str, monkeypatch: pytest.MonkeyPatch,
) -> None:
    make, title, fixes = WRONG_FORMATS[kind]
    source = make(tmp_path, tiny_template)
    monkeypatch.setenv(nxdi_hook.ENV_VAR, "normalized_fp8")
    nxdi_hook.register()
    with pytest.raises(PreflightError) as caught:
        app_state_dict(nxdi, source)
    first = str(caught.value).splitlines()[0]
    assert first.startswith("CHECKPOINT_FORMAT=normalized_fp8") and title in first and str(source) in first
    assert all(fix in first for fix in fixes), first
    assert caught.value.hint == first and caught.value.codes  # the findings still follow
    assert nxdi.modeling_gpt_oss.CALLS == []


def test_normalized_mode_on_a_broken_normalized_checkpoint_has_no_format_hint(
    nxdi: SimpleNamespace, tiny_checkpoint: Path, monkeypatch: pytest.MonkeyPatch,
) -> None:
    ckpt_edit.remove_tensor(tiny_checkpoint, ckpt_edit.DOWN_SCALE)
    monkeypatch.setenv(nxdi_hook.ENV_VAR, "normalized_fp8")
    nxdi_hook.register()
    with pytest.raises(PreflightError) as caught:
        app_state_dict(nxdi, tiny_checkpoint)
    assert caught.value.hint is None and "sidecar.missing_scale" in caught.value.codes


# --------------------------------------------------------------------------- save-quantized guard


def snapshot(directory: Path) -> dict[str, tuple[int, int, str]]:
    return {p.name: (p.stat().st_size, p.stat().st_mtime_ns, hashlib.sha256(p.read_bytes()).hexdigest())
            for p in sorted(directory.iterdir())}


def test_save_quantized_never_writes_and_logs_the_verdict(
    nxdi: SimpleNamespace, tiny_checkpoint: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture,
) -> None:
    monkeypatch.setenv(nxdi_hook.ENV_VAR, "normalized_fp8")
    nxdi_hook.register()
    app_cls = nxdi.modeling_gpt_oss.NeuronGptOssForCausalLM
    config = make_config(nxdi, tiny_checkpoint)
    before = snapshot(tiny_checkpoint)
    with caplog.at_level(logging.INFO, logger="nxdi_gptoss_fp8"):
        assert app_cls.save_quantized_state_dict(str(tiny_checkpoint), config) is None
    assert snapshot(tiny_checkpoint) == before
    assert any("passed the preflight" in r.getMessage() for r in caplog.records)
    generated = app_cls.generate_quantized_state_dict(str(tiny_checkpoint), config)
    assert f"layers.1.{fmt.DOWN}.scale" in generated and snapshot(tiny_checkpoint) == before

    ckpt_edit.edit_config(tiny_checkpoint, lambda d: d.__setitem__("model_type", "llama"))
    before = snapshot(tiny_checkpoint)
    with caplog.at_level(logging.ERROR, logger="nxdi_gptoss_fp8"), pytest.raises(PreflightError):
        app_cls.save_quantized_state_dict(str(tiny_checkpoint), config)
    assert snapshot(tiny_checkpoint) == before
    assert any("failed the preflight" in r.getMessage() and "config.wrong_model_type" in r.getMessage() for r in caplog.records)


# --------------------------------------------------------------------------- config round trip


def test_config_opt_in_survives_the_json_round_trip(nxdi: SimpleNamespace, tiny_template: Path,
                                                    caplog: pytest.LogCaptureFixture) -> None:
    modeling = nxdi.modeling_gpt_oss
    with caplog.at_level(logging.WARNING):
        modeling.GptOssNeuronConfig(checkpoint_format="normalized_fp8")
    assert any("dropped unknown keyword arguments" in r.getMessage() for r in caplog.records)  # NxDI alone drops it
    caplog.clear()

    nxdi_hook.register()
    config = make_config(nxdi, tiny_template, checkpoint_format="normalized_fp8")
    reloaded = modeling.GptOssInferenceConfig.from_json_string(config.to_json_string())
    assert reloaded.neuron_config.checkpoint_format == "normalized_fp8"
    assert nxdi_hook.normalized_mode(reloaded, {}) is True
    assert not any("dropped unknown keyword arguments" in r.getMessage() for r in caplog.records)
    assert not hasattr(modeling.GptOssNeuronConfig(tp_degree=2), "checkpoint_format")  # absent stays absent


@pytest.mark.parametrize(("attr", "value"), [(fmt.VERIFY_AT_LOAD_ATTR, True), (fmt.LOAD_MODE_ATTR, fmt.LOAD_MODE_PRIVATE)])
def test_load_choices_survive_the_json_round_trip(nxdi: SimpleNamespace, tiny_template: Path, attr: str, value: Any) -> None:
    from nxdi_gptoss_fp8.loader import LoadPolicy

    nxdi_hook.register()
    config = make_config(nxdi, tiny_template, checkpoint_format="normalized_fp8", **{attr: value})
    reloaded = nxdi.modeling_gpt_oss.GptOssInferenceConfig.from_json_string(config.to_json_string())
    assert getattr(reloaded.neuron_config, attr) == value
    assert LoadPolicy.resolve(reloaded, {}) == LoadPolicy.resolve(config, {}) != LoadPolicy()
    assert not hasattr(nxdi.modeling_gpt_oss.GptOssNeuronConfig(tp_degree=2), attr)


@pytest.mark.parametrize("mode", fmt.LOAD_MODES)
def test_hook_verifies_at_load_when_the_neuron_config_asks(nxdi: SimpleNamespace, tiny_checkpoint: Path, mode: str) -> None:
    """The preflight passes (an FP8 byte changed in range), the digest at load does not."""
    nxdi_hook.register()
    expected = app_state_dict(nxdi, tiny_checkpoint, checkpoint_format="normalized_fp8", normalized_fp8_verify_at_load=True,
                              normalized_fp8_load_mode=mode)
    assert f"layers.0.{fmt.GATE_UP}.weight" in expected
    path = tiny_checkpoint / ckpt_edit.shard_of(tiny_checkpoint, ckpt_edit.GATE_UP_WEIGHT)
    data = bytearray(path.read_bytes())
    data[-1] ^= 0x01
    path.write_bytes(bytes(data))
    assert app_state_dict(nxdi, tiny_checkpoint, checkpoint_format="normalized_fp8", normalized_fp8_load_mode=mode)
    with pytest.raises(IntegrityError, match="the loaded bytes have SHA-256"):
        app_state_dict(nxdi, tiny_checkpoint, checkpoint_format="normalized_fp8", normalized_fp8_verify_at_load=True,
                       normalized_fp8_load_mode=mode)


def test_hook_binds_the_report_to_the_config_it_loads_with(nxdi: SimpleNamespace, tiny_template: Path,
                                                            monkeypatch: pytest.MonkeyPatch) -> None:
    """The hook's preflight and load see one config object: the binding matches; a config that
    changes in between (here: under the hook's feet) is refused."""
    from nxdi_gptoss_fp8 import loader
    from nxdi_gptoss_fp8.errors import ReportBindingError

    nxdi_hook.register()
    checked_preflight = nxdi_hook.checked_preflight

    def then_change(path: str, config: Any, inputs: Any = None) -> Any:
        report = checked_preflight(path, config, inputs)
        config.neuron_config.tp_degree = 2
        return report

    monkeypatch.setattr(nxdi_hook, "checked_preflight", then_change)
    monkeypatch.setattr(loader, "map_shard", lambda *a, **k: pytest.fail("mapped for a report of another config"))
    with pytest.raises(ReportBindingError, match="a different NxDI config"):
        app_state_dict(nxdi, tiny_template, checkpoint_format="normalized_fp8")


# --------------------------------------------------------------------------- entry points


def test_cli_inference_demo_registers_and_runs_the_demo(
    nxdi: SimpleNamespace, tiny_template: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture,
) -> None:
    monkeypatch.setattr(nxdi_hook, "nxdi_available", lambda: True)
    monkeypatch.setenv(nxdi_hook.ENV_VAR, "normalized_fp8")
    argv = ["inference-demo", "--model-type", "gpt_oss", "--task-type", "causal-lm", "--model-path", str(tiny_template),
            "--quantized", "--quantized-checkpoints-path", str(tiny_template),
            "--quantization-type", fmt.QUANTIZATION_TYPE, "--quantization-dtype", fmt.QUANTIZATION_DTYPE,
            "--modules-to-not-convert", "lm_head", "self_attn"]
    assert cli.main(argv) == 0
    (state_dict,) = nxdi.inference_demo.RUNS
    assert state_dict[f"layers.0.{fmt.GATE_UP}.weight"].dtype == torch.float8_e4m3fn
    assert nxdi_hook.is_registered()


def test_cli_inference_demo_without_nxdi_is_one_line_exit_2(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture,
) -> None:
    monkeypatch.setattr(nxdi_hook, "nxdi_available", lambda: False)
    assert cli.main(["inference-demo", "--model-type", "gpt_oss"]) == 2
    captured = capsys.readouterr()
    assert captured.out == "" and len(captured.err.strip().splitlines()) == 1
    assert "NxDI" in captured.err and "Traceback" not in captured.err


def test_vllm_plugin_registers_when_nxdi_is_there(nxdi: SimpleNamespace) -> None:
    vllm_plugin.register_plugin()
    vllm_plugin.register_plugin()
    assert nxdi_hook.is_registered()


def test_vllm_plugin_without_nxdi_is_one_warning(monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    """One WARNING (vLLM's default level shows it), nothing registered, vLLM runs on."""
    monkeypatch.delenv(nxdi_hook.ENV_VAR, raising=False)
    monkeypatch.setattr(nxdi_hook, "nxdi_available", lambda: False)
    with caplog.at_level(logging.WARNING, logger="nxdi_gptoss_fp8"):
        vllm_plugin.register_plugin()
    (record,) = [r for r in caplog.records if r.name.startswith("nxdi_gptoss_fp8")]
    assert record.levelno == logging.WARNING and "NxDI is not installed" in record.getMessage()
    assert not nxdi_hook.is_registered()


@pytest.mark.parametrize("nxdi_there", [False, True])
@pytest.mark.parametrize("value", ["normalized-fp8", "fp8", "normalised_fp8", "Normalized FP8", "nrmalized_fp8"])
def test_vllm_plugin_points_out_a_near_miss_as_a_typo(monkeypatch: pytest.MonkeyPatch, nxdi_there: bool, value: str) -> None:
    """A typo of CHECKPOINT_FORMAT stops vLLM at once, saying what was meant, with NxDI or without it."""
    _set_format(monkeypatch, value)
    monkeypatch.setattr(nxdi_hook, "nxdi_available", lambda: nxdi_there)
    monkeypatch.setattr(nxdi_hook, "register", lambda: pytest.fail("a typo must stop before anything is registered"))
    with pytest.raises(CheckpointFormatError) as caught:
        vllm_plugin.register_plugin()
    message = str(caught.value)
    assert repr(value) in message and "did you mean 'normalized_fp8'" in message and "\n" not in message


@pytest.mark.parametrize(("architecture", "expected"), [
    ("GptOssForCausalLM", ("gptoss", "causal-lm")), ("Qwen3MoeForCausalLM", ("qwen3moe", "causal-lm")),
    ("LlamaForCausalLM", ("llama", "causal-lm")),
])
def test_vllm_model_type_is_the_key_vllm_neuron_computes(architecture: str, expected: tuple[str, str]) -> None:
    assert vllm_plugin.vllm_model_type(architecture) == expected


def test_vllm_plugin_makes_gpt_oss_reachable_under_vllm_neurons_key(nxdi: SimpleNamespace) -> None:
    """vllm-neuron ≥ 0.2 looks up MODEL_TYPES["gptoss"]: the same hooked class; unregister removes it."""
    model_types = nxdi.constants.MODEL_TYPES
    app = nxdi.modeling_gpt_oss.NeuronGptOssForCausalLM
    vllm_plugin.register_plugin()
    vllm_plugin.register_plugin()
    assert model_types["gptoss"] == {"causal-lm": app} and model_types["gpt_oss"]["causal-lm"] is app
    nxdi_hook.unregister()
    assert "gptoss" not in model_types and model_types["gpt_oss"]["causal-lm"] is app


@pytest.mark.parametrize("value", [None, "normalized_fp8"])
def test_vllm_plugin_never_replaces_another_class(
    nxdi: SimpleNamespace, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture, value: str | None,
) -> None:
    class Other:
        pass

    _set_format(monkeypatch, value)
    nxdi.constants.MODEL_TYPES["gptoss"] = {"causal-lm": Other}
    if value is None:
        with caplog.at_level(logging.WARNING, logger="nxdi_gptoss_fp8"):
            vllm_plugin.register_plugin()
        assert any("'gptoss'" in r.getMessage() for r in caplog.records if r.levelno == logging.WARNING)
    else:
        with pytest.raises(RegistrationError, match="looks GPT-OSS up as 'gptoss'"):
            vllm_plugin.register_plugin()
    nxdi_hook.unregister()
    assert nxdi.constants.MODEL_TYPES["gptoss"] == {"causal-lm": Other}


def _nxdi_differs() -> None:
    raise RegistrationError("the installed NxDI differs from what the hook wraps; nothing was patched:\n  - X.y does not exist")


def _nxdi_breaks_on_import() -> None:
    raise ImportError("libnrt.so.1: cannot open shared object file")


NOT_ASKING = [None, "hf", "legacy", "HF", ""]
ASKING = ["normalized_fp8", " Normalized_FP8 ", "NORMALIZED_FP8"]


@pytest.mark.parametrize("failure", [_nxdi_differs, _nxdi_breaks_on_import])
@pytest.mark.parametrize("value", NOT_ASKING)
def test_vllm_plugin_failure_is_one_warning_when_not_asked_for(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture, failure: Callable[[], None], value: str | None,
) -> None:
    """A vLLM server that never asked for the normalized format keeps running."""
    _set_format(monkeypatch, value)
    monkeypatch.setattr(nxdi_hook, "nxdi_available", lambda: True)
    monkeypatch.setattr(nxdi_hook, "register", failure)
    with caplog.at_level(logging.DEBUG, logger="nxdi_gptoss_fp8"):
        vllm_plugin.register_plugin()
    (record,) = [r for r in caplog.records if r.name.startswith("nxdi_gptoss_fp8")]
    message = record.getMessage()
    assert record.levelno == logging.WARNING and "\n" not in message
    assert "not installed" in message and "does not ask for it" in message


@pytest.mark.parametrize("failure", [_nxdi_differs, _nxdi_breaks_on_import, None])
@pytest.mark.parametrize("value", ASKING)
def test_vllm_plugin_failure_raises_with_the_reason_when_asked_for(
    monkeypatch: pytest.MonkeyPatch, failure: Callable[[], None] | None, value: str,
) -> None:
    """``failure`` None: NxDI is not installed at all (the real ``register`` says so)."""
    _set_format(monkeypatch, value)
    if failure is None:
        monkeypatch.setattr(nxdi_hook, "nxdi_available", lambda: False)
        monkeypatch.setattr(nxdi_hook, "MODELING_MODULE", "nxdi_gptoss_fp8_no_such_module.modeling")
        reason = "cannot import"
    else:
        monkeypatch.setattr(nxdi_hook, "nxdi_available", lambda: True)
        monkeypatch.setattr(nxdi_hook, "register", failure)
        reason = "differs" if failure is _nxdi_differs else "libnrt"
    with pytest.raises(RegistrationError) as caught:
        vllm_plugin.register_plugin()
    message = str(caught.value)
    assert nxdi_hook.ENV_VAR in message and repr(value) in message and reason in message and "\n" not in message


def _set_format(monkeypatch: pytest.MonkeyPatch, value: str | None) -> None:
    if value is None:
        monkeypatch.delenv(nxdi_hook.ENV_VAR, raising=False)
    else:
        monkeypatch.setenv(nxdi_hook.ENV_VAR, value)


def test_setup_declares_the_vllm_entry_point() -> None:
    text = (REPO / "setup.py").read_text()
    match = re.search(r'"vllm\.general_plugins":\s*\[\s*"([^"=]+?)\s*=\s*([\w.]+):(\w+)"', text)
    assert match, "setup.py lacks the vllm.general_plugins entry point"
    module, function = match.group(2), match.group(3)
    assert (module, function) == ("nxdi_gptoss_fp8.nxdi.vllm_plugin", "register_plugin")
    assert callable(getattr(vllm_plugin, function))


def test_package_exposes_the_hook_and_loader_lazily() -> None:
    import nxdi_gptoss_fp8
    from nxdi_gptoss_fp8 import loader

    assert nxdi_gptoss_fp8.register is nxdi_hook.register
    assert nxdi_gptoss_fp8.unregister is nxdi_hook.unregister
    assert nxdi_gptoss_fp8.is_registered is nxdi_hook.is_registered
    assert nxdi_gptoss_fp8.load_state_dict is loader.load_state_dict


def _set(target: str, name: str, value: Any) -> Callable[[Any], None]:
    def change(config: Any) -> None:
        obj = config.neuron_config if target == "neuron" else config
        if value is _DELETE:
            delattr(obj, name)
        else:
            setattr(obj, name, value)
    return change


_DELETE = object()
# Verdicts the hook path gets from NxDI's own objects: the same rules (one function) as the
# command line applies to config.json and a --neuron-config JSON.
HOOK_CONFIG_FAULTS: dict[str, tuple[Callable[[Any], None], str]] = {
    "attention_bias_false": (_set("model", "attention_bias", False), "config.no_attention_bias"),
    "attention_bias_absent": (_set("model", "attention_bias", _DELETE), "config.no_attention_bias"),
    "original_intermediate_differs": (_set("model", "original_intermediate_size", 32), "config.original_size_mismatch"),
    "original_hidden_differs": (_set("model", "original_hidden_size", 96), "config.original_size_mismatch"),
    "quantized_mlp_kernel": (_set("neuron", "quantized_mlp_kernel_enabled", True), "neuron_config.quantization_rewritten"),
    "activation_quantization": (_set("neuron", "activation_quantization_type", "dynamic"), "neuron_config.quantization_rewritten"),
    "hybrid_sharding": (_set("neuron", "hybrid_sharding_config", SimpleNamespace(moe_tkg_tp_degree=2)), "neuron_config.hybrid_sharding"),
    "tp_degree_2_40": (_set("neuron", "tp_degree", 2**40), "neuron_config.bad_degree"),
    "padded_size_4300_digits": (_set("neuron", "padded_intermediate_size", 10**4299), "neuron_config.out_of_range"),
}


@pytest.mark.parametrize("fault", list(HOOK_CONFIG_FAULTS))
def test_nxdi_objects_get_the_json_rules(nxdi: SimpleNamespace, tiny_template: Path, fault: str,
                                         monkeypatch: pytest.MonkeyPatch) -> None:
    change, code = HOOK_CONFIG_FAULTS[fault]
    monkeypatch.setenv(nxdi_hook.ENV_VAR, "normalized_fp8")
    nxdi_hook.register()
    config = make_config(nxdi, tiny_template)
    change(config)
    app = nxdi.modeling_gpt_oss.NeuronGptOssForCausalLM(str(tiny_template), config)
    with pytest.raises(PreflightError) as caught:
        app.checkpoint_loader_fn()
    assert code in caught.value.codes, caught.value.codes
    assert nxdi.modeling_gpt_oss.CALLS == []


# --------------------------------------------------------------------------- what a client catches

# the types raised out of the hook at load time; none may be what a client catches and recompiles on
LOAD_TIME_ERRORS = [PreflightError, CheckpointFormatError, LoadError, LoadRefusedError, IntegrityError,
                    errors.ShardedWeightsError, errors.ReportBindingError, errors.FailedReportError, RegistrationError]


@pytest.mark.parametrize("error", LOAD_TIME_ERRORS, ids=lambda e: e.__name__)
def test_no_load_time_error_is_what_vllm_catches(error: type) -> None:
    """vllm-neuron's _load_weights_common catches (FileNotFoundError, ValueError) and recompiles."""
    assert not issubclass(error, errors.CLIENT_CAUGHT)


@pytest.mark.parametrize("raised", [
    errors.ConfigError("NXDI_GPTOSS_FP8_VERIFY_AT_LOAD='ture' is not on or off"),
    errors.NotRegularFileError("/ckpt/model-00001.safetensors is a FIFO"),
    FileNotFoundError(2, "No such file or directory", "/ckpt/model-00001.safetensors"),
    ValueError("bad value"), PermissionError(13, "Permission denied"),
], ids=lambda e: type(e).__name__)
def test_the_boundary_turns_what_clients_catch_into_a_refusal(raised: BaseException) -> None:
    with pytest.raises(LoadRefusedError) as caught, errors.refusals_stop_the_start():
        raise raised
    assert caught.value.__cause__ is raised and not isinstance(caught.value, errors.CLIENT_CAUGHT)
    assert str(raised) in str(caught.value)


def test_the_boundary_leaves_other_errors_alone() -> None:
    with pytest.raises(KeyError), errors.refusals_stop_the_start():
        raise KeyError("x")
    with pytest.raises(PreflightError), errors.refusals_stop_the_start():
        raise PreflightError.__new__(PreflightError)


def test_a_setting_refused_at_load_is_not_a_value_error(nxdi: SimpleNamespace, tiny_template: Path,
                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    """A ConfigError (a ValueError for library callers) met during the hooked load stops it as a LoadRefusedError."""
    monkeypatch.setenv(nxdi_hook.ENV_VAR, "normalized_fp8")
    monkeypatch.setenv(fmt.ALLOW_CUSTOM_ENV, "ture")
    nxdi_hook.register()
    with pytest.raises(LoadRefusedError) as caught:
        app_state_dict(nxdi, tiny_template)
    assert fmt.ALLOW_CUSTOM_ENV in str(caught.value) and isinstance(caught.value.__cause__, errors.ConfigError)


# --------------------------------------------------------------------------- the start plan


def _plan_trace(run: Callable[[], Any]) -> list[tuple[str, str | None]]:
    """``run()`` with every call of a check primitive recorded with the start plan check it ran in
    (None: outside the plan). The primitives: every reader and verdict the start can refuse by."""
    from nxdi_gptoss_fp8.nxdi import start_plan
    from nxdi_gptoss_fp8.validate import nxdi_config, pipeline, presharded, verdict

    primitives = {func.__code__: func.__qualname__ for func in (
        start_plan.normalized_mode, start_plan.entry_point, start_plan.compile_target, pipeline.allow_custom_from_env,
        pipeline.preflight, nxdi_config.load_choices, nxdi_config.reference_choice, verdict.checkpoint_verdict,
        presharded.check_presharded, presharded.compiled_verdict)}
    calls: list[tuple[str, str | None]] = []

    def profile(frame: Any, event: str, _arg: Any) -> None:
        if event == "call" and frame.f_code in primitives:
            calls.append((primitives[frame.f_code], start_plan.active_check()))

    sys.setprofile(profile)
    try:
        run()
    finally:
        sys.setprofile(None)
    return calls


def test_every_check_the_hook_runs_at_the_start_is_in_the_plan(nxdi: SimpleNamespace, tiny_template: Path,
                                                               tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A start through every hooked entry (the checkpoint loader, save_quantized, a pre-sharded compile
    and load): each check it makes runs as a check of ``start_plan.PLAN``, so doctor, which
    evaluates that list, makes it too."""
    import shutil

    import presharded_cases as cases

    from nxdi_gptoss_fp8.nxdi import start_plan

    monkeypatch.setenv(nxdi_hook.ENV_VAR, nxdi_hook.NORMALIZED_FP8)
    nxdi_hook.register()
    ckpt = Path(shutil.copytree(tiny_template, tmp_path / "ckpt"))
    compiled = tmp_path / "compiled"

    def start() -> None:
        app_state_dict(nxdi, ckpt)
        nxdi.modeling_gpt_oss.NeuronGptOssForCausalLM.save_quantized_state_dict(str(ckpt), make_config(nxdi, ckpt))
        cases.compile_shards(nxdi.modeling_gpt_oss, ckpt, compiled)
        cases.load(cases.load_app(nxdi.modeling_gpt_oss, compiled, ckpt), compiled)

    calls = _plan_trace(start)
    outside = [name for name, check in calls if check is None]
    assert outside == [], f"checks the hook ran outside the start plan: {sorted(set(outside))}"
    ran = {check for _name, check in calls}
    assert ran <= set(start_plan.plan_names())
    assert {"checkpoint_format", "allow_custom_model", "checkpoint", "load_choices", "presharded"} <= ran


def test_the_hook_refuses_each_setting_as_the_plan_does(nxdi: SimpleNamespace, tiny_template: Path,
                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    """``ture``, ``privat`` and two disagreeing modes: the load's refusal is the plan's, word for word."""
    from nxdi_gptoss_fp8.nxdi import start_plan

    monkeypatch.setenv(nxdi_hook.ENV_VAR, nxdi_hook.NORMALIZED_FP8)
    nxdi_hook.register()
    for name, value, override in ((fmt.VERIFY_AT_LOAD_ENV, "ture", {}), (fmt.LOAD_MODE_ENV, "privat", {}),
                                  (fmt.LOAD_MODE_ENV, "private", {fmt.LOAD_MODE_ATTR: "mmap"})):
        monkeypatch.setenv(name, value)
        config = make_config(nxdi, tiny_template, **override)
        with pytest.raises(LoadError) as planned:
            start_plan.run_check("load_choices", start_plan.StartInputs(os.environ, config))
        with pytest.raises(LoadError) as loaded:
            app_state_dict(nxdi, tiny_template, **override)
        assert str(loaded.value) == str(planned.value)
        monkeypatch.delenv(name)
