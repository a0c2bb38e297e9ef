"""The serving-host lint: the recipe passes clean; each fault, one finding with its fix."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import clients
import pytest
from hypothesis import given
from hypothesis import strategies as st

from nxdi_gptoss_fp8 import cli
from nxdi_gptoss_fp8.nxdi import recipes, serving_host
from nxdi_gptoss_fp8.nxdi.serving_host import lint_serving_host, parse_command

VOCABULARY = b"c3RhbmQtaW4= 0\n"  # a stand-in for o200k_base.tiktoken (the real one is 3.6 MB)


@pytest.fixture
def host(tiny_template: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> dict[str, Any]:
    """A host set up as the recipe says: its command (a list) and environment."""
    model = tmp_path / "models" / "tiny"
    model.mkdir(parents=True)
    (model / "config.json").write_text((tiny_template / "config.json").read_text())
    tiktoken = tmp_path / "tiktoken"
    tiktoken.mkdir()
    (tiktoken / serving_host.HARMONY_VOCABULARY).write_bytes(VOCABULARY)
    monkeypatch.setattr(serving_host, "O200K_BASE_SHA256", hashlib.sha256(VOCABULARY).hexdigest())
    commands = clients.shell_commands(recipes.vllm_command(str(model), str(tmp_path / "compiled"), str(tiktoken), 64, 64))
    environ = dict(words[1].split("=", 1) for words in commands[:-1])
    return {"command": commands[-1], "environ": environ, "model": model, "tmp": tmp_path}


def codes(host: dict[str, Any]) -> list[str]:
    return [f.code for f in lint_serving_host(host["command"], host["environ"]).findings]


def test_the_recipe_is_clean(host: dict[str, Any]) -> None:
    report = lint_serving_host(host["command"], host["environ"])
    assert report.ok and report.findings == [] and report.model == str(host["model"])


def _override(host: dict[str, Any], change: Callable[[dict[str, Any]], Any]) -> None:
    command = host["command"]
    flag = command.index(recipes.VLLM_ADDITIONAL_CONFIG_FLAG)
    document = json.loads(command[flag + 1])
    change(document)
    command[flag + 1] = json.dumps(document)


def _rename_key(document: dict[str, Any]) -> None:
    document["override-neuron-config"] = document.pop("override_neuron_config")


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


FAULTS: dict[str, tuple[Callable[[dict[str, Any]], None], str, str]] = {
    "override key with hyphens": (lambda h: _override(h, _rename_key), "override_key_spelling", "error"),
    "old --override-neuron-config flag": (lambda h: h["command"].extend(["--override-neuron-config", "{}"]), "override_flag", "error"),
    "no --additional-config": (_drop_additional_config, "no_override", "error"),
    "not JSON": (lambda h: h["command"].__setitem__(h["command"].index(recipes.VLLM_ADDITIONAL_CONFIG_FLAG) + 1, "{oops"),
                 "bad_additional_config", "error"),
    "quantization_type missing": (lambda h: _override(h, lambda d: d["override_neuron_config"].pop("quantization_type")),
                                  "missing_key", "error"),
    "quantization_dtype missing": (lambda h: _override(h, lambda d: d["override_neuron_config"].pop("quantization_dtype")),
                                   "missing_key", "error"),
    "int8": (lambda h: _override(h, lambda d: d["override_neuron_config"].update(quantization_dtype="int8")), "wrong_value", "error"),
    "attention converted": (lambda h: _override(h, lambda d: d["override_neuron_config"].update(modules_to_not_convert=["lm_head"])),
                            "wrong_value", "error"),
    "padded size missing": (lambda h: _override(h, lambda d: d["override_neuron_config"].pop("padded_hidden_size")),
                            "missing_key", "warning"),
    "another quantized_checkpoints_path": (
        lambda h: _override(h, lambda d: d["override_neuron_config"].update(quantized_checkpoints_path="/elsewhere")),
        "checkpoint_path_differs", "error"),
    "Hub id": (lambda h: h["command"].__setitem__(2, "openai/gpt-oss-120b"), "hub_id", "error"),
    "missing model directory": (lambda h: h["command"].__setitem__(2, "/no/such/dir"), "model_not_found", "error"),
    "CHECKPOINT_FORMAT unset": (lambda h: h["environ"].pop("CHECKPOINT_FORMAT"), "checkpoint_format", "error"),
    "CHECKPOINT_FORMAT typo": (lambda h: h["environ"].update(CHECKPOINT_FORMAT="normalized-fp8"), "checkpoint_format", "error"),
    "NEURON_COMPILED_ARTIFACTS unset": (lambda h: h["environ"].pop("NEURON_COMPILED_ARTIFACTS"), "compiled_artifacts_unset", "error"),
    "NEURON_COMPILED_ARTIFACTS inside": (lambda h: h["environ"].update(NEURON_COMPILED_ARTIFACTS=str(h["model"] / "compiled")),
                                         "compiled_artifacts_inside", "error"),
    "precompiled artifacts there": (lambda h: (Path(h["environ"]["NEURON_COMPILED_ARTIFACTS"]).mkdir(),
                                               (Path(h["environ"]["NEURON_COMPILED_ARTIFACTS"]) / "neuron_config.json").write_text("{}")),
                                    "precompiled_override_ignored", "warning"),
    "TIKTOKEN_ENCODINGS_BASE unset": (lambda h: h["environ"].pop("TIKTOKEN_ENCODINGS_BASE"), "harmony_vocabulary_download", "warning"),
    "vocabulary absent": (_vocabulary(None), "harmony_vocabulary_missing", "error"),
    "vocabulary with another SHA-256": (_vocabulary(b"other 0\n"), "harmony_vocabulary_wrong", "error"),
}


@pytest.mark.parametrize("fault", list(FAULTS))
def test_each_fault_is_one_finding_with_its_fix(host: dict[str, Any], fault: str) -> None:
    change, code, severity = FAULTS[fault]
    change(host)
    report = lint_serving_host(host["command"], host["environ"])
    (finding,) = report.findings
    assert (finding.code, finding.severity) == (code, severity)
    assert "\n" not in finding.render() and ": " in finding.message  # what is wrong, then the fix
    assert report.ok is (severity == "warning")


@pytest.mark.parametrize("fault", [fault for fault, (_, code, _) in FAULTS.items() if code.startswith("harmony_vocabulary")])
def test_every_vocabulary_finding_says_where_the_file_comes_from_and_its_digest(host: dict[str, Any], fault: str) -> None:
    """Unset, absent or another file: the fix names the public URL Harmony (tiktoken) downloads
    ``o200k_base.tiktoken`` from, beside the SHA-256 Harmony expects, so an air-gapped host knows
    what to fetch elsewhere and how to check it."""
    FAULTS[fault][0](host)
    (finding,) = lint_serving_host(host["command"], host["environ"]).findings
    assert recipes.HARMONY_VOCABULARY_URL in finding.message and serving_host.O200K_BASE_SHA256 in finding.message


def test_the_command_pasted_as_one_string_is_split(host: dict[str, Any]) -> None:
    import shlex

    assert lint_serving_host([shlex.join(host["command"])], host["environ"]).findings == []


def test_the_api_server_module_form_is_understood(host: dict[str, Any]) -> None:
    command = ["python3", "-m", "vllm.entrypoints.openai.api_server", "--model", *host["command"][2:]]
    assert lint_serving_host(command, host["environ"]).findings == []


def test_without_a_command_only_the_environment_is_checked(host: dict[str, Any]) -> None:
    assert lint_serving_host([], host["environ"]).findings == []
    assert [f.code for f in lint_serving_host([], {}).findings] == [
        "checkpoint_format", "compiled_artifacts_unset", "harmony_vocabulary_download"]


@given(st.lists(st.text(max_size=12), max_size=8))
def test_parse_command_takes_any_words(words: list[str]) -> None:
    model, options = parse_command(words)
    assert model is None or model in words or any(model == w.partition("=")[2] for w in words)
    assert all(name.startswith("--") for name in options)


def test_the_doctor_command(host: dict[str, Any], monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture) -> None:
    for name, value in host["environ"].items():
        monkeypatch.setenv(name, value)
    assert cli.main(["doctor", "--", *host["command"]]) == 0
    assert capsys.readouterr().out.startswith("OK: 0 errors")
    monkeypatch.delenv("NEURON_COMPILED_ARTIFACTS")
    assert cli.main(["doctor", "--json", "--", *host["command"]]) == 1
    document = json.loads(capsys.readouterr().out)
    assert document["ok"] is False and [f["code"] for f in document["findings"]] == ["compiled_artifacts_unset"]
