"""The start plan: its checks in order, each refusing as the start refuses (the same exception and
words), the entry point read as vLLM reads ``VLLM_PLUGINS``, and where the compile writes."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from nxdi_gptoss_fp8 import format as fmt
from nxdi_gptoss_fp8.errors import CheckpointFormatError, ConfigError, LoadError, PreflightError, RegistrationError
from nxdi_gptoss_fp8.nxdi import start_plan
from nxdi_gptoss_fp8.nxdi.start_plan import StartInputs, run_check

FP8 = {"quantized": True, "quantization_type": fmt.QUANTIZATION_TYPE, "quantization_dtype": fmt.QUANTIZATION_DTYPE,
       "modules_to_not_convert": ["lm_head", "self_attn"]}


def test_the_plan_is_in_the_starts_order_and_names_every_setting() -> None:
    assert start_plan.plan_names() == ("entry_point", "client_config", "checkpoint_format", "allow_custom_model",
                                       "compile_target", "presharded", "checkpoint", "load_choices", "reference")
    settings = " ".join(check.setting for check in start_plan.PLAN)
    for variable in (fmt.ALLOW_CUSTOM_ENV, fmt.VERIFY_AT_LOAD_ENV, fmt.LOAD_MODE_ENV, fmt.REFERENCE_ENV,
                     "CHECKPOINT_FORMAT", "NEURON_COMPILED_ARTIFACTS", "VLLM_PLUGINS"):
        assert variable in settings
    assert {check.by for check in start_plan.PLAN} == {"vllm", "hook", "accuracy"}


@pytest.mark.parametrize(("plugins", "loaded"), [(None, True), ("nxdi_gptoss_fp8", True), ("neuron,nxdi_gptoss_fp8", True),
                                                 ("neuron", False), ("", False), ("neuron, nxdi_gptoss_fp8", False),
                                                 ("NXDI_GPTOSS_FP8", False)])
def test_the_entry_point_is_read_as_vllm_reads_vllm_plugins(plugins: str | None, loaded: bool) -> None:
    """vLLM splits the value on commas and compares each name exactly (no spaces stripped)."""
    environ = {} if plugins is None else {"VLLM_PLUGINS": plugins}
    if loaded:
        start_plan.entry_point(environ)
        return
    with pytest.raises(RegistrationError, match="nxdi_gptoss_fp8") as caught:
        start_plan.entry_point(environ)
    assert "\n" not in str(caught.value)


@given(st.text(max_size=40))
def test_the_entry_point_check_raises_nothing_but_its_refusal(value: str) -> None:
    try:
        start_plan.entry_point({"VLLM_PLUGINS": value})
    except RegistrationError:
        assert start_plan.ENTRY_POINT not in value.split(",")


def test_where_the_compile_writes(tmp_path: Path) -> None:
    model = tmp_path / "model"
    model.mkdir()
    (tmp_path / "link").symlink_to(model)
    (tmp_path / "file").write_text("")
    for compiled in (str(model), f"{model}/", str(tmp_path / "link"), f"{tmp_path}/model/../model"):
        with pytest.raises(ConfigError, match="stray_weight_file"):
            start_plan.compile_target(str(model), compiled)
    with pytest.raises(ConfigError, match="is a file"):
        start_plan.compile_target(str(model), str(tmp_path / "file"))
    assert "inside the checkpoint" in start_plan.compile_target(str(model), str(model / "compiled"))
    assert "is unset" in start_plan.compile_target(str(model), None)
    assert start_plan.compile_target(str(model), str(tmp_path / "elsewhere")) is None


@pytest.mark.parametrize(("environ", "override", "error", "words"), [
    ({"CHECKPOINT_FORMAT": "normalised-fp8"}, {}, CheckpointFormatError, "did you mean"),
    ({"CHECKPOINT_FORMAT": "hf"}, {"checkpoint_format": "normalized_fp8"}, CheckpointFormatError, "contradicts"),
    ({fmt.ALLOW_CUSTOM_ENV: "ture"}, {}, ConfigError, fmt.ALLOW_CUSTOM_ENV),
    ({fmt.VERIFY_AT_LOAD_ENV: "ture"}, {}, LoadError, fmt.VERIFY_AT_LOAD_ENV),
    ({fmt.LOAD_MODE_ENV: "privat"}, {}, LoadError, "is not a load mode"),
    ({fmt.LOAD_MODE_ENV: "private"}, {fmt.LOAD_MODE_ATTR: "mmap"}, LoadError, "contradicts"),
    ({fmt.REFERENCE_ENV: "dequantised"}, {}, ConfigError, "did you mean"),
])
def test_each_setting_is_refused_by_its_check(environ: dict[str, str], override: dict[str, Any], error: type,
                                              words: str) -> None:
    inputs = StartInputs({"CHECKPOINT_FORMAT": "normalized_fp8", **environ}, {**FP8, **override})
    refused = [name for name in ("checkpoint_format", "allow_custom_model", "load_choices", "reference")
               if _refuses(name, inputs, error, words)]
    assert len(refused) == 1, refused


def _refuses(name: str, inputs: StartInputs, error: type, words: str) -> bool:
    try:
        run_check(name, inputs)
    except error as exc:
        assert words in str(exc) and "\n" not in str(exc)
        return True
    return False


def test_run_check_keeps_each_value_and_names_the_check_running(tiny_template: Path) -> None:
    inputs = StartInputs({"CHECKPOINT_FORMAT": "normalized_fp8", fmt.ALLOW_CUSTOM_ENV: "1"},
                         {**FP8, "quantized_checkpoints_path": str(tiny_template)}, model=str(tiny_template))
    assert start_plan.active_check() is None
    assert run_check("checkpoint_format", inputs) is True and inputs.results["checkpoint_format"] is True
    assert run_check("checkpoint", inputs).report.ok
    assert run_check("load_choices", inputs) == (False, fmt.LOAD_MODE_MMAP)
    assert start_plan.active_check() is None


def test_the_checkpoint_check_raises_the_preflights_refusal_with_what_the_directory_is(tmp_path: Path) -> None:
    from nxdi_gptoss_fp8.synthetic.sources import SOURCE_MXFP4, make_source
    from nxdi_gptoss_fp8.synthetic.tiny import TINY_DIMS

    hf = make_source(tmp_path / "hf", SOURCE_MXFP4, dims=TINY_DIMS)
    inputs = StartInputs({}, {**FP8, "quantized_checkpoints_path": str(hf)}, model=str(hf))
    with pytest.raises(PreflightError) as caught:
        run_check("checkpoint", inputs)
    assert caught.value.hint and "normalized FP8" in caught.value.hint
    assert inputs.results["checkpoint"].recognition is not None


def test_the_hook_reexports_the_opt_in_parser() -> None:
    from nxdi_gptoss_fp8.nxdi import hook

    assert hook.normalized_mode is start_plan.normalized_mode and hook.ENV_VAR == start_plan.ENV_FORMAT
    assert start_plan.normalized_mode(None, {"CHECKPOINT_FORMAT": " Normalized_FP8 "}) is True
