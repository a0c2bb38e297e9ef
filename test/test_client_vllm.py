"""vLLM's NxDI-backed plugin, run from its own source: vllm-neuron's model loader
(``VLLM_NEURON_SRC``, a checkout at a release tag) on NxDI's real source (``NXDI_SRC``), vLLM's
own modules and the Neuron compiler/device stood in (``vllm_standin``, ``neuron_device``).

Each start is the vLLM recipe of docs/serving.md as written (only the paths and the padded sizes replaced
by the tiny checkpoint's): our entry point as vLLM loads it, the loader's ``get_neuron_model``
with the configs vLLM builds, ``_load_weights_common`` with its ``except (FileNotFoundError,
ValueError)`` → "Recompiling", NxDI's ``compile`` / ``load`` and our hook inside them.
Run once per tag: ``VLLM_NEURON_SRC=/path/to/vllm-neuron@0.1.0`` and ``@0.2.0``.

``doctor``'s verdict is held to the start's: for every case of ``VERDICT_CASES`` (good and bad
commands, environments and checkpoints), ``doctor -- vllm serve ...`` exits 0 exactly when this
start loads, and otherwise names the error that stops it.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import shutil
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import ckpt_edit
import clients
import pytest
import torch
import vllm_standin

from nxdi_gptoss_fp8 import format as fmt
from nxdi_gptoss_fp8.errors import CLIENT_CAUGHT, IntegrityError, LoadRefusedError, PreflightError
from nxdi_gptoss_fp8.nxdi import hook as nxdi_hook
from nxdi_gptoss_fp8.nxdi import serving_host
from nxdi_gptoss_fp8.synthetic.sources import REALISTIC_SCALE_RANGE, SOURCE_MXFP4, make_source
from nxdi_gptoss_fp8.synthetic.tiny import TINY_DIMS

pytestmark = [pytest.mark.client, pytest.mark.filterwarnings("ignore")]

RECIPE_COMPILED = "/data/neuron-compiled/gpt-oss-120b-fp8-tp64"
RECIPE_TIKTOKEN = "/data/tiktoken"
RECOMPILING = "Recompiling"


@pytest.fixture(autouse=True)
def isolated(stack: SimpleNamespace, tmp_path: Path) -> Iterator[None]:
    with clients.restored_environ():
        os.environ.update({"NEURON_PLATFORM_TARGET_OVERRIDE": "trn2", fmt.ALLOW_CUSTOM_ENV: "1",
                           "BASE_COMPILE_WORK_DIR": f"{tmp_path}/compiler-workdir/"})
        for name in (nxdi_hook.ENV_VAR, serving_host.ENV_COMPILED, serving_host.ENV_TIKTOKEN):
            os.environ.pop(name, None)
        stack.device.loads.clear()
        stack.device.traces = stack.device.checkpoint_loads = 0
        try:
            yield
        finally:
            nxdi_hook.unregister()  # also removes the MODEL_TYPES["gptoss"] entry the entry point added


@pytest.fixture
def ckpt(tiny_template: Path, tmp_path: Path) -> Path:
    return Path(shutil.copytree(tiny_template, tmp_path / "models" / "gpt-oss-tiny-fp8"))


def recipe(ckpt: Path, tmp_path: Path) -> tuple[dict[str, str], list[str]]:
    """The vLLM recipe block of docs/serving.md for ``ckpt``: its environment and ``vllm serve``'s arguments."""
    config = json.loads((ckpt / fmt.CONFIG_FILE).read_text())
    assert config["hidden_size"] == config["intermediate_size"]  # the tiny profile: one padded size for both
    mapping = {clients.RECIPE_MODEL: str(ckpt), RECIPE_COMPILED: str(tmp_path / "compiled"),
               RECIPE_TIKTOKEN: str(tmp_path / "tiktoken"), f": {clients.RECIPE_PADDED}": f": {config['hidden_size']}"}
    environ: dict[str, str] = {}
    serve: list[str] = []
    for words in clients.shell_commands(clients.recipe_block(clients.VLLM_RECIPE, "bash")):
        words = clients.substitute(words, mapping)
        if words[0] == "export":
            name, _, value = words[1].partition("=")
            environ[name] = value
        else:
            assert words[:2] == ["vllm", "serve"], words
            serve = words[2:]
    assert set(environ) == {nxdi_hook.ENV_VAR, serving_host.ENV_COMPILED, serving_host.ENV_TIKTOKEN} and serve
    return environ, serve


def start(stack: SimpleNamespace, argv: list[str], environ: dict[str, str] | None = None, *, plugins: bool = True) -> Any:
    os.environ.update(environ or {})
    return vllm_standin.serve(stack.loader, argv, plugins=plugins)


def loaded_weights(stack: SimpleNamespace, index: int = -1) -> dict[str, torch.Tensor]:
    return stack.device.loads[index][0]  # rank 0's


def raw(tensor: torch.Tensor) -> bytes:
    return tensor.contiguous().reshape(-1).view(torch.uint8).numpy().tobytes()


# --------------------------------------------------------------------------- the recipe


def test_the_recipe_starts_and_loads_the_normalized_checkpoint(
    stack: SimpleNamespace, ckpt: Path, tmp_path: Path, caplog: pytest.LogCaptureFixture,
) -> None:
    environ, argv = recipe(ckpt, tmp_path)
    with caplog.at_level(logging.INFO), caplog.at_level(logging.INFO, logger="nxdi_gptoss_fp8"):
        model = start(stack, argv, environ)
    assert model.model.config.neuron_config.quantization_dtype == fmt.QUANTIZATION_DTYPE
    assert stack.device.traces == 1 and len(stack.device.loads) == 1
    weights = loaded_weights(stack)
    experts = [key for key, tensor in weights.items() if tensor.dtype == torch.float8_e4m3fn]
    assert experts and all(f"{key.rsplit('.', 1)[0]}.scale" in weights for key in experts)
    assert any("passed the preflight" in r.getMessage() for r in caplog.records)
    assert (tmp_path / "compiled" / "neuron_config.json").is_file()


def test_doctor_passes_the_vllm_recipe(ckpt: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The serving-host lint of the recipe's own command and environment: no finding at all."""
    environ, argv = recipe(ckpt, tmp_path)
    vocabulary = Path(environ[serving_host.ENV_TIKTOKEN]) / serving_host.HARMONY_VOCABULARY
    vocabulary.parent.mkdir(parents=True)
    vocabulary.write_bytes(b"stand-in vocabulary 0\n")  # the real file is 3.6 MB from the internet
    monkeypatch.setattr(serving_host, "O200K_BASE_SHA256", hashlib.sha256(vocabulary.read_bytes()).hexdigest())
    report = serving_host.lint_serving_host(["vllm", "serve", *argv], {**environ, fmt.ALLOW_CUSTOM_ENV: "1"})  # tiny: custom
    assert report.findings == [], report.render_text()


def test_a_second_start_loads_the_precompiled_artifacts(
    stack: SimpleNamespace, ckpt: Path, tmp_path: Path, caplog: pytest.LogCaptureFixture,
) -> None:
    environ, argv = recipe(ckpt, tmp_path)
    start(stack, argv, environ)
    caplog.clear()
    with caplog.at_level(logging.INFO):
        start(stack, argv, environ)
    assert stack.device.traces == 1 and len(stack.device.loads) == 2  # loaded again, not compiled again
    messages = [r.getMessage() for r in caplog.records]
    assert any("Successfully loaded pre-compiled model artifacts" in m for m in messages)
    assert not any(RECOMPILING in m for m in messages)
    first, second = loaded_weights(stack, 0), loaded_weights(stack, 1)
    assert list(first) == list(second) and all(raw(first[k]) == raw(second[k]) for k in first)


def _flip_a_scale(ckpt: Path) -> None:
    key = next(k for k in json.loads((ckpt / fmt.INDEX_FILE).read_text())["weight_map"] if k.endswith(".scale"))
    ckpt_edit.replace_tensor(ckpt, key, -ckpt_edit.load_shard(ckpt, ckpt_edit.shard_of(ckpt, key))[key])


def _drop_a_shard(ckpt: Path) -> None:
    (ckpt / ckpt_edit.shards(ckpt)[0]).unlink()


def _unreadable_setting(ckpt: Path) -> None:
    os.environ[fmt.ALLOW_CUSTOM_ENV] = "ture"  # a ConfigError, i.e. a ValueError, inside the hook


TAMPERINGS = {"negative scale": (_flip_a_scale, PreflightError, "values.bad_scale"),
              "shard removed": (_drop_a_shard, PreflightError, "ownership.missing_shard"),
              "unreadable setting": (_unreadable_setting, LoadRefusedError, fmt.ALLOW_CUSTOM_ENV)}


@pytest.mark.parametrize("tampering", list(TAMPERINGS))
def test_a_refusal_stops_a_start_from_precompiled_artifacts_never_recompiling(
    stack: SimpleNamespace, ckpt: Path, tmp_path: Path, caplog: pytest.LogCaptureFixture, tampering: str,
) -> None:
    """The artifacts exist, so vLLM loads them; our refusal must not be caught as "no artifacts"."""
    change, error, text = TAMPERINGS[tampering]
    environ, argv = recipe(ckpt, tmp_path)
    start(stack, argv, environ)
    change(ckpt)
    caplog.clear()
    with caplog.at_level(logging.INFO), pytest.raises(error) as caught:
        start(stack, argv, environ)
    assert not isinstance(caught.value, CLIENT_CAUGHT) and text in str(caught.value)
    assert not any(RECOMPILING in r.getMessage() for r in caplog.records)
    assert stack.device.traces == 1 and len(stack.device.loads) == 1


def test_missing_presharded_ranks_stop_the_start_never_recompiling(
    stack: SimpleNamespace, ckpt: Path, tmp_path: Path, caplog: pytest.LogCaptureFixture,
) -> None:
    """NxDI's own missing-rank error is a FileNotFoundError vLLM would recompile on; ours is not."""
    environ, argv = recipe(ckpt, tmp_path)
    flag = argv.index("--additional-config")
    additional = json.loads(argv[flag + 1])
    additional["override_neuron_config"]["save_sharded_checkpoint"] = True
    argv[flag + 1] = json.dumps(additional)
    start(stack, argv, environ)
    (tmp_path / "compiled" / "weights" / "tp0_sharded_checkpoint.safetensors").unlink()
    caplog.clear()
    with caplog.at_level(logging.INFO), pytest.raises(IntegrityError) as caught:
        start(stack, argv, environ)
    assert not isinstance(caught.value, CLIENT_CAUGHT) and "tp0" in str(caught.value)
    assert not any(RECOMPILING in r.getMessage() for r in caplog.records) and stack.device.traces == 1


# --------------------------------------------------------------------------- the wrong configs


def test_vllms_default_config_is_refused_with_the_key_to_add(stack: SimpleNamespace, ckpt: Path, tmp_path: Path) -> None:
    """No --additional-config: vLLM's NeuronConfig (quantized False); the first line names vLLM's key."""
    environ, argv = recipe(ckpt, tmp_path)
    flag = argv.index("--additional-config")
    del argv[flag: flag + 2]
    with pytest.raises(PreflightError) as caught:
        start(stack, argv, environ)
    first_line = str(caught.value).splitlines()[0]
    assert '"override_neuron_config"' in first_line and '"quantized": true' in first_line
    assert "neuron_config.not_quantized" in caught.value.codes


def test_quantized_alone_is_refused_naming_the_keys_vllm_filled_in(stack: SimpleNamespace, ckpt: Path,
                                                                   tmp_path: Path) -> None:
    """``quantized`` without type/dtype: vllm-neuron fills in per_tensor_symmetric / int8."""
    environ, argv = recipe(ckpt, tmp_path)
    flag = argv.index("--additional-config")
    argv[flag + 1] = json.dumps({"override_neuron_config": {"quantized": True, "quantized_checkpoints_path": str(ckpt),
                                                            "modules_to_not_convert": ["lm_head", "self_attn"]}})
    with pytest.raises(PreflightError) as caught:
        start(stack, argv, environ)
    assert {"neuron_config.wrong_quantization_dtype", "neuron_config.wrong_quantization_type"} <= set(caught.value.codes)
    first_line = str(caught.value).splitlines()[0]
    assert "override_neuron_config" in first_line and fmt.QUANTIZATION_DTYPE in first_line and "int8" in first_line


# --------------------------------------------------------------------------- reaching GPT-OSS, and HF untouched


def test_gpt_oss_is_reachable_through_the_entry_point(stack: SimpleNamespace) -> None:
    """0.2.0 lost 0.1.0's gptoss → gpt_oss special case; after our entry point both find the hooked class."""
    special_cased = '"gpt_oss"' in Path(stack.loader.__file__).read_text()
    if special_cased:
        assert stack.loader._get_neuron_model_cls("GptOssForCausalLM") is stack.nxdi.modeling.NeuronGptOssForCausalLM
    else:
        with pytest.raises(ValueError, match="not supported on Neuron"):
            stack.loader._get_neuron_model_cls("GptOssForCausalLM")
    vllm_standin._entry_point()()
    assert stack.loader._get_neuron_model_cls("GptOssForCausalLM") is stack.nxdi.modeling.NeuronGptOssForCausalLM
    assert nxdi_hook.is_registered()


def test_the_hf_start_is_unchanged_bit_for_bit(stack: SimpleNamespace, tmp_path: Path) -> None:
    """An HF MXFP4 checkpoint, CHECKPOINT_FORMAT unset: the weights vLLM hands the device are the same
    with our entry point as without it (then MODEL_TYPES["gptoss"] added by hand where the plugin needs it)."""
    source = make_source(tmp_path / "hf", SOURCE_MXFP4, dims=TINY_DIMS, scale_range=REALISTIC_SCALE_RANGE, original=False)
    argv = [str(source), "--tensor-parallel-size", "1", "--max-model-len", "128", "--max-num-seqs", "1",
            "--no-enable-prefix-caching"]
    model_types = stack.nxdi.constants.MODEL_TYPES
    if "gptoss" not in model_types and '"gpt_oss"' not in Path(stack.loader.__file__).read_text():
        model_types["gptoss"] = model_types["gpt_oss"]  # what users of 0.2.0 without this package must do
    start(stack, argv, {serving_host.ENV_COMPILED: str(tmp_path / "plain")}, plugins=False)
    assert not nxdi_hook.is_registered()
    model_types.pop("gptoss", None)
    start(stack, argv, {serving_host.ENV_COMPILED: str(tmp_path / "hooked")})
    assert nxdi_hook.is_registered()
    plain, hooked = loaded_weights(stack, 0), loaded_weights(stack, 1)
    assert list(hooked) == list(plain)
    for key in plain:
        assert hooked[key].dtype == plain[key].dtype and raw(hooked[key]) == raw(plain[key]), key


# --------------------------------------------------------------------------- doctor's verdict is the start's


def _override_text(old: str, new: str) -> Any:
    """Replace ``old`` by ``new`` in the ``--additional-config`` JSON text (``1e400``, ``NaN`` as written)."""
    def change(case: SimpleNamespace) -> None:
        flag = case.argv.index("--additional-config") + 1
        assert old in case.argv[flag], case.argv[flag]
        case.argv[flag] = case.argv[flag].replace(old, new)
    return change


def _serve(directory: Any) -> Any:
    """Serve another directory: as MODEL and as the override's quantized_checkpoints_path (the user's one path)."""
    def change(case: SimpleNamespace) -> None:
        other = str(directory(case))
        _override_text(json.dumps(str(case.ckpt)), json.dumps(other))(case)
        case.argv[0] = other
    return change


def _hf(kind: str) -> Any:
    from nxdi_gptoss_fp8.synthetic.sources import SOURCE_BF16

    return lambda case: make_source(case.tmp / kind, SOURCE_MXFP4 if kind == "mxfp4" else SOURCE_BF16, dims=TINY_DIMS,
                                    scale_range=REALISTIC_SCALE_RANGE, original=False)


def _compiled_dir(case: SimpleNamespace) -> Path:
    """A compiled NxDI model directory: the recipe's own, from a first start."""
    start(case.stack, list(case.argv), dict(case.environ))
    nxdi_hook.unregister()
    return Path(case.environ[serving_host.ENV_COMPILED])


def _drop(flag: str, count: int = 2) -> Any:
    def change(case: SimpleNamespace) -> None:
        index = case.argv.index(flag)
        del case.argv[index: index + count]
    return change


def _environ(**values: str | None) -> Any:
    def change(case: SimpleNamespace) -> None:
        for name, value in values.items():
            if value is None:
                case.environ.pop(name, None)
            else:
                case.environ[name] = value
    return change


def _compiled_is_a_file(case: SimpleNamespace) -> None:
    path = case.tmp / "compiled-file"
    path.write_text("")
    case.environ[serving_host.ENV_COMPILED] = str(path)


def _rename_flag(old: str, new: str) -> Any:
    def change(case: SimpleNamespace) -> None:
        case.argv[case.argv.index(old)] = new
    return change


def _prefix(*words: str) -> Any:
    def change(case: SimpleNamespace) -> None:
        case.program = [*words]
    return change


def _model_after_boolean(case: SimpleNamespace) -> None:
    flag = case.argv.index("--no-enable-prefix-caching")
    del case.argv[flag]
    case.argv.insert(0, "--no-enable-prefix-caching")


def _opt_in_by_config(case: SimpleNamespace) -> None:
    case.environ.pop(nxdi_hook.ENV_VAR)
    _override_text('"quantized": true', '"quantized": true, "checkpoint_format": "normalized_fp8"')(case)


def _api_server(case: SimpleNamespace) -> None:
    case.program = ["python3", "-m", "vllm.entrypoints.openai.api_server"]
    case.argv.insert(0, "--model")


# each case changes the README's recipe (argv after `vllm serve`, environment, program words), and
# the error doctor must give when the start does not load (None: the start loads)
VERDICT_CASES: dict[str, tuple[Any, str | None]] = {
    "the recipe": (lambda case: None, None),
    "/opt/venv/bin/vllm": (_prefix("/opt/venv/bin/vllm", "serve"), None),
    "MODEL after --no-enable-prefix-caching": (_model_after_boolean, None),
    "python -m vllm.entrypoints.openai.api_server --model": (_api_server, None),
    "--additional_config": (_rename_flag("--additional-config", "--additional_config"), None),
    "--tensor_parallel_size=64": (lambda case: case.argv.extend(["--tensor_parallel_size=64"]), None),
    "--trust-remote-code before MODEL": (lambda case: case.argv.insert(0, "--trust-remote-code"), None),
    "the opt-in in the config": (_opt_in_by_config, None),
    "NEURON_COMPILED_ARTIFACTS unset": (_environ(NEURON_COMPILED_ARTIFACTS=None), None),
    "prefix caching on": (_drop("--no-enable-prefix-caching", 1), None),
    "MODEL an HF MXFP4 download": (_serve(_hf("mxfp4")), "not_normalized"),
    "MODEL an HF BF16 source": (_serve(_hf("bf16")), "not_normalized"),
    "MODEL a compiled NxDI directory": (_serve(_compiled_dir), "no_model_config"),
    # vLLM reads the model config from MODEL, NxDI the weights from quantized_checkpoints_path (a warning)
    "MODEL an HF MXFP4 download, quantized_checkpoints_path the checkpoint": (
        lambda case: case.argv.__setitem__(0, str(_hf("mxfp4")(case))), None),
    "MODEL missing": (_serve(lambda case: case.tmp / "missing"), "model_not_found"),
    "padded_hidden_size not the checkpoint's": (_override_text('"padded_hidden_size": 64', '"padded_hidden_size": 96'),
                                                "neuron_config.padding_mismatch"),
    "padded_hidden_size NaN": (_override_text('"padded_hidden_size": 64', '"padded_hidden_size": NaN'),
                               "neuron_config.out_of_range"),
    "padded_hidden_size 1e400": (_override_text('"padded_hidden_size": 64', '"padded_hidden_size": 1e400'),
                                 "neuron_config.out_of_range"),
    "padded_hidden_size of 4,001 digits": (_override_text('"padded_hidden_size": 64', '"padded_hidden_size": ' + "9" * 4001),
                                           "neuron_config.out_of_range"),
    "padded_hidden_size a string": (_override_text('"padded_hidden_size": 64', '"padded_hidden_size": "64"'),
                                    "neuron_config.out_of_range"),
    "--tensor-parallel-size 128": (lambda case: case.argv.extend(["--tensor-parallel-size", "128"]),
                                   "neuron_config.expert_tp_indivisible"),
    "--tensor-parallel-size eight": (lambda case: case.argv.extend(["--tensor-parallel-size", "eight"]), "bad_value"),
    "modules_to_not_convert excludes the experts": (_override_text('"self_attn"]', '"self_attn", "mlp"]'),
                                                    "neuron_config.experts_excluded"),
    "quantized 1": (_override_text('"quantized": true', '"quantized": 1'), "neuron_config.not_boolean"),
    "quantized_checkpoints_path a number": (lambda case: _override_text(json.dumps(str(case.ckpt)), "7")(case),
                                            "neuron_config.bad_checkpoints_path"),
    "quantized_checkpoints_path a list": (lambda case: _override_text(json.dumps(str(case.ckpt)), '["x"]')(case),
                                          "neuron_config.bad_checkpoints_path"),
    "NEURON_COMPILED_ARTIFACTS a regular file": (_compiled_is_a_file, "compiled_artifacts_not_a_directory"),
    "CHECKPOINT_FORMAT unset": (_environ(CHECKPOINT_FORMAT=None), "checkpoint_format"),
    "CHECKPOINT_FORMAT misspelled": (_environ(CHECKPOINT_FORMAT="normalised-fp8"), "checkpoint_format"),
    "no --additional-config": (_drop("--additional-config"), "neuron_config.not_quantized"),
    "--additional-config not JSON": (_override_text('{"override_neuron_config"', '{override_neuron_config'),
                                     "bad_additional_config"),
    "a boolean given a value": (lambda case: case.argv.append("--trust-remote-code=yes"), "boolean_with_value"),
    "a second positional": (lambda case: case.argv.insert(1, "extra"), "unexpected_argument"),
}


@pytest.mark.parametrize("name", list(VERDICT_CASES))
def test_doctor_exits_0_exactly_when_the_start_loads(stack: SimpleNamespace, ckpt: Path, tmp_path: Path,
                                                     monkeypatch: pytest.MonkeyPatch, name: str) -> None:
    """For every case: ``doctor -- vllm serve ...`` in this environment, then the start itself
    (vllm-neuron's real loader, NxDI's real code, our hook): 0 exactly when it loads."""
    from nxdi_gptoss_fp8 import cli

    environ, argv = recipe(ckpt, tmp_path)
    vocabulary = Path(environ[serving_host.ENV_TIKTOKEN]) / serving_host.HARMONY_VOCABULARY
    vocabulary.parent.mkdir(parents=True)
    vocabulary.write_bytes(b"stand-in vocabulary 0\n")  # Harmony is not part of the start stood in here
    monkeypatch.setattr(serving_host, "O200K_BASE_SHA256", hashlib.sha256(vocabulary.read_bytes()).hexdigest())
    environ[fmt.ALLOW_CUSTOM_ENV] = "1"  # the tiny checkpoint's profile (set for every start here)
    case = SimpleNamespace(stack=stack, ckpt=ckpt, tmp=tmp_path, environ=environ, argv=argv, program=["vllm", "serve"])
    change, expected = VERDICT_CASES[name]
    change(case)
    with clients.restored_environ():
        for variable in (nxdi_hook.ENV_VAR, serving_host.ENV_COMPILED, serving_host.ENV_TIKTOKEN):
            os.environ.pop(variable, None)
        os.environ.update(case.environ)
        code = cli.main(["doctor", "--", *case.program, *case.argv])
        report = serving_host.lint_serving_host([*case.program, *case.argv], case.environ)
    why = ""
    try:
        start(stack, list(case.argv), case.environ)
        loaded = True
    except (Exception, SystemExit) as exc:  # any way the start ends without a model
        loaded, why = False, f"{type(exc).__name__}: {str(exc)[:300]}"
    errors = [f.code for f in report.findings if f.severity == "error"]
    assert code == (0 if loaded else 1), f"start {'loaded' if loaded else 'failed: ' + why}; doctor:\n{report.render_text()}"
    assert (expected is None) is loaded and (loaded or expected in errors), (why, errors)
