"""The command line: exit codes, JSON shape, one-line errors, no tracebacks."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest
import torch
from ckpt_edit import (
    DOWN_SCALE,
    GATE_UP_SCALE,
    edit_config,
    load_shard,
    remove_tensor,
    replace_tensor,
    shard_of,
)

from nxdi_gptoss_fp8 import format as fmt
from nxdi_gptoss_fp8.cli import main

GOOD_NC = {
    "tp_degree": 2, "quantized": True, "quantization_type": fmt.QUANTIZATION_TYPE,
    "quantization_dtype": fmt.QUANTIZATION_DTYPE, "modules_to_not_convert": ["self_attn", "lm_head"],
}


def run(args: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    code = main(args)
    out, err = capsys.readouterr()
    return code, out, err


def test_validate_valid(tiny_template: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = run(["validate", str(tiny_template), "--allow-custom-model"], capsys)
    assert code == 0 and out.strip().splitlines()[-1].startswith("VALID") and err == ""


def test_validate_custom_needs_opt_in(tiny_template: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    code, out, _ = run(["validate", str(tiny_template)], capsys)
    assert code == 1 and "config.custom_profile_not_allowed" in out
    monkeypatch.setenv(fmt.ALLOW_CUSTOM_ENV, "1")
    assert run(["validate", str(tiny_template)], capsys)[0] == 0


def test_validate_json(tiny_checkpoint: Path, capsys: pytest.CaptureFixture[str]) -> None:
    edit_config(tiny_checkpoint, lambda c: c.__setitem__("model_type", "llama"))
    code, out, _ = run(["validate", str(tiny_checkpoint), "--json", "--allow-custom-model"], capsys)
    document = json.loads(out)
    assert code == 1 and document["ok"] is False
    assert set(document) == {"ok", "complete", "not_checked", "path", "summary", "findings"}
    assert document["complete"] is True and document["not_checked"] == []
    assert {"errors", "warnings", "bytes_read", "elapsed_s", "shards", "tensors"} <= set(document["summary"])
    assert document["findings"][0] == {
        "check": "config", "code": "config.wrong_model_type", "severity": "error",
        "message": "model_type is 'llama', expected 'gpt_oss'", "file": "config.json", "key": "model_type",
    }


def _nan_scale(ckpt: Path) -> None:
    replace_tensor(ckpt, GATE_UP_SCALE, torch.full_like(load_shard(ckpt, shard_of(ckpt, GATE_UP_SCALE))[GATE_UP_SCALE], math.nan))


@pytest.mark.parametrize(("break_it", "clean"), [(None, True), (_nan_scale, True), (lambda c: remove_tensor(c, DOWN_SCALE), False)],
                         ids=["valid", "nan-scale", "missing-scale"])
def test_headers_only_is_a_partial_verdict_never_valid(tiny_checkpoint: Path, capsys: pytest.CaptureFixture[str],
                                                        break_it: Callable[[Path], None] | None, clean: bool) -> None:
    """A NaN scale is invisible to the headers: the verdict says PARTIAL, what was not checked, exit 3."""
    if break_it:
        break_it(tiny_checkpoint)
    args = ["validate", str(tiny_checkpoint), "--allow-custom-model", "--headers-only"]
    code, out, _ = run(args, capsys)
    verdict = out.strip().splitlines()[-1]
    assert "VALID" not in verdict.replace("INVALID", "")
    if clean:
        assert code == 3 and verdict.startswith("PARTIAL (headers only): no errors in what was checked; not checked: scale values;")
    else:
        assert code == 1 and verdict.startswith("INVALID")
    code, out, _ = run([*args, "--json"], capsys)
    document = json.loads(out)
    assert document["ok"] is False and document["complete"] is False and document["not_checked"] == ["scale values"]
    assert code == (3 if clean else 1)
    if break_it is _nan_scale:  # the full run finds it
        code, out, _ = run(args[:-1], capsys)
        assert code == 1 and "values." in out


@pytest.mark.parametrize("nested", [True, False])
def test_validate_with_neuron_config(tiny_template: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str], nested: bool) -> None:
    path = tmp_path / "nc.json"
    path.write_text(json.dumps({"neuron_config": GOOD_NC} if nested else GOOD_NC))
    assert run(["validate", str(tiny_template), "--neuron-config", str(path), "--allow-custom-model"], capsys)[0] == 0
    path.write_text(json.dumps({**GOOD_NC, "quantized": False}))
    code, out, _ = run(["validate", str(tiny_template), "--neuron-config", str(path), "--allow-custom-model"], capsys)
    assert code == 1 and "neuron_config.not_quantized" in out


@pytest.mark.parametrize(("content", "message"), [(None, "cannot read"), ("{nope", "not valid JSON"), ("[1]", "JSON object")])
def test_bad_neuron_config_file_is_a_usage_error(tiny_template: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str], content: str | None, message: str) -> None:
    path = tmp_path / "nc.json"
    if content is not None:
        path.write_text(content)
    code, out, err = run(["validate", str(tiny_template), "--neuron-config", str(path)], capsys)
    assert code == 2 and message in err and len(err.strip().splitlines()) == 1 and out == ""


def test_usage_errors_exit_2(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as raised:
        main(["validate"])
    assert raised.value.code == 2
    with pytest.raises(SystemExit) as raised:
        main([])
    assert raised.value.code == 2


def test_missing_directory_is_a_finding(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = run(["validate", str(tmp_path / "absent")], capsys)
    assert code == 1 and "filesystem.missing_directory" in out and err == ""


def test_inspect(tiny_padded_template: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run(["inspect", str(tiny_padded_template), "--allow-custom-model"], capsys)
    assert code == 0
    assert "hidden 64 -> 96 (+32)" in out and "F8_E4M3" in out and "VALID" in out
    assert "a normalized FP8 checkpoint (format version 1)" in out and "CHECKPOINT_FORMAT=normalized_fp8" in out
    code, out, _ = run(["inspect", str(tiny_padded_template), "--json", "--allow-custom-model"], capsys)
    summary = json.loads(out)
    assert summary["ok"] is True and summary["recognized"]["kind"] == "normalized-fp8"
    assert summary["padding"] == {"hidden": [64, 96], "intermediate": [64, 128]}
    assert summary["total_tensor_bytes"] == sum(summary["bytes_by_dtype"].values())


def test_inspect_honours_the_custom_opt_in_like_validate(
    tiny_template: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv(fmt.ALLOW_CUSTOM_ENV, raising=False)
    for extra in ([], ["--allow-custom-model"]):
        validated = run(["validate", str(tiny_template), *extra], capsys)[0]
        code, out, _ = run(["inspect", str(tiny_template), *extra], capsys)
        assert code == validated == (0 if extra else 1)
        assert ("config.custom_profile_not_allowed" in out) == (not extra)
    monkeypatch.setenv(fmt.ALLOW_CUSTOM_ENV, "1")
    assert run(["inspect", str(tiny_template)], capsys)[0] == run(["validate", str(tiny_template)], capsys)[0] == 0


def test_inspect_of_an_invalid_checkpoint_prints_the_first_findings(
    tiny_checkpoint: Path, capsys: pytest.CaptureFixture[str],
) -> None:
    edit_config(tiny_checkpoint, lambda config: config.__setitem__("model_type", "llama"))
    code, out, _ = run(["inspect", str(tiny_checkpoint), "--allow-custom-model"], capsys)
    assert code == 1 and "INVALID" in out
    assert "ERROR config.wrong_model_type [config.json:model_type]" in out and f"validate {tiny_checkpoint}" in out
    code, out, _ = run(["inspect", str(tiny_checkpoint), "--allow-custom-model", "--json"], capsys)
    data = json.loads(out)
    assert code == 1 and data["ok"] is False and "config.wrong_model_type" in [f["code"] for f in data["findings"]]


def test_inspect_any_directory(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from nxdi_gptoss_fp8.synthetic import make_source

    source = make_source(tmp_path / "hf")
    code, out, err = run(["inspect", str(source)], capsys)
    assert code == 0 and err == ""
    assert "an HF MXFP4 checkpoint" in out and f"nxdi-gptoss-fp8 convert {source} OUT" in out and "why" in out
    code, out, _ = run(["inspect", str(source / "original"), "--json"], capsys)
    assert code == 0 and json.loads(out)["recognized"]["kind"] == "openai-original"
    (tmp_path / "empty").mkdir()
    code, out, _ = run(["inspect", str(tmp_path / "empty")], capsys)
    assert code == 1 and "looked for" in out
    code, out, err = run(["inspect", str(tmp_path / "absent")], capsys)
    assert code == 2 and out == "" and len(err.strip().splitlines()) == 1


def test_inspect_refuses_special_files_without_blocking(tmp_path: Path, tiny_checkpoint: Path,
                                                        capsys: pytest.CaptureFixture[str]) -> None:
    os.mkfifo(tmp_path / "fifo")
    code, out, err = run(["inspect", str(tmp_path / "fifo")], capsys)
    assert code == 2 and "FIFO" in err
    (tiny_checkpoint / fmt.CONFIG_FILE).unlink()
    os.mkfifo(tiny_checkpoint / fmt.CONFIG_FILE)
    code, out, _ = run(["inspect", str(tiny_checkpoint), "--allow-custom-model"], capsys)
    assert code == 1 and "config.json is a FIFO (named pipe)" in out and "verdict" not in out


def test_make_tiny(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "t"
    code, stdout, _ = run(["make-tiny", str(out), "--layers", "3", "--experts", "8", "--padded-hidden-size", "96"], capsys)
    assert code == 0 and "VALID" in stdout
    assert len([k for k in json.loads((out / fmt.INDEX_FILE).read_text())["weight_map"] if k.startswith("layers.2.")]) == 19
    code, _, err = run(["make-tiny", str(out)], capsys)
    assert code == 1 and "--overwrite" in err
    code, _, err = run(["make-tiny", str(tmp_path / "u"), "--padded-hidden-size", "70"], capsys)
    assert code == 2 and "multiple of 32" in err


def test_demo(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run(["demo"], capsys)
    assert code == 0
    assert "demo succeeded" in out
    assert out.count("INVALID") == 3


def test_console_script_has_no_traceback_on_garbage(tmp_path: Path) -> None:
    ckpt = tmp_path / "garbage"
    ckpt.mkdir()
    (ckpt / fmt.INDEX_FILE).write_bytes(os.urandom(64))
    (ckpt / fmt.CONFIG_FILE).write_bytes(b"\xff\xfe")
    result = subprocess.run([sys.executable, "-m", "nxdi_gptoss_fp8.cli", "validate", str(ckpt)], capture_output=True, text=True, check=False)
    assert result.returncode == 1
    assert "Traceback" not in result.stderr + result.stdout


def test_import_is_light() -> None:
    code = "import sys, nxdi_gptoss_fp8, nxdi_gptoss_fp8.cli; print(sorted(m for m in ('torch', 'neuronx_distributed_inference', 'numpy', 'safetensors') if m in sys.modules))"
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert result.stdout.strip() == "[]"
