"""The contract as code: namespace counts and sizes, profiles, sidecar names."""

from __future__ import annotations

import pytest

from nxdi_gptoss_fp8 import format as fmt


@pytest.mark.parametrize(("profile", "count"), [(fmt.PROFILE_120B, 687), (fmt.PROFILE_20B, 459)])
def test_namespace_counts(profile: str, count: int) -> None:
    namespace = fmt.expected_namespace(fmt.Layout.unpadded(fmt.PROFILES[profile]))
    assert len(namespace) == count
    assert sum(1 for name in namespace if name.startswith("layers.0.")) == 19


def test_120b_sizes_match_the_contract() -> None:
    layout = fmt.Layout.unpadded(fmt.PROFILES[fmt.PROFILE_120B])
    namespace = fmt.expected_namespace(layout)
    fp8 = sum(s.nbytes for s in namespace.values() if s.dtype == fmt.F8_E4M3)
    assert fp8 == 114_661_785_600
    assert namespace[f"layers.0.{fmt.GATE_UP}.weight"].nbytes == 2_123_366_400
    assert round(fmt.expected_total_size(layout) / 1e9, 1) == 119.2
    scales = sum(s.nbytes for s in namespace.values() if s.dtype == fmt.F32)
    assert round(scales / 1e6) == 159


def test_padded_shapes() -> None:
    layout = fmt.Layout(fmt.PROFILES[fmt.PROFILE_120B], 3072, 3072)
    namespace = fmt.expected_namespace(layout)
    assert namespace[f"layers.3.{fmt.GATE_UP}.weight"].shape == (128, 3072, 6144)
    assert namespace[f"layers.3.{fmt.DOWN}.scale"].shape == (128, 1, 3072)
    assert namespace["self_attn.o_proj.weight".join(["layers.0.", ""])].shape == (3072, 4096)
    assert namespace["embed_tokens.weight"].shape == (201088, 3072)


@pytest.mark.parametrize(
    ("padded_h", "padded_i", "problems"),
    [(2880, 2880, 0), (3072, 3072, 0), (2900, 2880, 1), (2848, 2880, 1), (2879, 2881, 2)],
)
def test_padding_rules(padded_h: int, padded_i: int, problems: int) -> None:
    assert len(fmt.Layout(fmt.PROFILES[fmt.PROFILE_20B], padded_h, padded_i).padding_problems()) == problems


def test_dims_from_config_aliases_and_errors() -> None:
    config = fmt.hf_config(fmt.PROFILES[fmt.PROFILE_20B])
    assert fmt.dims_from_config(config) == fmt.PROFILES[fmt.PROFILE_20B]
    del config["num_experts_per_tok"]
    assert fmt.dims_from_config(config).num_experts_per_tok == 4  # from experts_per_token
    for bad in ("2880", 2880.0, True, 0, -1, None):
        with pytest.raises(fmt.ConfigFieldError):
            fmt.dims_from_config({**config, "hidden_size": bad})
    with pytest.raises(fmt.ConfigFieldError, match="missing"):
        fmt.dims_from_config({k: v for k, v in config.items() if k != "vocab_size"})


def test_profile_for_dims() -> None:
    assert fmt.profile_for_dims(fmt.PROFILES[fmt.PROFILE_120B]) == fmt.PROFILE_120B
    assert fmt.profile_for_dims(fmt.ModelDims(1, 2, 64, 64, 16, 4, 2, 128, 2, 8)) == fmt.PROFILE_CUSTOM


def test_sidecar_key_helpers() -> None:
    weight = f"layers.1.{fmt.DOWN}.weight"
    assert fmt.scale_key_for(weight) == f"layers.1.{fmt.DOWN}.scale"
    assert fmt.weight_key_for(fmt.scale_key_for(weight)) == weight
    assert fmt.is_expert_scale(f"layers.1.{fmt.DOWN}.scale") and not fmt.is_expert_scale(weight)
