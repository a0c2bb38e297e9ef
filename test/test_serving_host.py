"""The serving-host check: the vLLM command read as vLLM reads it (``vllm_command``), the
recipe passes clean, each fault is the load's own finding, and hostile input is one line with a
documented exit code (the verdict against vllm-neuron's real start: ``test_client_vllm``)."""

from __future__ import annotations

import hashlib
import json
import os
import shlex
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import clients
import pytest
from hypothesis import given
from hypothesis import strategies as st

from nxdi_gptoss_fp8 import cli
from nxdi_gptoss_fp8 import format as fmt
from nxdi_gptoss_fp8.nxdi import recipes, serving_host
from nxdi_gptoss_fp8.nxdi.serving_host import lint_serving_host
from nxdi_gptoss_fp8.nxdi.vllm_command import (
    MAX_ARGUMENT_BYTES,
    CommandError,
    read_vllm_command,
)
from nxdi_gptoss_fp8.validate.vllm_config import neuron_config_from_override

VOCABULARY = b"c3RhbmQtaW4= 0\n"  # a stand-in for o200k_base.tiktoken (the real one is 3.6 MB)
OVERRIDE = recipes.VLLM_OVERRIDE_KEY

# --------------------------------------------------------------------------- the command, as vLLM reads it

READINGS: dict[str, tuple[list[str], str | None, dict[str, Any]]] = {
    "model after a boolean flag": (["vllm", "serve", "--no-enable-prefix-caching", "M", "-tp", "64"], "M",
                                   {"--enable-prefix-caching": False, "--tensor-parallel-size": "64"}),
    "positive boolean before the model": (["vllm", "serve", "--enable-prefix-caching", "M"], "M",
                                          {"--enable-prefix-caching": True}),
    "trust remote code": (["vllm", "serve", "--trust-remote-code", "M", "--max-model-len", "8k"], "M",
                          {"--trust-remote-code": True, "--max-model-len": "8k"}),
    "underscores": (["vllm", "serve", "M", "--additional_config", "{}", "--max_num_seqs=4"], "M",
                    {"--additional-config": "{}", "--max-num-seqs": "4"}),
    "any path to vllm": (["/opt/venv/bin/vllm", "serve", "M"], "M", {}),
    "environment prefix": (["CHECKPOINT_FORMAT=normalized_fp8", "vllm", "serve", "M"], "M", {}),
    "api server module": (["python3", "-m", "vllm.entrypoints.openai.api_server", "--model", "M"], "M", {"--model": "M"}),
    "cli module": (["python3.11", "-u", "-m", "vllm.entrypoints.cli.main", "serve", "M"], "M", {}),
    "the positional wins over --model": (["vllm", "serve", "--model", "A", "B"], "B", {"--model": "A"}),
    "--model alone": (["vllm", "serve", "--model=A", "--port", "80"], "A", {"--port": "80"}),
    "last of a repeated option": (["vllm", "serve", "M", "-tp", "8", "--tensor-parallel-size", "64"], "M",
                                  {"--tensor-parallel-size": "64"}),
    "served names take every word": (["vllm", "serve", "M", "--served-model-name", "a", "b"], "M",
                                     {"--served-model-name": ["a", "b"]}),
    "dotted JSON keys": (["vllm", "serve", "M", "--additional-config.override_neuron_config.quantized", "true"], "M",
                         {"--additional-config": json.dumps({OVERRIDE: {"quantized": True}})}),
    "a negative number is a value": (["vllm", "serve", "M", "--seed", "-1"], "M", {"--seed": "-1"}),
}


@pytest.mark.parametrize("case", list(READINGS))
def test_the_command_is_read_as_vllm_reads_it(case: str) -> None:
    words, model, options = READINGS[case]
    command = read_vllm_command(words)
    assert command.model == model and command.problems == []
    assert {name: command.options[name] for name in options} == options


def test_an_unknown_option_takes_the_next_word_and_the_missing_model_says_so(tmp_path: Path) -> None:
    command = read_vllm_command(["vllm", "serve", "--some-new-switch", "M"])
    assert command.model is None and command.took_a_word == [("--some-new-switch", "M")]
    report = lint_serving_host(["vllm", "serve", "--some-new-switch", str(tmp_path)], {})
    (finding,) = [f for f in report.findings if f.code == "no_model"]
    assert "--some-new-switch" in finding.message and "right after `serve`" in finding.message


REFUSED = {
    "boolean with a value": (["vllm", "serve", "M", "--trust-remote-code=yes"], "boolean_with_value"),
    "value missing": (["vllm", "serve", "M", "--tensor-parallel-size"], "missing_value"),
    "value missing before an option": (["vllm", "serve", "M", "--max-model-len", "--port", "1"], "missing_value"),
    "two positionals": (["vllm", "serve", "M", "N"], "unexpected_argument"),
    "a positional to the api server": (["python", "-m", "vllm.entrypoints.openai.api_server", "M"], "unexpected_argument"),
    "not JSON": (["vllm", "serve", "M", "--additional-config", "{oops"], "bad_additional_config"),
    "JSON not an object": (["vllm", "serve", "M", "--additional-config", "[1]"], "bad_additional_config"),
    "too deep": (["vllm", "serve", "M", "--additional-config", "[" * 60_000], "bad_additional_config"),
    "too many digits": (["vllm", "serve", "M", "--additional-config", '{"a": ' + "9" * 5000 + "}"], "bad_additional_config"),
    "longer than execve passes": (["vllm", "serve", "M", "--additional-config", " " * (MAX_ARGUMENT_BYTES + 1)],
                                  "argument_too_long"),
}


@pytest.mark.parametrize("case", list(REFUSED))
def test_what_vllm_refuses_is_a_problem(case: str) -> None:
    words, code = REFUSED[case]
    assert code in [p.code for p in read_vllm_command(words).problems]


@pytest.mark.parametrize("words", [["ls", "-l"], ["vllm", "chat", "M"], ["python", "-m", "http.server"], [],
                                   ["vllm", "serve", "M", "--config", "serve.yaml"]])
def test_what_is_not_a_vllm_server_start_is_a_command_error(words: list[str]) -> None:
    with pytest.raises(CommandError):
        read_vllm_command(words)


@given(st.lists(st.one_of(st.text(max_size=12), st.sampled_from(["--model", "-tp", "--no-x", "--a.b", "--", "-O3",
                                                                  "--additional-config", "--served-model-name"])),
                max_size=10))
def test_any_words_after_vllm_serve_are_read_without_raising(words: list[str]) -> None:
    command = read_vllm_command(["vllm", "serve", *words])
    assert command.model is None or command.model in words or any(w.endswith(command.model) for w in words)
    assert all(name.startswith("-") for name in command.options)


def test_the_additional_config_form_builds_vllm_neurons_neuron_config() -> None:
    nc = neuron_config_from_override({OVERRIDE: {"quantized": True, "tp_degree": 8}})
    assert nc["tp_degree"] == 8 and nc["quantization_dtype"] == "int8" and nc["quantization_type"] == "per_tensor_symmetric"
    assert nc["is_prefix_caching"] is True and nc["quantized_checkpoints_path"] is None


# --------------------------------------------------------------------------- the host


@pytest.fixture
def host(tiny_template: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> dict[str, Any]:
    """A host set up as the recipe says: its command (a list) and environment, on a tiny checkpoint."""
    import shutil

    model = Path(shutil.copytree(tiny_template, tmp_path / "models" / "tiny"))
    tiktoken = tmp_path / "tiktoken"
    tiktoken.mkdir()
    (tiktoken / serving_host.HARMONY_VOCABULARY).write_bytes(VOCABULARY)
    monkeypatch.setattr(serving_host, "O200K_BASE_SHA256", hashlib.sha256(VOCABULARY).hexdigest())
    commands = clients.shell_commands(recipes.vllm_command(str(model), str(tmp_path / "compiled"), str(tiktoken), 64, 64))
    environ = dict(words[1].split("=", 1) for words in commands[:-1])
    environ[fmt.ALLOW_CUSTOM_ENV] = "1"
    return {"command": commands[-1], "environ": environ, "model": model, "tmp": tmp_path}


def test_the_recipe_is_clean(host: dict[str, Any]) -> None:
    report = lint_serving_host(host["command"], host["environ"])
    assert report.ok and report.findings == [] and report.model == str(host["model"])


def _override(change: Callable[[dict[str, Any]], Any]) -> Callable[[dict[str, Any]], None]:
    def apply(host: dict[str, Any]) -> None:
        command = host["command"]
        flag = command.index(recipes.VLLM_ADDITIONAL_CONFIG_FLAG)
        document = json.loads(command[flag + 1])
        change(document.get(OVERRIDE, document))
        command[flag + 1] = json.dumps(document)
    return apply


def _drop_additional_config(host: dict[str, Any]) -> None:
    flag = host["command"].index(recipes.VLLM_ADDITIONAL_CONFIG_FLAG)
    del host["command"][flag: flag + 2]


def _vocabulary(content: bytes | None) -> Callable[[dict[str, Any]], None]:
    def change(host: dict[str, Any]) -> None:
        path = Path(host["environ"]["TIKTOKEN_ENCODINGS_BASE"]) / serving_host.HARMONY_VOCABULARY
        path.unlink()
        if content is not None:
            path.write_bytes(content)
    return change


def _rename_key(host: dict[str, Any]) -> None:
    command = host["command"]
    flag = command.index(recipes.VLLM_ADDITIONAL_CONFIG_FLAG)
    command[flag + 1] = command[flag + 1].replace(OVERRIDE, "override-neuron-config")


def _both(*changes: Callable[[dict[str, Any]], Any]) -> Callable[[dict[str, Any]], None]:
    def apply(host: dict[str, Any]) -> None:
        for change in changes:
            change(host)
    return apply


def _drop_word(word: str) -> Callable[[dict[str, Any]], None]:
    return lambda host: host["command"].remove(word)


def _compiled_link(host: dict[str, Any]) -> None:
    link = host["tmp"] / "compiled-link"
    link.symlink_to(host["model"])
    host["environ"]["NEURON_COMPILED_ARTIFACTS"] = str(link)


def _too_few_blocks(host: dict[str, Any]) -> None:
    """The issue's command: 100 tokens in blocks of 32 need 4 blocks, vllm-neuron 0.2.0 computes 3."""
    host["command"].remove("--no-enable-prefix-caching")
    host["command"].extend(["--max-model-len", "100", "--block-size", "32", "--enable-prefix-caching", "--max-num-seqs",
                            "1", "--tensor-parallel-size", "2"])


# fault → (change, a code it must produce, whether the start still loads)
FAULTS: dict[str, tuple[Callable[[dict[str, Any]], None], str, bool]] = {
    "override key with hyphens": (_rename_key, "override_key_spelling", False),
    "old --override-neuron-config flag": (lambda h: h["command"].extend(["--override-neuron-config", "{}"]), "override_flag", False),
    "no --additional-config": (_drop_additional_config, "no_override", False),
    "not JSON": (lambda h: h["command"].__setitem__(h["command"].index(recipes.VLLM_ADDITIONAL_CONFIG_FLAG) + 1, "{oops"),
                 "bad_additional_config", False),
    "quantized alone": (_override(lambda d: [d.pop(k) for k in ("quantization_type", "quantization_dtype")]),
                        "neuron_config.wrong_quantization_type", False),
    "int8": (_override(lambda d: d.update(quantization_dtype="int8")), "neuron_config.wrong_quantization_dtype", False),
    "attention converted": (_override(lambda d: d.update(modules_to_not_convert=["lm_head"])),
                            "neuron_config.attention_not_excluded", False),
    "experts excluded": (_override(lambda d: d.update(modules_to_not_convert=["lm_head", "self_attn", "mlp"])),
                         "neuron_config.experts_excluded", False),
    "quantized 1": (_override(lambda d: d.update(quantized=1)), "neuron_config.not_boolean", False),
    "checkpoint path a number": (_override(lambda d: d.update(quantized_checkpoints_path=7)),
                                 "neuron_config.bad_checkpoints_path", False),
    "checkpoint path a list": (_override(lambda d: d.update(quantized_checkpoints_path=["a"])),
                               "neuron_config.bad_checkpoints_path", False),
    "padded size not the checkpoint's": (_override(lambda d: d.update(padded_hidden_size=96)),
                                         "neuron_config.padding_mismatch", False),
    "padded size NaN": (_override(lambda d: d.update(padded_hidden_size=float("nan"))), "neuron_config.out_of_range", False),
    "padded size a string": (_override(lambda d: d.update(padded_hidden_size="64")), "neuron_config.out_of_range", False),
    "padded size of 4,001 digits": (_override(lambda d: d.update(padded_hidden_size=int("9" * 4001))),
                                    "neuron_config.out_of_range", False),
    "tensor parallel not a number": (lambda h: h["command"].extend(["-tp", "8k"]), "bad_value", False),
    "tensor parallel 128": (lambda h: h["command"].extend(["-tp", "128"]), "neuron_config.expert_tp_indivisible", False),
    "another quantized_checkpoints_path": (_override(lambda d: d.update(quantized_checkpoints_path="/elsewhere")),
                                           "checkpoint_path_differs", False),
    "Hub id": (lambda h: h["command"].__setitem__(2, "openai/gpt-oss-120b"), "hub_id", False),
    "missing model directory": (lambda h: h["command"].__setitem__(2, "/no/such/dir"), "model_not_found", False),
    "CHECKPOINT_FORMAT unset": (lambda h: h["environ"].pop("CHECKPOINT_FORMAT"), "checkpoint_format", False),
    "CHECKPOINT_FORMAT typo": (lambda h: h["environ"].update(CHECKPOINT_FORMAT="normalized-fp8"), "checkpoint_format", False),
    "NEURON_COMPILED_ARTIFACTS unset": (lambda h: h["environ"].pop("NEURON_COMPILED_ARTIFACTS"), "compiled_artifacts_unset", True),
    "NEURON_COMPILED_ARTIFACTS a file": (lambda h: Path(h["environ"]["NEURON_COMPILED_ARTIFACTS"]).write_text(""),
                                         "compiled_artifacts_not_a_directory", False),
    "NEURON_COMPILED_ARTIFACTS inside": (lambda h: h["environ"].update(NEURON_COMPILED_ARTIFACTS=str(h["model"] / "compiled")),
                                         "compiled_artifacts_inside", True),
    "TIKTOKEN_ENCODINGS_BASE unset": (lambda h: h["environ"].pop("TIKTOKEN_ENCODINGS_BASE"), "harmony_vocabulary_download", True),
    "vocabulary absent": (_vocabulary(None), "harmony_vocabulary_missing", False),
    "vocabulary with another SHA-256": (_vocabulary(b"other 0\n"), "harmony_vocabulary_wrong", False),
    "custom model not allowed": (lambda h: h["environ"].pop(fmt.ALLOW_CUSTOM_ENV), "config.custom_profile_not_allowed", False),
    "unreadable opt-in": (lambda h: h["environ"].update({fmt.ALLOW_CUSTOM_ENV: "ture"}), "unreadable_setting", False),
    # every NXDI_GPTOSS_FP8_* setting by the load's own reader (the start plan's load_choices)
    "verify switch misspelled": (lambda h: h["environ"].update({fmt.VERIFY_AT_LOAD_ENV: "ture"}), "unreadable_setting", False),
    "load mode misspelled": (lambda h: h["environ"].update({fmt.LOAD_MODE_ENV: "privat"}), "unreadable_setting", False),
    "load modes disagree": (_both(lambda h: h["environ"].update({fmt.LOAD_MODE_ENV: "private"}),
                                  _override(lambda d: d.update({fmt.LOAD_MODE_ATTR: "mmap"}))), "unreadable_setting", False),
    "reference misspelled (the accuracy check's only)": (
        lambda h: h["environ"].update({fmt.REFERENCE_ENV: "dequantised"}), "unreadable_setting", True),
    # where the compile writes: beside the shards, model.pt is then refused by the load's preflight
    "NEURON_COMPILED_ARTIFACTS is MODEL": (lambda h: h["environ"].update(NEURON_COMPILED_ARTIFACTS=str(h["model"])),
                                           "compiled_artifacts_is_the_checkpoint", False),
    "NEURON_COMPILED_ARTIFACTS is MODEL/": (lambda h: h["environ"].update(NEURON_COMPILED_ARTIFACTS=f"{h['model']}/"),
                                            "compiled_artifacts_is_the_checkpoint", False),
    "NEURON_COMPILED_ARTIFACTS a symlink to MODEL": (_compiled_link, "compiled_artifacts_is_the_checkpoint", False),
    # the entry point vLLM loads, and vllm-neuron's own refusals
    "VLLM_PLUGINS without ours": (lambda h: h["environ"].update(VLLM_PLUGINS="neuron"), "entry_point_not_loaded", False),
    "VLLM_PLUGINS empty": (lambda h: h["environ"].update(VLLM_PLUGINS=""), "entry_point_not_loaded", False),
    "too few KV blocks with prefix caching": (_too_few_blocks, "client_refused", False),
    "pa_num_blocks without --num-gpu-blocks-override": (
        _both(_drop_word("--no-enable-prefix-caching"), _override(lambda d: d.update(pa_num_blocks=8))),
        "client_refused", False),
    "prefix caching on, is_prefix_caching off": (
        _both(_drop_word("--no-enable-prefix-caching"), _override(lambda d: d.update(is_prefix_caching=False))),
        "client_refused", False),
    "the card's placeholder path": (_override(lambda d: d.update(quantized_checkpoints_path="/path/to/this/directory")),
                                    "checkpoint_path_placeholder", False),
}


@pytest.mark.parametrize("fault", list(FAULTS))
def test_each_fault_is_found_with_its_fix(host: dict[str, Any], fault: str) -> None:
    change, code, loads = FAULTS[fault]
    change(host)
    report = lint_serving_host(host["command"], host["environ"])
    assert code in [f.code for f in report.findings], report.render_text()
    assert report.ok is loads
    assert all("\n" not in f.render() for f in report.findings)


def test_vllm_plugins_naming_the_entry_point_passes(host: dict[str, Any]) -> None:
    host["environ"]["VLLM_PLUGINS"] = "neuron,nxdi_gptoss_fp8"
    assert lint_serving_host(host["command"], host["environ"]).findings == []


def test_a_rule_only_one_release_has_is_named_with_its_release(host: dict[str, Any]) -> None:
    """On a host without vllm-neuron, the model of both releases: 0.1.0 has no block-count rule."""
    _too_few_blocks(host)
    (finding,) = [f for f in lint_serving_host(host["command"], host["environ"]).findings if f.code == "client_refused"]
    assert "vllm-neuron 0.2.0 refuses" in finding.message and "0.1.0 does not" in finding.message
    assert "At least 4 blocks are required" in finding.message


@pytest.mark.parametrize("text", ["{'override_neuron_config': {'quantized': True}}", "{override_neuron_config: {}}"])
def test_an_additional_config_that_is_not_json_is_the_only_finding_and_says_json(host: dict[str, Any], text: str) -> None:
    """vLLM refuses the argument while parsing: nothing after it runs, so nothing after it is reported."""
    flag = host["command"].index(recipes.VLLM_ADDITIONAL_CONFIG_FLAG)
    host["command"][flag + 1] = text
    (finding,) = lint_serving_host(host["command"], host["environ"]).findings
    assert finding.code == "bad_additional_config" and "double quotes inside" in finding.message
    assert "wrapped in single quotes for the shell" in finding.message
    assert ("a Python dict" in finding.message) is text.startswith("{'")


def test_doctor_evaluates_every_check_of_the_start_plan() -> None:
    from nxdi_gptoss_fp8.nxdi import start_plan

    assert list(serving_host.EVALUATE) == list(start_plan.plan_names())


@pytest.mark.parametrize("kind", ["hf-mxfp4", "hf-bf16", "compiled"])
def test_a_model_that_is_not_normalized_is_named_as_inspect_names_it(host: dict[str, Any], tmp_path: Path, kind: str) -> None:
    from nxdi_gptoss_fp8.recognize import recognize
    from nxdi_gptoss_fp8.synthetic.sources import SOURCE_BF16, SOURCE_MXFP4, make_source
    from nxdi_gptoss_fp8.synthetic.tiny import TINY_DIMS

    if kind == "compiled":
        other = tmp_path / "compiled-model"
        other.mkdir()
        (other / "neuron_config.json").write_text(json.dumps({"neuron_config": {"tp_degree": 2}}))
        (other / "model.pt").write_bytes(b"")
    else:
        other = Path(make_source(tmp_path / kind, SOURCE_MXFP4 if kind == "hf-mxfp4" else SOURCE_BF16, dims=TINY_DIMS))
    host["command"][2] = str(other)  # served, and named as the quantized checkpoint: the user's one directory
    _override(lambda d: d.update(quantized_checkpoints_path=str(other)))(host)
    report = lint_serving_host(host["command"], host["environ"])
    hint = recognize(str(other)).hint()
    assert not report.ok and any(f.code == "not_normalized" and hint in f.message for f in report.findings)


@pytest.mark.parametrize("fault", [fault for fault, (_, code, _) in FAULTS.items() if code.startswith("harmony_vocabulary")])
def test_every_vocabulary_finding_says_where_the_file_comes_from_and_its_digest(host: dict[str, Any], fault: str) -> None:
    """Unset, absent or another file: the fix names the public URL Harmony (tiktoken) downloads
    ``o200k_base.tiktoken`` from, beside the SHA-256 Harmony expects, so an air-gapped host knows
    what to fetch elsewhere and how to check it."""
    FAULTS[fault][0](host)
    (finding,) = lint_serving_host(host["command"], host["environ"]).findings
    assert recipes.HARMONY_VOCABULARY_URL in finding.message and serving_host.O200K_BASE_SHA256 in finding.message


def test_the_command_pasted_as_one_string_is_split(host: dict[str, Any]) -> None:
    assert lint_serving_host([shlex.join(host["command"])], host["environ"]).findings == []


def test_variables_set_before_the_command_are_vllms_environment(host: dict[str, Any]) -> None:
    prefix = [f"{name}={value}" for name, value in host["environ"].items() if name != fmt.ALLOW_CUSTOM_ENV]
    environ = {fmt.ALLOW_CUSTOM_ENV: "1"}
    assert lint_serving_host([*prefix, *host["command"]], environ).findings == []
    assert not lint_serving_host(host["command"], environ).ok


def test_the_api_server_module_form_is_understood(host: dict[str, Any]) -> None:
    command = ["python3", "-m", "vllm.entrypoints.openai.api_server", "--model", *host["command"][2:]]
    assert lint_serving_host(command, host["environ"]).findings == []


def test_without_a_command_only_the_environment_is_checked(host: dict[str, Any]) -> None:
    assert lint_serving_host([], host["environ"]).findings == []
    assert [f.code for f in lint_serving_host([], {}).findings] == [
        "checkpoint_format", "compiled_artifacts_unset", "harmony_vocabulary_download"]


def test_precompiled_artifacts_are_checked_with_their_own_config(host: dict[str, Any]) -> None:
    compiled = Path(host["environ"]["NEURON_COMPILED_ARTIFACTS"])
    compiled.mkdir()
    (compiled / "model.pt").write_bytes(b"")
    (compiled / "neuron_config.json").write_text(json.dumps({"neuron_config": {"quantized": False}}))
    codes = [f.code for f in lint_serving_host(host["command"], host["environ"]).findings]
    assert "precompiled_override_ignored" in codes and "neuron_config.not_quantized" in codes


def test_the_doctor_command(host: dict[str, Any], monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture) -> None:
    for name, value in host["environ"].items():
        monkeypatch.setenv(name, value)
    assert cli.main(["doctor", "--", *host["command"]]) == 0
    first, verdict = capsys.readouterr().out.splitlines()
    assert verdict.startswith("OK: 0 errors") and "model of vllm-neuron 0.1.0 and 0.2.0" in first  # CPU host: modelled
    monkeypatch.setenv("CHECKPOINT_FORMAT", "hf")
    assert cli.main(["doctor", "--json", "--", *host["command"]]) == 1
    document = json.loads(capsys.readouterr().out)
    assert document["ok"] is False and [f["code"] for f in document["findings"]] == ["checkpoint_format"]
    assert "model of vllm-neuron" in document["neuron_config_built_by"]
    assert set(document["release_differences"]) == {"model lookup", "blocks", "quantization", "lora"}


# --------------------------------------------------------------------------- hostile input


def _hostile(host: dict[str, Any], case: str) -> list[str]:
    command = list(host["command"])
    flag = command.index(recipes.VLLM_ADDITIONAL_CONFIG_FLAG) + 1
    if case == "lone surrogate in the model":
        command[2] = "/data/\ud800"
    elif case == "lone surrogate in the override":
        command[flag] = command[flag].replace('"quantized_checkpoints_path"', '"\\ud800": 1, "quantized_checkpoints_path"')
    elif case == "lone surrogate as a checkpoint path":
        command[flag] = json.dumps({OVERRIDE: {**json.loads(command[flag])[OVERRIDE], "quantized_checkpoints_path": "\udcff\ud800"}})
    elif case == "60,000-deep JSON":
        command[flag] = "[" * 60_000 + "]" * 60_000
    elif case == "huge JSON":
        command[flag] = json.dumps({OVERRIDE: {f"key{i}": i for i in range(100_000)}})
    elif case == "many unknown keys":
        command[flag] = json.dumps({OVERRIDE: {**json.loads(command[flag])[OVERRIDE], **{f"k{i}": 0 for i in range(5_000)}}})
    elif case == "non-UTF-8 model bytes":
        command[2] = os.fsdecode(b"/data/\xff\xfe")
    elif case == "non-UTF-8 option":
        command.append(os.fsdecode(b"--\xff"))
    elif case == "not a vLLM command":
        command = ["bash", "-c", "\ud800"]
    elif case == "unbalanced quotes":
        command = ["vllm serve 'M"]
    return command


HOSTILE = {"lone surrogate in the model": 1, "lone surrogate in the override": 0, "lone surrogate as a checkpoint path": 1,
           "60,000-deep JSON": 1, "huge JSON": 1, "many unknown keys": 0, "non-UTF-8 model bytes": 1,
           "non-UTF-8 option": 0, "not a vLLM command": 2, "unbalanced quotes": 2}


@pytest.mark.parametrize("as_json", [False, True])
@pytest.mark.parametrize("case", list(HOSTILE))
def test_hostile_input_is_one_line_each_with_a_documented_exit_code(
    host: dict[str, Any], monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture, case: str, as_json: bool,
) -> None:
    for name, value in host["environ"].items():
        monkeypatch.setenv(name, value)
    code = cli.main(["doctor", *(["--json"] if as_json else []), "--", *_hostile(host, case)])
    out, err = capsys.readouterr()
    assert code == HOSTILE[case] and "Traceback" not in out + err
    if code == 2:
        assert len(err.splitlines()) == 1 and err.startswith("nxdi-gptoss-fp8 doctor: ")
    if as_json:
        document = json.loads(out)
        assert document["ok"] is (code == 0) and (code != 2 or document["error"]["kind"] == "usage")
    elif code != 2:
        lines = out.splitlines()
        assert lines[-1].startswith(("OK: ", "FAILED: ")) and len(lines) <= serving_host.MAX_SHOWN_FINDINGS + 10


def test_non_utf8_bytes_in_argv_reach_doctor_without_a_traceback(host: dict[str, Any], tmp_path: Path) -> None:
    argv = [sys.executable, "-m", "nxdi_gptoss_fp8", "doctor", "--", "vllm", "serve", b"/data/\xff\xfe", "--x\xff"]
    done = subprocess.run(argv, capture_output=True, env={**os.environ, **host["environ"]}, timeout=120)
    assert done.returncode == 1 and b"Traceback" not in done.stdout + done.stderr
    assert b"model_not_found" in done.stdout


@pytest.mark.parametrize("change", [{"padded_hidden_size": 96}, {"quantization_dtype": "int8"}, {"quantized": 1},
                                    {"modules_to_not_convert": ["lm_head", "self_attn", "mlp"]}, {}])
def test_doctor_and_validate_give_one_verdict(host: dict[str, Any], tmp_path: Path, capsys: pytest.CaptureFixture,
                                              change: dict[str, Any]) -> None:
    """The override given to doctor in the command and to validate as the --additional-config
    file: the same checkpoint findings (one function, ``checkpoint_verdict``, decides both)."""
    _override(lambda d: d.update(change))(host)
    flag = host["command"].index(recipes.VLLM_ADDITIONAL_CONFIG_FLAG) + 1
    (tmp_path / "additional.json").write_text(host["command"][flag])
    report = lint_serving_host(host["command"], host["environ"])
    code = cli.main(["validate", str(host["model"]), "--neuron-config", str(tmp_path / "additional.json"),
                     "--allow-custom-model", "--json"])
    validated = json.loads(capsys.readouterr().out)
    assert (code == 0) is report.ok
    assert sorted(f["code"] for f in validated["findings"] if f["severity"] != "info") == sorted(
        f.code for f in report.findings if "." in f.code)


# --------------------------------------------------------------------------- a precompiled directory, as the load checks it


def _rank_removed(compiled: Path) -> None:
    (compiled / "weights" / "tp1_sharded_checkpoint.safetensors").unlink()


def _manifest_removed(compiled: Path) -> None:
    from nxdi_gptoss_fp8.validate.presharded_manifest import MANIFEST_FILE

    (compiled / "weights" / MANIFEST_FILE).unlink()


def _tp_degree_4(compiled: Path) -> None:
    path = compiled / "neuron_config.json"
    document = json.loads(path.read_text())
    document["neuron_config"]["tp_degree"] = 4
    path.write_text(json.dumps(document))


PRECOMPILED = {"intact": lambda compiled: None, "a rank file removed": _rank_removed,
               "the manifest removed": _manifest_removed, "tp_degree 4 in its neuron_config.json": _tp_degree_4}


@pytest.mark.parametrize("tampering", list(PRECOMPILED))
def test_a_precompiled_directory_gets_the_loads_presharded_checks(tiny_template: Path, tmp_path: Path,
                                                                  monkeypatch: pytest.MonkeyPatch, tampering: str) -> None:
    """The start plan's ``presharded`` check on ``NEURON_COMPILED_ARTIFACTS`` (what ``validate COMPILED``
    runs): doctor errs exactly when the hooked ``load_weights`` of the stand-in NxDI refuses."""
    import shutil

    import presharded_cases as cases

    from nxdi_gptoss_fp8.nxdi import hook as nxdi_hook

    with cases.standin(monkeypatch) as nxdi:
        monkeypatch.setenv(nxdi_hook.ENV_VAR, nxdi_hook.NORMALIZED_FP8)
        nxdi_hook.register()
        try:
            ckpt = Path(shutil.copytree(tiny_template, tmp_path / "ckpt"))
            compiled = tmp_path / "compiled"
            cases.compile_shards(nxdi.modeling_gpt_oss, ckpt, compiled)
            (compiled / "model.pt").write_bytes(b"")  # what NxDI's compile writes beside its config
            PRECOMPILED[tampering](compiled)
            command = ["vllm", "serve", str(ckpt), "-tp", str(cases.TP), "--no-enable-prefix-caching",
                       recipes.VLLM_ADDITIONAL_CONFIG_FLAG, json.dumps(recipes.vllm_override(str(ckpt), 64, 64))]
            environ = {"CHECKPOINT_FORMAT": "normalized_fp8", "NEURON_COMPILED_ARTIFACTS": str(compiled),
                       fmt.ALLOW_CUSTOM_ENV: "1"}
            report = lint_serving_host(command, environ)
            try:
                cases.load(cases.load_app(nxdi.modeling_gpt_oss, compiled, ckpt), compiled)
                loaded = True
            except Exception:  # any refusal of the load
                loaded = False
        finally:
            nxdi_hook.unregister()
    errors = [f.code for f in report.findings if f.severity == "error"]
    assert report.ok is loaded is (tampering == "intact"), report.render_text()
    assert loaded or any(code.startswith("presharded.") for code in errors), errors
