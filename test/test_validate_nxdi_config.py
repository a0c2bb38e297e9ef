"""NxDI's configuration read one way: the same rule set for NxDI objects and their JSON."""

from __future__ import annotations

import ast
import os
import re
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from nxdi_gptoss_fp8 import format as fmt
from nxdi_gptoss_fp8.synthetic.tiny import TINY_DIMS
from nxdi_gptoss_fp8.validate.nxdi_config import (
    BOOLEAN_NEURON_CONFIG_KEYS,
    KNOWN_NEURON_CONFIG_KEYS,
    bounded_int,
    describe,
    model_config_problems,
    model_part,
    neuron_config_problems,
    unknown_key_problems,
)

GOOD: dict[str, Any] = {
    "quantized": True, "quantization_dtype": fmt.QUANTIZATION_DTYPE, "quantization_type": fmt.QUANTIZATION_TYPE,
    "modules_to_not_convert": ["self_attn", "lm_head"], "tp_degree": 2,
}
LAYOUT = fmt.Layout.unpadded(TINY_DIMS)
STORED = {"padded_hidden_size": LAYOUT.padded_hidden_size, "padded_intermediate_size": LAYOUT.padded_intermediate_size}

RULES: list[tuple[str, dict[str, Any], str]] = [
    ("good", {}, ""),
    ("quantized-mlp-kernel", {"quantized_mlp_kernel_enabled": True}, "quantization_rewritten"),
    ("activation-quantization", {"activation_quantization_type": "dynamic"}, "quantization_rewritten"),
    ("hybrid-sharding", {"hybrid_sharding_config": {"moe_tkg_tp_degree": 4}}, "hybrid_sharding"),
    ("tp-above-2-31", {"tp_degree": 2**31 + 1}, "bad_degree"),
    ("tp-4300-digits", {"tp_degree": 10**4299}, "bad_degree"),
    ("ep-bool", {"moe_ep_degree": True}, "bad_degree"),
    ("padded-above-2-31", {"padded_hidden_size": 2**33}, "out_of_range"),
    ("padded-float", {"padded_intermediate_size": 64.0}, "out_of_range"),
    ("exclusions-too-many", {"modules_to_not_convert": ["self_attn", "lm_head"] + ["x"] * 500_000}, "bad_modules_to_not_convert"),
]


def _reasons(config: Any) -> set[str]:
    return {p.reason for p in neuron_config_problems(config, dims=TINY_DIMS, layout=LAYOUT, stored_padding=STORED)}


@pytest.mark.parametrize(("name", "change", "reason"), RULES, ids=[r[0] for r in RULES])
def test_one_rule_set_for_json_and_objects(name: str, change: dict[str, Any], reason: str) -> None:
    as_json = {**GOOD, **change}
    as_object = SimpleNamespace(**as_json)
    assert _reasons(as_json) == _reasons(as_object) == ({reason} if reason else set())


@pytest.mark.parametrize(("key", "nearest"), [("tp_degre", "tp_degree"), ("quantised", "quantized"),
                                              ("moe_ep_degre", "moe_ep_degree"), ("zzzz", None)])
def test_unknown_keys_warn_with_the_nearest_known_name(key: str, nearest: str | None) -> None:
    (problem,) = unknown_key_problems({**GOOD, key: 1})
    assert problem.warning and problem.reason == "unknown_key" and problem.key == key
    assert (f"did you mean {nearest!r}" in problem.message) if nearest else ("did you mean" not in problem.message)


def test_a_key_that_is_not_a_string_is_reported_not_raised() -> None:
    (problem,) = unknown_key_problems({**GOOD, 1: 2})
    assert problem.warning and problem.reason == "unknown_key" and problem.key == "1"


def test_objects_are_not_searched_for_unknown_keys() -> None:
    assert _reasons(SimpleNamespace(**GOOD, tp_degre=2)) == set()


@pytest.mark.parametrize(("change", "reasons"), [
    ({}, set()),
    ({"attention_bias": False}, {"no_attention_bias"}),
    ({"attention_bias": None}, {"no_attention_bias"}),
    ({"original_hidden_size": 32}, {"original_size_mismatch"}),
    ({"original_intermediate_size": 10**4299}, {"original_size_mismatch"}),
    ({"num_local_experts": 8}, {"nxdi_config_mismatch"}),
    ({"hidden_size": 96, "original_hidden_size": 64}, set()),  # NxDI: H' in hidden_size, H in original
    ({"experts_per_token": 3}, {"alias_mismatch"}),
    ({"num_experts": 8}, {"alias_mismatch"}),
    ({"num_experts": 4.0}, {"alias_mismatch"}),
])
def test_model_config_rules(change: dict[str, Any], reasons: set[str]) -> None:
    config = {**fmt.hf_config(TINY_DIMS), **change}
    for source in (config, SimpleNamespace(**config)):
        problems = model_config_problems(source, TINY_DIMS, check="config", what="x", compare_dims=True)
        assert {p.reason for p in problems} == reasons
        for problem in problems:
            assert len(problem.message) < 400


@pytest.mark.parametrize(("canonical", "alias"), [("num_experts_per_tok", "experts_per_token"), ("num_local_experts", "num_experts")])
def test_an_alias_alone_is_refused(canonical: str, alias: str) -> None:
    """transformers' GptOssConfig ignores the alias and NxDI would use its default instead."""
    config = {**fmt.hf_config(TINY_DIMS), alias: getattr(TINY_DIMS, canonical)}
    config.pop(canonical)
    problems = model_config_problems(config, TINY_DIMS, check="config", what="x", compare_dims=False)
    assert {p.reason for p in problems} == {"alias_only"} and problems[0].key == canonical


def test_the_load_options_are_known_neuron_config_keys() -> None:
    assert unknown_key_problems({**GOOD, fmt.VERIFY_AT_LOAD_ATTR: True, fmt.LOAD_MODE_ATTR: "private"}) == []


def test_model_part_of_a_nested_file() -> None:
    assert model_part({"hidden_size": 64, "neuron_config": GOOD}) == {"hidden_size": 64}
    assert model_part(GOOD) is None


@pytest.mark.parametrize(("value", "expected"), [(1, 1), (2**31, 2**31), (0, None), (2**31 + 1, None), (True, None), (1.0, None), ("1", None)])
def test_bounded_int(value: Any, expected: int | None) -> None:
    assert bounded_int(value) == expected


def test_describe_never_converts_a_huge_integer() -> None:
    assert "bits" in describe(10**5000) and len(describe("x" * 10**6)) <= 80


@pytest.mark.nxdi
def test_known_keys_cover_nxdi_neuron_config() -> None:
    """Every keyword NxDI's NeuronConfig classes read is a known key (no false warning)."""
    root = os.environ.get("NXDI_SRC")
    if not root:
        pytest.skip("NXDI_SRC is not set")
    package = Path(root) / "src" / "neuronx_distributed_inference" / "models"
    names: set[str] = set()
    for source, classes in ((package / "config.py", {"NeuronConfig", "MoENeuronConfig"}),
                            (package / "gpt_oss" / "modeling_gpt_oss.py", {"GptOssNeuronConfig"})):
        for node in ast.parse(source.read_text()).body:
            if isinstance(node, ast.ClassDef) and node.name in classes:
                for sub in ast.walk(node):
                    if isinstance(sub, ast.Attribute) and isinstance(sub.value, ast.Name) and sub.value.id == "self" \
                            and isinstance(sub.ctx, ast.Store):
                        names.add(sub.attr)
                    if isinstance(sub, ast.Call) and getattr(sub.func, "attr", "") in ("pop", "get") \
                            and isinstance(getattr(sub.func, "value", None), ast.Name) and sub.func.value.id == "kwargs" \
                            and sub.args and isinstance(sub.args[0], ast.Constant):
                        names.add(sub.args[0].value)
    assert len(names) > 100
    assert names - KNOWN_NEURON_CONFIG_KEYS == set()


@pytest.mark.parametrize("value", ["false", "true", 0, 1, None, [], "no"])
def test_neuron_config_switches_must_be_json_booleans(value: Any) -> None:
    config = {**GOOD, "quantized": value}
    assert "not_boolean" in _reasons(config)
    assert "not_boolean" not in _reasons({**GOOD, "quantized": True, "fused_qkv": False})


def _nxdi_models() -> Path:
    root = os.environ.get("NXDI_SRC")
    if not root:
        pytest.skip("NXDI_SRC is not set")
    return Path(root) / "src" / "neuronx_distributed_inference" / "models"


@pytest.mark.nxdi
def test_boolean_keys_are_nxdi_s_on_off_switches() -> None:
    """Every NeuronConfig attribute NxDI defaults to True/False is a boolean key, and no other."""
    package = _nxdi_models()
    names: set[str] = set()
    for source in (package / "config.py", package / "gpt_oss" / "modeling_gpt_oss.py"):
        for node in ast.walk(ast.parse(source.read_text())):
            if isinstance(node, ast.Call) and getattr(node.func, "attr", "") == "pop" \
                    and isinstance(getattr(node.func, "value", None), ast.Name) and node.func.value.id == "kwargs" \
                    and len(node.args) == 2 and isinstance(node.args[0], ast.Constant) \
                    and isinstance(node.args[1], ast.Constant) and isinstance(node.args[1].value, bool):
                names.add(node.args[0].value)
    # lm_head_pad defaults to an expression (logical_nc_config > 1); on_device_sampling_config
    # is a bool only in OnDeviceSamplingConfig, an object in NeuronConfig
    expected = (names & KNOWN_NEURON_CONFIG_KEYS) - {"on_device_sampling_config"} | {"lm_head_pad"}
    assert expected == BOOLEAN_NEURON_CONFIG_KEYS


@pytest.mark.nxdi
def test_hard_coded_values_are_nxdi_s() -> None:
    """rms_norm_eps, the SwiGLU clamp and the even-layer sliding window, as NxDI's GPT-OSS has them."""
    source = (_nxdi_models() / "gpt_oss" / "modeling_gpt_oss.py").read_text()
    assigned: dict[str, Any] = {}
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Assign):
            try:
                value = ast.literal_eval(node.value)
                hash(value)
            except (ValueError, TypeError, SyntaxError):
                continue
            for target in node.targets:
                if isinstance(target, ast.Attribute):
                    assigned.setdefault(target.attr, set()).add(value)
    assert assigned["rms_norm_eps"] == {fmt.NXDI_RMS_NORM_EPS}
    assert assigned["gate_clamp_upper_limit"] == assigned["up_clamp_upper_limit"] == {fmt.NXDI_SWIGLU_LIMIT}
    assert assigned["up_clamp_lower_limit"] == {-fmt.NXDI_SWIGLU_LIMIT}
    assert assigned["n_shared_experts"] == {0}
    assert "self.is_sliding_window_layer = layer_idx % 2 == 0" in source
    assert "layer_types" not in source  # NxDI never reads it


# --------------------------------------------------------------------------- the load's two choices


@pytest.mark.parametrize(("environ", "attrs", "expected"), [
    ({}, {}, (False, "mmap")),
    ({"NXDI_GPTOSS_FP8_VERIFY_AT_LOAD": "on"}, {}, (True, "mmap")),
    ({}, {"normalized_fp8_verify_at_load": True, "normalized_fp8_load_mode": "private"}, (True, "private")),
    ({"NXDI_GPTOSS_FP8_LOAD_MODE": " PRIVATE "}, {"normalized_fp8_load_mode": "private"}, (False, "private")),
    ({"NXDI_GPTOSS_FP8_VERIFY_AT_LOAD": "ture"}, {}, "NXDI_GPTOSS_FP8_VERIFY_AT_LOAD='ture' is not on or off"),
    ({"NXDI_GPTOSS_FP8_LOAD_MODE": "privat"}, {}, "is not a load mode"),
    ({"NXDI_GPTOSS_FP8_LOAD_MODE": "private"}, {"normalized_fp8_load_mode": "mmap"}, "contradicts"),
    ({}, {"normalized_fp8_verify_at_load": "2"}, "neuron_config.normalized_fp8_verify_at_load"),
])
def test_load_choices_are_read_one_way(environ: dict[str, str], attrs: dict[str, Any], expected: Any) -> None:
    from nxdi_gptoss_fp8.errors import LoadError
    from nxdi_gptoss_fp8.validate.nxdi_config import load_choices

    if isinstance(expected, tuple):
        assert load_choices(attrs, environ) == expected
        return
    with pytest.raises(LoadError, match=re.escape(expected)):
        load_choices(attrs, environ)


@given(st.text(max_size=20), st.one_of(st.none(), st.text(max_size=20), st.booleans(), st.integers()))
def test_load_choices_raise_only_load_error(env_value: str, attr_value: Any) -> None:
    from nxdi_gptoss_fp8.errors import LoadError
    from nxdi_gptoss_fp8.validate.nxdi_config import load_choices

    for environ, attrs in (({"NXDI_GPTOSS_FP8_LOAD_MODE": env_value}, {"normalized_fp8_load_mode": attr_value}),
                           ({"NXDI_GPTOSS_FP8_VERIFY_AT_LOAD": env_value}, {"normalized_fp8_verify_at_load": attr_value})):
        try:
            verify, mode = load_choices(attrs, environ)
        except LoadError as exc:
            assert "\n" not in str(exc)
        else:
            assert isinstance(verify, bool) and mode in ("mmap", "private")
