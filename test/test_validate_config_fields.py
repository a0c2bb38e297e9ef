"""The config.json field rule: every field of a checkpoint's config.json means what NxDI computes."""

from __future__ import annotations

from typing import Any

import pytest

from nxdi_gptoss_fp8 import format as fmt
from nxdi_gptoss_fp8.synthetic.tiny import TINY_DIMS
from nxdi_gptoss_fp8.validate.config_fields import config_field_problems


@pytest.mark.parametrize("profile", sorted(fmt.PROFILES))
def test_the_configs_we_write_mean_what_nxdi_computes(profile: str) -> None:
    dims = fmt.PROFILES[profile]
    assert config_field_problems(fmt.hf_config(dims), dims) == []


def test_transformers_defaults_mean_what_nxdi_computes() -> None:
    """transformers' own GptOssConfig (the published values) draws no finding, warning included."""
    transformers = pytest.importorskip("transformers")
    config = transformers.GptOssConfig(initial_context_length=4096, swiglu_limit=7.0).to_dict()
    dims = fmt.dims_from_config(config)
    assert config_field_problems(config, dims) == []


@pytest.mark.parametrize(("change", "reason"), [
    ({"rope_scaling": {**fmt.hf_config(TINY_DIMS)["rope_scaling"], "factor": 1.0}}, None),  # no YaRN: plain rotary
    ({"rope_theta": 10000}, None),
    ({"swiglu_limit": 7}, None),
    ({"hidden_act": "sigmoid"}, None),  # what NxDI itself writes
    ({"pad_token_id": None}, None),
    ({"rope_theta": float("inf")}, "bad_rope"),
    ({"rope_theta": True}, "bad_rope"),
    ({"rms_norm_eps": 1e-5 + 1e-12}, "hard_coded_mismatch"),
    ({"tie_word_embeddings": 0}, "hard_coded_mismatch"),
    ({"rope_ntk_beta": 32.0}, None),  # NxDI reads it first: it agrees with beta_fast
    ({"rope_ntk_alpha": 2.0}, "rope_mismatch"),
    ({"dtype": "float16"}, "dtype_not_bfloat16"),
])
def test_config_field_rules(change: dict[str, Any], reason: str | None) -> None:
    config = {**fmt.hf_config(TINY_DIMS), **change}
    assert {p.reason for p in config_field_problems(config, TINY_DIMS)} == ({reason} if reason else set())


def test_yarn_correction_range_is_nxdi_s_assertion() -> None:
    """A head too small for the YaRN settings: NxDI asserts 0 < low < high < head_dim/2 - 1."""
    dims = fmt.ModelDims(**{**TINY_DIMS.as_dict(), "head_dim": 4, "num_attention_heads": 16, "num_key_value_heads": 8})
    (problem,) = config_field_problems(fmt.hf_config(dims), dims)
    assert problem.reason == "bad_rope" and "head_dim=4" in problem.message


def test_unknown_fields_are_named_and_bounded() -> None:
    config = {**fmt.hf_config(TINY_DIMS), **{f"extra_{n}": n for n in range(500)}}
    problems = config_field_problems(config, TINY_DIMS)
    assert all(p.warning and p.reason == "unknown_field" for p in problems)
    assert len(problems) == 100 and problems[0].key == "extra_0"
