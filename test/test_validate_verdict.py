"""The one verdict on a directory and a NeuronConfig, and the start's checkpoint-path rule that
``validate DIR --neuron-config F`` applies (the placeholder of the model card, another directory)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from nxdi_gptoss_fp8 import cli
from nxdi_gptoss_fp8 import format as fmt
from nxdi_gptoss_fp8.validate.verdict import PLACEHOLDER_PATH, checkpoint_path_problem, checkpoint_verdict

FP8 = {"quantized": True, "quantization_type": fmt.QUANTIZATION_TYPE, "quantization_dtype": fmt.QUANTIZATION_DTYPE,
       "modules_to_not_convert": ["lm_head", "self_attn"]}


def test_the_cards_placeholder_is_the_one_the_card_prints() -> None:
    import inspect

    from nxdi_gptoss_fp8.convert.card import loading_neuron_config

    assert inspect.signature(loading_neuron_config).parameters["path"].default == PLACEHOLDER_PATH


@pytest.mark.parametrize(("named", "problem"), [
    ("SELF", None), ("SELF/", None), ("LINK", None), (PLACEHOLDER_PATH, "placeholder"), (f"{PLACEHOLDER_PATH}/", "placeholder"),
    ("OTHER", "not"), (7, None), (None, None),
])
def test_the_checkpoint_path_rule(tiny_template: Path, tmp_path: Path, named: object, problem: str | None) -> None:
    (tmp_path / "link").symlink_to(tiny_template)
    words = {"SELF": str(tiny_template), "SELF/": f"{tiny_template}/", "LINK": str(tmp_path / "link"),
             "OTHER": str(tmp_path / "other")}
    value = words.get(named, named) if isinstance(named, str) else named
    found = checkpoint_path_problem({**FP8, "quantized_checkpoints_path": value}, tiny_template)
    assert (found is None) is (problem is None)
    if problem:
        assert problem in found and "quantized_checkpoints_path" in found and str(tiny_template) in found


def test_only_a_served_directory_gets_the_rule(tiny_template: Path) -> None:
    config = {**FP8, "quantized_checkpoints_path": "/elsewhere"}
    assert checkpoint_verdict(tiny_template, neuron_config=config, allow_custom_model=True).report.ok
    report = checkpoint_verdict(tiny_template, neuron_config=config, allow_custom_model=True, served=True).report
    assert [f.code for f in report.errors] == ["neuron_config.checkpoint_path_elsewhere"]


@pytest.mark.parametrize(("path", "code"), [("PLACEHOLDER", 1), ("OTHER", 1), ("SELF", 0)])
def test_validate_with_a_neuron_config_naming_another_directory_fails_naming_the_key(
        tiny_template: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str], path: str, code: int) -> None:
    ckpt = Path(shutil.copytree(tiny_template, tmp_path / "ckpt"))
    other = Path(shutil.copytree(tiny_template, tmp_path / "other"))
    value = {"PLACEHOLDER": PLACEHOLDER_PATH, "OTHER": str(other), "SELF": str(ckpt)}[path]
    (tmp_path / "nc.json").write_text(json.dumps({**FP8, "quantized_checkpoints_path": value}))
    assert cli.main(["validate", str(ckpt), "--neuron-config", str(tmp_path / "nc.json"), "--allow-custom-model"]) == code
    out = capsys.readouterr().out
    assert ("neuron_config.checkpoint_path_elsewhere" in out) is bool(code)
