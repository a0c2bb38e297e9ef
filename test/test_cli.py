"""The command line: exit codes, JSON shape, one-line errors, no tracebacks."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

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

from nxdi_gptoss_fp8 import cli
from nxdi_gptoss_fp8 import format as fmt
from nxdi_gptoss_fp8.cli import inspect as cli_inspect
from nxdi_gptoss_fp8.cli import main
from nxdi_gptoss_fp8.units import format_bytes

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
    assert set(document) == {"ok", "complete", "not_checked", "path", "summary", "findings", "hint"}
    assert document["complete"] is True and document["not_checked"] == []
    assert {"errors", "warnings", "bytes_read", "elapsed_s", "shards", "tensors"} <= set(document["summary"])
    assert document["findings"][0] == {
        "check": "config", "code": "config.wrong_model_type", "severity": "error",
        "message": "model_type is 'llama', expected 'gpt_oss'", "file": "config.json", "key": "model_type",
    }


def _timeless(document: dict[str, Any]) -> dict[str, Any]:
    """A report's document without the one figure two runs never share."""
    return {**document, "summary": {k: v for k, v in document["summary"].items() if k != "elapsed_s"}}


@pytest.mark.parametrize(("case", "options", "keywords"), [
    ("valid", ["--allow-custom-model"], {"allow_custom_model": True}),
    ("partial", ["--allow-custom-model", "--headers-only"], {"allow_custom_model": True, "read_scales": False}),
    ("invalid", ["--allow-custom-model"], {"allow_custom_model": True}),
    ("hf-mxfp4", [], {}),
])
def test_validate_json_is_the_library_report_plus_ok(case: str, options: list[str], keywords: dict[str, Any],
                                                     tiny_checkpoint: Path, tmp_path: Path,
                                                     capsys: pytest.CaptureFixture[str]) -> None:
    """``validate --json`` prints ``preflight(...).to_dict()`` (``ok`` and the ``hint`` included), nothing added."""
    from nxdi_gptoss_fp8.synthetic.sources import SOURCE_MXFP4, make_source
    from nxdi_gptoss_fp8.validate.pipeline import preflight

    path = tiny_checkpoint
    if case == "invalid":
        edit_config(path, lambda c: c.__setitem__("model_type", "llama"))
    elif case == "hf-mxfp4":
        path = tmp_path / "src"
        make_source(path, SOURCE_MXFP4)
    code, out, _ = run(["validate", str(path), "--json", *options], capsys)
    document = json.loads(out)
    report = preflight(path, **keywords).to_dict()
    assert _timeless(document) == _timeless(report) and "ok" in document
    assert (document["hint"] is not None) == (case == "hf-mxfp4")
    assert code == {"valid": 0, "partial": 3}.get(case, 1)


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


NEURON_CONFIG_FORMS = {
    "flat": lambda nc: nc,
    "nested as NxDI saves it": lambda nc: {"neuron_config": nc},
    "vLLM's --additional-config": lambda nc: {"override_neuron_config": nc},
}


@pytest.mark.parametrize("form", list(NEURON_CONFIG_FORMS))
def test_validate_with_neuron_config(tiny_template: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str], form: str) -> None:
    """Each form the user may hold is read as NxDI (or vllm-neuron) builds the NeuronConfig from it:
    the keys they set are found, never reported missing, and a wrong one is the same finding."""
    good = {**GOOD_NC, "quantized_checkpoints_path": str(tiny_template)}  # vllm-neuron passes it (None when left out)
    wrap = NEURON_CONFIG_FORMS[form]
    path = tmp_path / "nc.json"
    path.write_text(json.dumps(wrap(good)))
    code, out, _ = run(["validate", str(tiny_template), "--neuron-config", str(path), "--allow-custom-model"], capsys)
    assert code == 0 and "unknown_key" not in out and "WARNING" not in out
    for change, finding in (({"quantized": False}, "neuron_config.not_quantized"),
                            ({"quantization_dtype": "int8"}, "neuron_config.wrong_quantization_dtype"),
                            ({"modules_to_not_convert": ["lm_head"]}, "neuron_config.attention_not_excluded")):
        path.write_text(json.dumps(wrap({**good, **change})))
        code, out, _ = run(["validate", str(tiny_template), "--neuron-config", str(path), "--allow-custom-model"], capsys)
        assert code == 1 and finding in out and "dma_order_config" not in out


@pytest.mark.parametrize(("content", "message"), [(None, "cannot read"), ("{nope", "not valid JSON"), ("[1]", "JSON object")])
def test_bad_neuron_config_file_is_a_usage_error(tiny_template: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str], content: str | None, message: str) -> None:
    path = tmp_path / "nc.json"
    if content is not None:
        path.write_text(content)
    code, out, err = run(["validate", str(tiny_template), "--neuron-config", str(path)], capsys)
    assert code == 2 and message in err and len(err.strip().splitlines()) == 1 and out == ""


@pytest.mark.parametrize(("content", "once"), [
    ('{"a": 1, "a": 2}', "--neuron-config"), ("{nope", "--neuron-config"), (b"\xff", "--neuron-config"),
    (None, "--neuron-config"), ("DIR", "--neuron-config"),
])
def test_neuron_config_errors_name_the_option_once(tiny_template: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                                   content: str | bytes | None, once: str) -> None:
    path = tmp_path / "nc.json"
    if content == "DIR":
        path.mkdir()
    elif isinstance(content, bytes):
        path.write_bytes(content)
    elif content is not None:
        path.write_text(content)
    code, _, err = run(["validate", str(tiny_template), "--neuron-config", str(path)], capsys)
    assert code == 2 and err.count(once) == 1 and err.count(str(path)) == 1, err


@pytest.mark.parametrize(("variable", "argv"), [
    (fmt.ALLOW_CUSTOM_ENV, ["validate", "CKPT"]), (fmt.ALLOW_CUSTOM_ENV, ["validate", "CKPT", "--allow-custom-model"]),
    (fmt.ALLOW_CUSTOM_ENV, ["inspect", "CKPT"]), (cli.DEBUG_ENV, ["validate", "CKPT"]),
])
def test_a_switch_that_is_neither_on_nor_off_is_refused(tiny_template: Path, capsys: pytest.CaptureFixture[str],
                                                        monkeypatch: pytest.MonkeyPatch, variable: str, argv: list[str]) -> None:
    monkeypatch.setenv(variable, "ture")
    code, out, err = run([str(tiny_template) if arg == "CKPT" else arg for arg in argv], capsys)
    assert code == 2 and out == "" and len(err.strip().splitlines()) == 1
    assert f"{variable}='ture' is not on or off" in err


def test_usage_errors_exit_2(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as raised:
        main(["validate"])
    assert raised.value.code == 2
    with pytest.raises(SystemExit) as raised:
        main([])
    assert raised.value.code == 2


@pytest.mark.parametrize(("command", "case", "message"), [
    ("validate", "absent", "does not exist"), ("validate", "file", "is a file, not a directory"),
    ("validate", "unreadable", "cannot be listed"), ("inspect", "absent", ""), ("inspect", "file", ""),
])
def test_unusable_checkpoint_path_is_exit_2_in_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                                        monkeypatch: pytest.MonkeyPatch, command: str, case: str,
                                                        message: str) -> None:
    path = tmp_path / case
    if case == "file":
        path.write_text("{}")
    if case == "unreadable":
        path.mkdir()
        monkeypatch.setattr(cli.os, "access", lambda *a, **k: False)  # root can read anything: simulate
    code, out, err = run([command, str(path)], capsys)
    assert code == 2 and out == "" and len(err.strip().splitlines()) == 1
    assert message in err  # inspect names what the path is in its own words (its recognizer)


def test_verify_conversion_of_a_missing_checkpoint_is_exit_2(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = run(["verify-conversion", str(tmp_path / "absent"), "--source", str(tmp_path)], capsys)
    assert code == 2 and out == "" and "absent does not exist" in err and len(err.strip().splitlines()) == 1
    code, out, err = run(["verify-conversion", str(tmp_path), "--source", str(tmp_path / "nosrc")], capsys)
    assert code == 2 and "nosrc does not exist" in err and len(err.strip().splitlines()) == 1


def _run_without(modules: list[str], argv: list[str], cwd: Path) -> subprocess.CompletedProcess[str]:
    """The CLI in a fresh interpreter where ``modules`` cannot be imported."""
    code = (f"import sys\nfor name in {modules!r}:\n    sys.modules[name] = None\n"
            f"from nxdi_gptoss_fp8.cli import main\nsys.exit(main({argv!r}))")
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=cwd, check=False)


@pytest.mark.parametrize(("missing", "argv", "needed"), [
    (["torch"], ["make-tiny", "out"], "nxdi-gptoss-fp8 make-tiny: needs torch, which is not installed here"),
    (["torch"], ["make-tiny", "out", "--hf-mxfp4"], "make-tiny: --hf-mxfp4 needs torch"),
    (["safetensors"], ["make-tiny", "out", "--hf-bf16"], "make-tiny: --hf-bf16 needs safetensors"),
    (["torch"], ["convert", "SRC", "out"], "convert: needs torch"),
    (["torch"], ["verify-conversion", "SRC", "--source", "SRC"], "verify-conversion: needs torch"),
    (["numpy"], ["validate", "SRC", "--deep"], "validate: --deep needs numpy"),
])
def test_a_missing_dependency_is_one_line_and_exit_2(tiny_template: Path, tmp_path: Path, missing: list[str],
                                                     argv: list[str], needed: str) -> None:
    argv = [str(tiny_template) if arg == "SRC" else arg for arg in argv]
    result = _run_without(missing, argv, tmp_path)
    assert result.returncode == 2, result.stderr
    assert result.stdout == "" and "Traceback" not in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1 and needed in result.stderr and "pip install" in result.stderr
    assert not (tmp_path / "out").exists()


def test_demo_needs_no_torch_and_says_it_skipped_the_load(tmp_path: Path) -> None:
    result = _run_without(["torch", "numpy", "safetensors", "tqdm"], ["demo"], tmp_path)
    assert result.returncode == 0, result.stderr
    assert "Traceback" not in result.stderr and "demo succeeded" in result.stdout
    skipped = [line for line in result.stdout.splitlines() if "skipped the zero-copy load" in line]
    assert len(skipped) == 1 and "needs torch" in skipped[0]
    assert result.stdout.count("INVALID") == 3


def test_library_deep_preflight_without_numpy_raises_instead_of_a_finding(tmp_path: Path, tiny_template: Path) -> None:
    code = ("import sys\nsys.modules['numpy'] = None\nfrom nxdi_gptoss_fp8 import preflight, MissingDependencyError\n"
            f"try:\n    preflight({str(tiny_template)!r}, allow_custom_model=True, deep=True)\n"
            "except MissingDependencyError as exc:\n    print('raised', exc)\n")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert result.stdout.startswith("raised") and "needs numpy" in result.stdout


@pytest.mark.parametrize("extra", [[], ["--json"]])
def test_closed_pipe_exits_quietly(tiny_checkpoint: Path, extra: list[str]) -> None:
    """``validate X | head -1``, made deterministic: the reader is gone before the first write."""
    edit_config(tiny_checkpoint, lambda c: c.__setitem__("model_type", "llama"))
    read_end, write_end = os.pipe()
    os.close(read_end)
    try:
        result = subprocess.run([sys.executable, "-m", "nxdi_gptoss_fp8.cli", "validate", str(tiny_checkpoint), *extra],
                                stdout=write_end, stderr=subprocess.PIPE, text=True, check=False)
    finally:
        os.close(write_end)
    assert result.stderr == ""
    assert result.returncode == cli.EXIT_BROKEN_PIPE


def test_plurals_in_the_verdict(tiny_checkpoint: Path, capsys: pytest.CaptureFixture[str]) -> None:
    edit_config(tiny_checkpoint, lambda c: c.__setitem__("model_type", "llama"))
    _, out, _ = run(["validate", str(tiny_checkpoint), "--allow-custom-model"], capsys)
    assert ": 1 error, 0 warnings; 4 shards, 41 tensors, profile custom; read " in out.splitlines()[-1]


@pytest.mark.parametrize(("max_shard_size", "shards"), [(10**9, "1 file,"), (64_000, "4 files,")])
def test_inspect_counts_shards_in_words(tmp_path: Path, capsys: pytest.CaptureFixture[str], max_shard_size: int,
                                        shards: str) -> None:
    from nxdi_gptoss_fp8.synthetic.tiny import make_tiny

    ckpt = make_tiny(tmp_path / "tiny", max_shard_size=max_shard_size)
    _, out, _ = run(["inspect", ckpt], capsys)
    assert any(line.startswith(f"shards      {shards}") for line in out.splitlines()), out


def test_an_hf_checkpoint_is_summarized_and_all_lists_everything(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from nxdi_gptoss_fp8.synthetic.sources import SOURCE_MXFP4, make_source

    src = make_source(tmp_path / "hf", SOURCE_MXFP4)
    _, summarized, _ = run(["validate", str(src)], capsys)
    _, every, _ = run(["validate", str(src), "--all"], capsys)
    hf_lines = [line for line in summarized.splitlines() if "namespace.hf_name" in line]
    assert len(hf_lines) == 2  # one per shard
    assert all(" times (model." in line and ", ...); the first: " in line for line in hf_lines)
    assert "--all lists every one" in summarized
    assert sum("namespace.hf_name" in line for line in every.splitlines()) > 30
    document = json.loads(run(["validate", str(src), "--json"], capsys)[1])
    assert sum(f["code"] == "namespace.hf_name" for f in document["findings"]) > 30


@pytest.mark.parametrize("kind", ["hf-bf16", "compressed-tensors-fp8", "hf-mxfp4"])
def test_validate_of_another_kind_leads_with_inspects_verdict(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                                             kind: str) -> None:
    """The first line is the recognizer's verdict and action; no finding advises NxDI's HF converter
    for a checkpoint it cannot load (HF BF16, compressed-tensors)."""
    from nxdi_gptoss_fp8.synthetic.sources import SOURCE_BF16, SOURCE_MXFP4, make_compressed_tensors_source, make_source

    src = tmp_path / "src"
    if kind == "compressed-tensors-fp8":
        make_compressed_tensors_source(src)
    else:
        make_source(src, SOURCE_BF16 if kind == "hf-bf16" else SOURCE_MXFP4)
    inspected = json.loads(run(["inspect", str(src), "--json"], capsys)[1])
    assert inspected["recognized"]["kind"] == kind
    code, out, _ = run(["validate", str(src), "--all"], capsys)
    first, *findings = out.splitlines()
    assert code == 1 and first.startswith(f"{src} is {inspected['recognized']['title']}: ")
    assert all(action in first for action in inspected["recognized"]["actions"])
    assert findings[0].startswith("ERROR index.not_normalized")
    hf_load = "NxDI's HF converter" in out
    assert hf_load == (kind == "hf-mxfp4"), out
    document = json.loads(run(["validate", str(src), "--json"], capsys)[1])
    assert document["hint"] == first and document["ok"] is False


def test_validate_of_a_partial_copy_of_a_compiled_directory_says_so(tmp_path: Path,
                                                                     capsys: pytest.CaptureFixture[str]) -> None:
    """weights/ copied without neuron_config.json: the recognizer's verdict (copy the whole compiled
    directory) comes first, not only "index missing, copy the HF config"."""
    from safetensors.torch import save_file

    (tmp_path / "weights").mkdir()
    for rank in range(2):
        save_file({"x": torch.zeros(2)}, str(tmp_path / "weights" / f"tp{rank}_sharded_checkpoint.safetensors"))
    inspected = json.loads(run(["inspect", str(tmp_path), "--json"], capsys)[1])
    assert inspected["recognized"]["kind"] == "nxdi-presharded"
    code, out, _ = run(["validate", str(tmp_path)], capsys)
    first = out.splitlines()[0]
    assert code == 1 and first.startswith(f"{tmp_path} is {inspected['recognized']['title']}: ")
    assert "copy the whole directory" in first
    document = json.loads(run(["validate", str(tmp_path), "--json"], capsys)[1])
    assert document["hint"] == first and document["ok"] is False


def test_validate_headers_only_and_deep_contradict(tiny_checkpoint: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """--headers-only reads no tensor data, --deep reads all of it: a usage error, not a PARTIAL
    verdict after a full deep scan; --deep's help names the BF16 scan it does."""
    with pytest.raises(SystemExit) as exited:
        main(["validate", str(tiny_checkpoint), "--allow-custom-model", "--headers-only", "--deep"])
    assert exited.value.code == 2 and "not allowed with" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main(["validate", "--help"])
    assert "BF16" in " ".join(capsys.readouterr().out.split())


def test_a_damaged_shard_is_one_line(tiny_checkpoint: Path, capsys: pytest.CaptureFixture[str]) -> None:
    shard = sorted(tiny_checkpoint.glob("*.safetensors"))[0]
    data = bytearray(shard.read_bytes())
    length = int.from_bytes(data[:8], "little")
    data[8:8 + length] = data[8:8 + length].replace(b"layers.0.feed", b"layers.0.fe\x7fd")
    shard.write_bytes(bytes(data))
    code, out, _ = run(["validate", str(tiny_checkpoint), "--allow-custom-model"], capsys)
    lines = [line for line in out.splitlines() if shard.name in line]
    assert code == 1 and len(lines) == 1
    assert "looks corrupted or half-copied" in lines[0] and "--verify-checksums" in lines[0]
    _, every, _ = run(["validate", str(tiny_checkpoint), "--allow-custom-model", "--all"], capsys)
    assert sum(shard.name in line for line in every.splitlines()) > 2


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
    from nxdi_gptoss_fp8.synthetic.sources import make_source

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
    assert code == 1 and "config.json is a FIFO (named pipe)" in out
    assert "filesystem.not_a_file" in out and "INVALID" in out  # the preflight's verdict, reached without blocking


def test_make_tiny(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "t"
    code, stdout, _ = run(["make-tiny", str(out), "--layers", "3", "--experts", "8", "--padded-hidden-size", "96"], capsys)
    assert code == 0 and "VALID" in stdout
    assert len([k for k in json.loads((out / fmt.INDEX_FILE).read_text())["weight_map"] if k.startswith("layers.2.")]) == 19
    code, _, err = run(["make-tiny", str(out)], capsys)
    assert code == 2 and "--overwrite" in err  # a non-empty OUT is a usage error, as in convert
    code, _, err = run(["make-tiny", str(tmp_path / "u"), "--padded-hidden-size", "70"], capsys)
    assert code == 2 and "multiple of 32" in err


def test_demo(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run(["demo"], capsys)
    assert code == 0
    assert "demo succeeded" in out
    assert out.count("INVALID") == 3
    assert "loaded the valid checkpoint through the loader" in out and "mapped 41 tensors" in out


def test_make_tiny_creates_the_output_with_the_users_umask(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    old = os.umask(0o022)
    try:
        assert run(["make-tiny", str(tmp_path / "t")], capsys)[0] == 0
        assert run(["make-tiny", str(tmp_path / "hf"), "--hf-bf16"], capsys)[0] == 0
    finally:
        os.umask(old)
    assert (tmp_path / "t").stat().st_mode & 0o777 == 0o755
    assert (tmp_path / "hf").stat().st_mode & 0o777 == 0o755
    # every file of a synthetic source too (safetensors alone writes 0600 files)
    assert {path.stat().st_mode & 0o777 for path in (tmp_path / "hf").iterdir()} == {0o644}


@pytest.mark.parametrize(("argv", "message"), [
    (["--hidden-size", "-5"], "hidden_size: must be an integer in 1 … 2^31, found -5"),
    (["--experts", "0"], "num_local_experts: must be an integer"),
    (["--vocab-size", "0"], "vocab_size: must be an integer"),
    (["--heads", "0"], "num_attention_heads: must be an integer"),
    (["--experts-per-token", "5"], "more than num_local_experts (4)"),
    (["--kv-heads", "3"], "not a multiple of num_key_value_heads=3"),
    (["--head-dim", "4", "--heads", "16", "--kv-heads", "8"], "NxDI's YaRN requires"),
    (["--layers", "100000"], "more than a tiny checkpoint's"),
    (["--hidden-size", "4096", "--intermediate-size", "8192", "--experts", "64"], "more than a tiny checkpoint's"),
    (["--padded-hidden-size", "0"], "smaller than the model's 64"),
    (["--seed", "-1"], "seed -1 is not an integer"),
    (["--max-shard-size", "0"], ""),
    (["--hf-mxfp4", "--hidden-size", "50"], "not a multiple of the MXFP4 block size 32"),
    (["--hf-bf16", "--experts-per-token", "4"], "more than num_local_experts (3)"),
    (["--ct-fp8", "--layers", "0"], "num_hidden_layers: must be an integer"),
])
def test_make_tiny_checks_its_arguments_first(tmp_path: Path, capsys: pytest.CaptureFixture[str], argv: list[str],
                                              message: str) -> None:
    """Refused before anything is written, with the format's own rules: exit 2, one line, no OUT."""
    out = tmp_path / "out"
    code, stdout, err = run(["make-tiny", str(out), *argv], capsys)
    assert code == 2 and stdout == "" and len(err.strip().splitlines()) == 1 and message in err, err
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("kind", ["", "--hf-bf16", "--ct-fp8"])
def test_make_tiny_into_a_non_empty_directory_is_exit_2_and_leaves_it(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                                                      kind: str) -> None:
    out = tmp_path / "out"
    out.mkdir()
    (out / "notes.txt").write_text("mine")
    code, _, err = run(["make-tiny", str(out), *([kind] if kind else [])], capsys)
    assert code == 2 and "--overwrite" in err and [p.name for p in out.iterdir()] == ["notes.txt"]


def test_what_make_tiny_prints_is_true(tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    """Its VALID holds with the opt-in it names, and the commands it suggests succeed as printed."""
    monkeypatch.delenv(fmt.ALLOW_CUSTOM_ENV, raising=False)
    out = tmp_path / "t"
    code, stdout, _ = run(["make-tiny", str(out)], capsys)
    assert code == 0 and "VALID" in stdout and "--allow-custom-model" in stdout
    (suggested,) = [line for line in stdout.splitlines() if line.startswith("next: ")]
    commands = [part.strip().split() for part in suggested.removeprefix("next: ").split("   or   ")]
    assert [command[1] for command in commands] == ["validate", "inspect"]
    for command in commands:
        assert run(command[1:], capsys)[0] == 0, command
    _, inspected, _ = run(["inspect", str(out)], capsys)
    (do_line,) = [line for line in inspected.splitlines() if line.startswith("do ")]
    validate = do_line[do_line.index("`") + 1:do_line.rindex("`")].split()
    assert validate[1:] == ["validate", str(out), "--allow-custom-model"] and run(validate[1:], capsys)[0] == 0
    assert fmt.ALLOW_CUSTOM_ENV in do_line


def test_make_tiny_of_a_published_profile_needs_no_opt_in(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from nxdi_gptoss_fp8.synthetic import tiny_stdlib

    published = fmt.PROFILES[fmt.PROFILE_20B]
    assert tiny_stdlib.size_problems(fmt.Layout.unpadded(published))  # far from tiny: refused first
    code, _, err = run(["make-tiny", str(tmp_path / "big"), "--layers", "24", "--experts", "32", "--hidden-size", "2880",
                        "--intermediate-size", "2880", "--head-dim", "64", "--heads", "64", "--kv-heads", "8",
                        "--vocab-size", "201088", "--experts-per-token", "4", "--sliding-window", "128"], capsys)
    assert code == 2 and "scripts/sparse_checkpoint.py" in err


def test_make_tiny_ct_fp8_source_is_recognized_and_converts(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    src, out = tmp_path / "src", tmp_path / "out"
    code, stdout, _ = run(["make-tiny", str(src), "--ct-fp8"], capsys)
    assert code == 0 and "compressed-tensors FP8" in stdout and f"nxdi-gptoss-fp8 convert {src}" in stdout
    inspected = json.loads(run(["inspect", str(src), "--json"], capsys)[1])
    assert inspected["recognized"]["kind"] == "compressed-tensors-fp8" and inspected["known"] is True
    assert inspected["ok"] is False  # validate's meaning: not a valid normalized checkpoint
    code, converted, _ = run(["convert", str(src), str(out), "--json"], capsys)
    assert code == 0 and json.loads(converted)["source_format"] == "compressed-tensors-fp8"
    assert run(["verify-conversion", str(out), "--source", str(src)], capsys)[0] == 0
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")]  # no partial folder left


@pytest.mark.parametrize("kind", ["hf-mxfp4", "unknown", "normalized-invalid", "normalized-valid"])
def test_inspect_json_ok_means_what_validate_json_ok_means(tmp_path: Path, tiny_checkpoint: Path,
                                                            capsys: pytest.CaptureFixture[str], kind: str) -> None:
    from nxdi_gptoss_fp8.synthetic.sources import make_source

    if kind == "hf-mxfp4":
        path = make_source(tmp_path / "hf")
    elif kind == "unknown":
        path = tmp_path / "empty"
        path.mkdir()
    else:
        path = tiny_checkpoint
        if kind == "normalized-invalid":
            edit_config(path, lambda c: c.__setitem__("rms_norm_eps", 1e-6))
    code, out, _ = run(["inspect", str(path), "--json", "--allow-custom-model"], capsys)
    inspected = json.loads(out)
    validated = json.loads(run(["validate", str(path), "--json", "--allow-custom-model"], capsys)[1])
    assert inspected["ok"] is validated["ok"] is (kind == "normalized-valid")
    assert inspected["known"] is (kind != "unknown")
    assert code == (0 if kind in ("hf-mxfp4", "normalized-valid") else 1)  # the exit status is unchanged


def test_check_forward_of_a_missing_path_is_exit_2(tmp_path: Path, tiny_template: Path, capsys: pytest.CaptureFixture[str]) -> None:
    for argv in (["check-forward", str(tmp_path / "absent"), "--source", str(tmp_path)],
                 ["check-forward", str(tiny_template), "--source", str(tmp_path / "absent")]):
        code, out, err = run(argv, capsys)
        assert code == 2 and out == "" and "absent does not exist" in err and len(err.strip().splitlines()) == 1


def test_inference_demo_help_explains_without_nxdi(capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    from nxdi_gptoss_fp8.nxdi import hook as nxdi_hook

    monkeypatch.setattr(nxdi_hook, "nxdi_available", lambda: False)
    code, out, err = run(["inference-demo", "--help"], capsys)
    assert code == 0 and err == "" and "CHECKPOINT_FORMAT=normalized_fp8" in out and "NxDI is not installed here" in out
    assert "nxdi-gptoss-fp8 validate" in out
    code, out, _ = run(["inference-demo"], capsys)
    assert code == 2 and out.startswith("usage: nxdi-gptoss-fp8 inference-demo")
    code, out, err = run(["inference-demo", "--model-type", "gpt_oss"], capsys)
    assert code == 2 and out == "" and "--help" in err


@pytest.mark.parametrize("kind", ["mxfp4", "bf16"])
def test_make_tiny_hf_source_converts_and_verifies(tmp_path: Path, capsys: pytest.CaptureFixture[str], kind: str) -> None:
    src, out = tmp_path / "src", tmp_path / "out"
    code, stdout, _ = run(["make-tiny", str(src), f"--hf-{kind}"], capsys)
    assert code == 0 and f"nxdi-gptoss-fp8 convert {src}" in stdout
    assert not (src / "original").exists()
    code, converted, _ = run(["convert", str(src), str(out), "--json"], capsys)
    assert code == 0 and json.loads(converted)["source_format"] == f"hf-{kind}"
    assert run(["verify-conversion", str(out), "--source", str(src)], capsys)[0] == 0
    assert run(["validate", str(out), "--allow-custom-model"], capsys)[0] == 0
    code, _, err = run(["make-tiny", str(src), f"--hf-{kind}"], capsys)
    assert code == 2 and "--overwrite" in err
    code, _, err = run(["make-tiny", str(tmp_path / "p"), f"--hf-{kind}", "--padded-hidden-size", "96"], capsys)
    assert code == 2 and "convert" in err


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


def test_make_tiny_names_and_removes_a_dead_runs_partial_output(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from nxdi_gptoss_fp8.output_target.work_dirs import host_tag

    partial = tmp_path / f".t.partial-{host_tag()}-999999999-00ff"
    partial.mkdir()
    shard = partial / "model-00001-of-00002.safetensors"
    shard.write_bytes(os.urandom(50_000))
    on_disk = format_bytes(shard.stat().st_blocks * 512)
    code, _, err = run(["make-tiny", str(tmp_path / "t")], capsys)
    assert code == 0 and not partial.exists()
    assert err == f"nxdi-gptoss-fp8: removed {partial} ({on_disk} on disk) left by an interrupted run\n"


def test_an_optional_module_missing_deep_inside_a_command_is_one_line(
        tiny_template: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    def needs(name: str) -> Any:
        def handler(args: Any) -> int:
            raise ModuleNotFoundError(f"No module named {name!r}", name=name)
        return handler

    monkeypatch.setattr(cli_inspect, "_cmd_inspect", needs("safetensors"))
    code, out, err = run(["inspect", str(tiny_template)], capsys)
    assert code == 2 and out == "" and err.startswith("nxdi-gptoss-fp8 inspect: needs safetensors, which is not installed")
    monkeypatch.setattr(cli_inspect, "_cmd_inspect", needs("no_such_helper"))  # our own bug: not hidden
    with pytest.raises(ModuleNotFoundError):
        main(["inspect", str(tiny_template)])
