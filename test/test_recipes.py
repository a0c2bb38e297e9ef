"""The recipes are data, and the recipe blocks of docs/serving.md are exactly that data (the client tests run the blocks)."""

from __future__ import annotations

import ast
import json
import sys
import types
from pathlib import Path

import clients
import documents
import pytest

from nxdi_gptoss_fp8 import format as fmt
from nxdi_gptoss_fp8.convert.card import loading_neuron_config
from nxdi_gptoss_fp8.nxdi import recipes
from nxdi_gptoss_fp8.validate.findings import PreflightReport

MODEL = clients.RECIPE_MODEL
PADDED = clients.RECIPE_PADDED


def test_the_serving_page_vllm_block_is_the_vllm_recipe() -> None:
    block = clients.recipe_block(clients.VLLM_RECIPE, "bash")
    expected = recipes.vllm_command(MODEL, "/data/neuron-compiled/gpt-oss-120b-fp8-tp64", "/data/tiktoken", PADDED, PADDED)
    assert block.strip() == expected


def test_the_vllm_recipe_says_where_harmonys_vocabulary_comes_from() -> None:
    from nxdi_gptoss_fp8.nxdi import serving_host

    (line,) = [line for line in recipes.vllm_command("/m", "/c", "/t", 64, 64).splitlines() if "TIKTOKEN" in line]
    assert recipes.HARMONY_VOCABULARY_URL.endswith("/" + serving_host.HARMONY_VOCABULARY)
    assert recipes.HARMONY_VOCABULARY_URL.startswith("https://") and recipes.HARMONY_VOCABULARY_URL in line
    assert serving_host.O200K_BASE_SHA256 in line
    assert clients.shell_commands(line)[0][:2] == ["export", "TIKTOKEN_ENCODINGS_BASE=/t"]  # the rest is a comment


def test_the_vllm_recipe_spells_every_fp8_key_under_vllms_key() -> None:
    words = clients.shell_commands(recipes.vllm_command("/m", "/c", "/t", 2944, 3072))[-1]
    additional = json.loads(words[words.index(recipes.VLLM_ADDITIONAL_CONFIG_FLAG) + 1])
    override = additional[recipes.VLLM_OVERRIDE_KEY]
    assert list(additional) == ["override_neuron_config"] and set(override) == set(recipes.QUANTIZATION_KEYS)
    assert override == recipes.neuron_config_keys("/m", 2944, 3072)
    assert override["quantization_type"] == fmt.QUANTIZATION_TYPE and override["quantization_dtype"] == fmt.QUANTIZATION_DTYPE


def test_the_serving_page_inference_demo_block_is_the_demo_recipe() -> None:
    commands = clients.shell_commands(clients.recipe_block(clients.DEMO_RECIPE, "bash"))
    echo, demo = commands
    assert json.loads(echo[1]) == recipes.modules_file() and echo[2:] == [">", "/data/modules_to_not_convert.json"]
    expected = recipes.inference_demo_argv(MODEL, "/data/neuron-compiled/gpt-oss-120b-fp8-tp64-demo",
                                           "/data/modules_to_not_convert.json")
    assert demo == ["CHECKPOINT_FORMAT=normalized_fp8", "nxdi-gptoss-fp8", "inference-demo", *expected]


def test_the_serving_page_python_block_builds_the_whole_config() -> None:
    tree = ast.parse(clients.recipe_block(clients.PYTHON_RECIPE, "python"))
    call = next(node for node in ast.walk(tree) if isinstance(node, ast.Call)
                and getattr(node.func, "id", None) == "GptOssNeuronConfig")
    names = {node.targets[0].id: node.value for node in ast.walk(tree)  # type: ignore[attr-defined]
             if isinstance(node, ast.Assign) and isinstance(node.targets[0], ast.Name)}
    kwargs = {kw.arg: (ast.literal_eval(names[kw.value.id]) if isinstance(kw.value, ast.Name) else ast.literal_eval(kw.value))
              for kw in call.keywords}
    assert {k: kwargs[k] for k in recipes.QUANTIZATION_KEYS} == recipes.neuron_config_keys(MODEL, PADDED, PADDED)
    assert kwargs["tp_degree"] == recipes.DEFAULT_VLLM_SETTINGS["tensor_parallel_size"]


def test_the_card_loads_with_the_recipe_keys() -> None:
    layout = fmt.Layout(fmt.PROFILES[fmt.PROFILE_120B], 2880, 2944)
    assert loading_neuron_config(layout, "/x") == {**recipes.neuron_config_keys("/x", 2880, 2944),
                                                   "checkpoint_format": "normalized_fp8"}


def _report(*codes: str) -> PreflightReport:
    report = PreflightReport("/ckpt")
    for code in codes:
        check, _, reason = code.partition(".")
        report.add(check, reason, "message")
    return report


VLLM_LOADED = {"vllm_neuron": types.ModuleType("vllm_neuron")}


@pytest.mark.parametrize(("codes", "keys"), [
    (("neuron_config.not_quantized",), ["quantized", "quantized_checkpoints_path", "quantization_type", "quantization_dtype"]),
    (("neuron_config.wrong_quantization_dtype", "neuron_config.wrong_quantization_type"), ["quantization_dtype", "quantization_type"]),
    (("neuron_config.attention_not_excluded", "neuron_config.lm_head_not_excluded"), ["modules_to_not_convert"]),
])
def test_the_vllm_hint_names_vllms_key_and_the_json_to_add(codes: tuple[str, ...], keys: list[str]) -> None:
    hint = recipes.vllm_hint(_report(*codes), "/ckpt", VLLM_LOADED)
    assert hint is not None and "\n" not in hint and '"override_neuron_config"' in hint
    added = json.loads(hint.split(" to it, e.g.")[0].split("add ", 1)[1])
    assert set(added) == set(keys) and all(added[k] == recipes.neuron_config_keys("/ckpt", 0, 0)[k] for k in keys)


@pytest.mark.parametrize(("codes", "modules"), [
    (("neuron_config.not_quantized",), {}),  # not under vLLM: NxDI's names say it
    (("values.bad_scale",), VLLM_LOADED),  # nothing vLLM's override can fix
])
def test_no_vllm_hint_where_it_does_not_help(codes: tuple[str, ...], modules: dict[str, types.ModuleType]) -> None:
    assert recipes.vllm_hint(_report(*codes), "/ckpt", modules) is None


def test_the_hint_reads_this_process_by_default(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delitem(sys.modules, "vllm_neuron", raising=False)
    assert recipes.vllm_hint(_report("neuron_config.not_quantized"), "/ckpt") is None
    monkeypatch.setitem(sys.modules, "vllm_neuron", types.ModuleType("vllm_neuron"))
    assert recipes.vllm_hint(_report("neuron_config.not_quantized"), "/ckpt") is not None


def test_the_recipe_paths_are_quoted_for_the_shell(tmp_path: Path) -> None:
    odd = str(tmp_path / "my models" / "it's")
    words = clients.shell_commands(recipes.vllm_command(odd, odd + "-c", "/t", 64, 64))
    assert words[-1][2] == odd and words[1] == ["export", f"NEURON_COMPILED_ARTIFACTS={odd}-c"]


# --------------------------------------------------------------------------- the accuracy step (docs/accuracy.md)


ACCURACY_PAGE = "docs/accuracy.md"
ACCURACY_RECIPE = "The recipe: goldens on a CPU host, the check on the device"


def test_the_accuracy_pages_goldens_block_is_the_goldens_recipe() -> None:
    first, second = clients.shell_commands(documents.code_block(ACCURACY_PAGE, ACCURACY_RECIPE, "bash", 0))
    assert first == ["nxdi-gptoss-fp8", "goldens", *recipes.goldens_argv(MODEL, "dequantized", "/data/goldens/gpt-oss-120b-fp8-dequantized.pt")]
    assert second == ["nxdi-gptoss-fp8", "goldens", *recipes.goldens_argv(MODEL, "/data/models/gpt-oss-120b",
                                                                          "/data/goldens/gpt-oss-120b-fp8-source.pt")]


def test_the_accuracy_pages_demo_block_is_the_demo_recipe_with_the_accuracy_step() -> None:
    echo, demo = clients.shell_commands(documents.code_block(ACCURACY_PAGE, ACCURACY_RECIPE, "bash", 1))
    assert json.loads(echo[1]) == recipes.modules_file()
    expected = recipes.accuracy_demo_argv(MODEL, "/data/neuron-compiled/gpt-oss-120b-fp8-tp64-demo",
                                          "/data/modules_to_not_convert.json", "/data/goldens/gpt-oss-120b-fp8-source.pt",
                                          against_source=True)
    assert demo == ["CHECKPOINT_FORMAT=normalized_fp8", "nxdi-gptoss-fp8", "inference-demo", *expected]
    assert ast.literal_eval(demo[demo.index("--tol-map") + 1]) == recipes.SOURCE_REFERENCE_TOL_MAP
    # the part before the accuracy step is the serving recipe, unchanged
    plain = recipes.inference_demo_argv(MODEL, "/data/neuron-compiled/gpt-oss-120b-fp8-tp64-demo", "/data/modules_to_not_convert.json")
    assert expected[:len(plain)] == plain


def test_the_accuracy_pages_python_block_uses_the_recipes_tolerances() -> None:
    tree = ast.parse(documents.code_block(ACCURACY_PAGE, "From Python", "python"))
    call = next(node for node in ast.walk(tree) if isinstance(node, ast.Call)
                and getattr(node.func, "id", None) == "check_accuracy_logits")
    kwargs = {kw.arg: kw.value for kw in call.keywords}
    assert ast.literal_eval(kwargs["tol_map"]) == recipes.SOURCE_REFERENCE_TOL_MAP
    assert ast.literal_eval(kwargs["divergence_difference_tol"]) == recipes.SOURCE_REFERENCE_DIVERGENCE_TOL
    assert ast.literal_eval(kwargs["num_tokens_to_check"]) == recipes.ACCURACY_TOKENS
    text = (Path(__file__).resolve().parent.parent / "docs" / "accuracy.md").read_text()
    for value in (json.dumps(recipes.SOURCE_REFERENCE_TOL_MAP).replace("[", "(").replace("]", ")"),
                  f"--divergence-difference-tol {recipes.SOURCE_REFERENCE_DIVERGENCE_TOL}", fmt.REFERENCE_ENV, fmt.REFERENCE_ATTR):
        assert value in text
