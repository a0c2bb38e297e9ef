"""NxDI's own clients on its real source (``NXDI_SRC``), the Neuron compiler and device stood in
(``neuron_device``), each with its recipe in docs/serving.md as written (only the paths, and for the Python
API the padded sizes, replaced by a tiny checkpoint's):

* ``inference_demo.py`` started by ``nxdi-gptoss-fp8 inference-demo``: it parses the recipe's
  flags, builds NxDI's config from them, runs its "quantize and save" step, compiles (pre-sharded
  weights written, the hook's manifest with them) and loads through the hook. Generation needs a
  device and a tokenizer: the demo is stopped when it reaches the tokenizer, after the load;
* the Python API block: NxDI's config built in full, ``compile`` and ``load``.
"""

from __future__ import annotations

import enum
import json
import os
import shutil
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace

import clients
import pytest
import torch

from nxdi_gptoss_fp8 import cli
from nxdi_gptoss_fp8 import format as fmt
from nxdi_gptoss_fp8.nxdi import hook as nxdi_hook
from nxdi_gptoss_fp8.nxdi import recipes

pytestmark = [pytest.mark.client, pytest.mark.filterwarnings("ignore")]

RECIPE_COMPILED = "/data/neuron-compiled/gpt-oss-120b-fp8-tp64-demo"
RECIPE_MODULES = "/data/modules_to_not_convert.json"


class QuantizationType(enum.Enum):
    """NxD 0.18's ``quantization_config.QuantizationType`` (its values; the demo's --quantization-type
    choices are read from it, and NxD is stubbed here)."""

    PER_TENSOR_SYMMETRIC = "per_tensor_symmetric"
    PER_CHANNEL_SYMMETRIC = "per_channel_symmetric"
    PER_KEY_SYMMETRIC = "per_key_symmetric"
    BLOCKWISE_SYMMETRIC = "blockwise_symmetric"
    EXPERT_WISE_PER_CHANNEL_SYMMETRIC = "expert_wise_per_channel_symmetric"


class StoppedAtTokenizer(Exception):
    """Raised in place of the demo's tokenizer load: the model is loaded by then."""


@pytest.fixture(scope="module")
def nxdi() -> Iterator[SimpleNamespace]:
    rng = torch.random.get_rng_state()  # importing inference_demo reseeds torch's global RNG
    with clients.real_nxdi() as stack:
        stack.demo = __import__(nxdi_hook.DEMO_MODULE, fromlist=["main"])
        yield stack
    torch.random.set_rng_state(rng)


@pytest.fixture(autouse=True)
def isolated(nxdi: SimpleNamespace, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    def stop(*args: object, **kwargs: object) -> None:
        raise StoppedAtTokenizer()

    monkeypatch.setattr(nxdi.demo, "load_tokenizer", stop)
    monkeypatch.setattr(nxdi.demo, "QuantizationType", QuantizationType)
    with clients.restored_environ():
        os.environ.update({"NEURON_PLATFORM_TARGET_OVERRIDE": "trn2", fmt.ALLOW_CUSTOM_ENV: "1",
                           "BASE_COMPILE_WORK_DIR": f"{tmp_path}/compiler-workdir/"})
        os.environ.pop(nxdi_hook.ENV_VAR, None)
        nxdi.device.loads.clear()
        nxdi.device.traces = 0
        try:
            yield
        finally:
            nxdi_hook.unregister()


def recipe(ckpt: Path, tmp_path: Path) -> tuple[dict[str, str], list[str]]:
    """The inference_demo recipe block of docs/serving.md for ``ckpt``: the modules file written, the command's
    environment and ``nxdi-gptoss-fp8``'s arguments."""
    mapping = {clients.RECIPE_MODEL: str(ckpt), RECIPE_COMPILED: str(tmp_path / "compiled"),
               RECIPE_MODULES: str(tmp_path / "modules_to_not_convert.json")}
    environ: dict[str, str] = {}
    argv: list[str] = []
    for words in clients.shell_commands(clients.recipe_block(clients.DEMO_RECIPE, "bash")):
        words = clients.substitute(words, mapping)
        if words[0] == "echo":
            assert words[2] == ">" and len(words) == 4, words
            assert json.loads(words[1]) == recipes.modules_file()
            Path(words[3]).write_text(words[1] + "\n")
            continue
        while "=" in words[0]:
            name, _, value = words.pop(0).partition("=")
            environ[name] = value
        assert words[:2] == ["nxdi-gptoss-fp8", "inference-demo"], words
        argv = words[1:]
    assert environ == {nxdi_hook.ENV_VAR: nxdi_hook.NORMALIZED_FP8} and argv
    return environ, argv


def run(argv: list[str], environ: dict[str, str]) -> None:
    os.environ.update(environ)
    with pytest.raises(StoppedAtTokenizer):
        cli.main(argv)


@pytest.fixture
def ckpt(tiny_template: Path, tmp_path: Path) -> Path:
    return Path(shutil.copytree(tiny_template, tmp_path / "models" / "gpt-oss-tiny-fp8"))


def test_the_recipe_reaches_the_hook_and_loads(nxdi: SimpleNamespace, ckpt: Path, tmp_path: Path) -> None:
    environ, argv = recipe(ckpt, tmp_path)
    run(argv, environ)
    assert nxdi.device.traces == 1 and len(nxdi.device.loads) == 1
    weights = nxdi.device.loads[0][0]
    assert any(t.dtype == torch.float8_e4m3fn for t in weights.values())
    weights_dir = tmp_path / "compiled" / "weights"
    assert (weights_dir / "tp0_sharded_checkpoint.safetensors").is_file()
    assert any(p.name.endswith("manifest.json") for p in weights_dir.iterdir())  # the hook recorded the ranks
    assert "gpt_oss" not in nxdi.demo.MODEL_TYPES or nxdi_hook.is_registered()


def test_the_recipe_against_a_tampered_checkpoint_stops_before_compiling(
    nxdi: SimpleNamespace, ckpt: Path, tmp_path: Path, capsys: pytest.CaptureFixture,
) -> None:
    """NxDI's "quantize and save" step runs our preflight: nothing is compiled for a broken checkpoint."""
    environ, argv = recipe(ckpt, tmp_path)
    (ckpt / "stray.safetensors").write_bytes(b"not a shard")
    os.environ.update(environ)
    assert cli.main(argv) == 1
    assert "failed the preflight" in capsys.readouterr().err
    assert nxdi.device.traces == 0 and not nxdi.device.loads


def test_a_rerun_with_a_missing_rank_file_is_refused(
    nxdi: SimpleNamespace, ckpt: Path, tmp_path: Path, capsys: pytest.CaptureFixture,
) -> None:
    """--skip-compile on the recipe's compiled directory, one rank file gone: refused before NxDI reads any."""
    environ, argv = recipe(ckpt, tmp_path)
    run(argv, environ)
    (tmp_path / "compiled" / "weights" / "tp3_sharded_checkpoint.safetensors").unlink()
    capsys.readouterr()
    assert cli.main([*argv, "--skip-compile"]) == 1
    assert "presharded.missing_rank_file" in capsys.readouterr().err and len(nxdi.device.loads) == 1


# --------------------------------------------------------------------------- the Python API recipe


def test_the_python_recipe_compiles_and_loads(nxdi: SimpleNamespace, ckpt: Path, tmp_path: Path) -> None:
    """The Python recipe block of docs/serving.md as written, the paths and padded sizes the tiny checkpoint's."""
    config = json.loads((ckpt / fmt.CONFIG_FILE).read_text())
    code = clients.recipe_block(clients.PYTHON_RECIPE, "python")
    for old, new in ((clients.RECIPE_MODEL, str(ckpt)), ("/data/neuron-compiled/gpt-oss-120b-fp8-tp64-api", str(tmp_path / "api")),
                     (f"={clients.RECIPE_PADDED}", f"={config['hidden_size']}")):
        assert old in code
        code = code.replace(old, new)
    namespace: dict[str, object] = {}
    exec(compile(code, "docs/serving.md (The Python API)", "exec"), namespace)
    assert nxdi.device.traces == 1 and len(nxdi.device.loads) == 1
    assert any(t.dtype == torch.float8_e4m3fn for t in nxdi.device.loads[0][0].values())
    assert namespace["model"].config.neuron_config.quantization_type == fmt.QUANTIZATION_TYPE  # type: ignore[attr-defined]
