"""The names that do not belong in a normalized checkpoint: derived, HF, legacy, stray scales."""

from __future__ import annotations

import pytest

from nxdi_gptoss_fp8 import format as fmt
from nxdi_gptoss_fp8 import other_formats


@pytest.mark.parametrize(
    ("key", "derived"),
    [
        ("rank_util.rank", True),
        ("layers.7.self_attn.rank_util.rank", True),
        ("embed_tokens.rank_util.rank", True),
        ("layers.0.self_attn.tkg_learned_sinks.sink", True),
        ("lm_head.bias", True),
        ("layers.2.self_attn.Wqkv.weight", True),
        ("layers.2.input_layernorm.weight_unpadded", True),
        ("norm.weight_unpadded", True),
        ("norm.weight", False),
        ("layers.0.self_attn.learned_sinks.sink", False),
    ],
)
def test_derived_keys(key: str, derived: bool) -> None:
    assert (other_formats.derived_reason(key) is not None) is derived


@pytest.mark.parametrize(
    ("key", "code"),
    [
        ("model.layers.0.input_layernorm.weight", "hf_name"),
        ("layers.0.mlp.experts.gate_up_proj_blocks", "hf_name"),
        ("layers.0.mlp.experts.down_proj_scales", "hf_name"),
        ("layers.0.self_attn.sinks", "hf_name"),
        ("block.3.mlp.mlp1_weight", "legacy_name"),
        ("embedding.weight", "legacy_name"),
        ("layers.0.input_layernorm.weight", None),
    ],
)
def test_foreign_names(key: str, code: str | None) -> None:
    found = other_formats.foreign_name(key)
    assert (found[0] if found else None) == code


def test_stray_scales() -> None:
    assert other_formats.is_stray_scale("layers.0.self_attn.q_proj.weight_scale")
    assert not other_formats.is_stray_scale(f"layers.1.{fmt.DOWN}.scale")
    assert other_formats.is_stray_scale(f"layers.1.{fmt.DOWN}.SCALE")
    assert other_formats.is_stray_scale("layers.0.self_attn.q_proj.scale.weight")
