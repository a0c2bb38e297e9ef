"""NxDI's own accuracy check (``utils.accuracy``, inference_demo's ``run_accuracy_check``) on NxDI's
real GPT-OSS model in CPU mode, loaded through the hook, against both references.

Each run is a subprocess (``support/accuracy_driver.py``) whose interpreter installs the Neuron
stand-ins (``nxdi_standin/cpu_site``). torch-neuronx's ``logit_validation`` is NxDI's own
implementation there (``nxdi_standin/accuracy_cpu``). The measured needs of each run (the
smallest rtol per top-k tier, the divergence difference) are printed: run with ``-s`` to see the
figures docs/accuracy.md quotes.

Run: ``NXDI_SRC=/path/nxdi NXD_SRC=/path/nxd python -m pytest -s -m nxdi test/test_accuracy_nxdi_cpu.py``
"""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from ckpt_edit import edit_shard, shard_of
from nxdi_standin import cpu_roots
from tiny_tokenizer import prompt_of, write_tokenizer

from nxdi_gptoss_fp8 import format as fmt
from nxdi_gptoss_fp8.convert import convert
from nxdi_gptoss_fp8.forward.goldens import make_goldens
from nxdi_gptoss_fp8.hub import companion_files
from nxdi_gptoss_fp8.nxdi import recipes
from nxdi_gptoss_fp8.synthetic.sources import (
    SOURCE_BF16,
    SOURCE_DIMS,
    SOURCE_MXFP4,
    make_source,
    source_config,
    source_tensors,
    write_source,
)

if cpu_roots.sources() is None:
    pytest.skip("NxDI CPU-mode tests need NXDI_SRC and NXD_SRC (source checkouts); not set", allow_module_level=True)

pytestmark = pytest.mark.nxdi
ROOT = Path(__file__).resolve().parent.parent
DRIVER = Path(__file__).resolve().parent / "support" / "accuracy_driver.py"
PROMPT = prompt_of([3, 7, 1, 9, 2, 5])
TOKENS = 8
# the tiny vocabulary (40) has no top-50/1000 tier; the tiers kept are NxDI's "5" and "all"
TIGHT = {"5": (1e-5, 1e-4), "all": (1e-5, 1e-4)}


def tiers_within(tol_map: dict[str, tuple[float, float]], vocab: int) -> dict[str, tuple[float, float]]:
    return {tier: tol for tier, tol in tol_map.items() if tier == "all" or int(tier) <= vocab}


@pytest.fixture(scope="module")
def made(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("accuracy-nxdi")
    out = {}
    for kind in (SOURCE_MXFP4, SOURCE_BF16):
        source = make_source(root / kind, kind, original=False)
        write_tokenizer(source, SOURCE_DIMS.vocab_size)
        out[kind] = source
        out[f"{kind}-fp8"] = root / f"{kind}-fp8"
        convert(source, out[f"{kind}-fp8"], max_shard_size="64KB", progress=False, extra_files=companion_files(source))
    return out


def run_driver(job: dict[str, Any], tmp_path: Path) -> dict[str, Any]:
    path = tmp_path / f"job-{len(list(tmp_path.glob('job-*')))}.json"
    path.write_text(json.dumps(job))
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([cpu_roots.site_dir(), str(ROOT)]), NXD_LOG_LEVEL="warning")
    env.pop(fmt.REFERENCE_ENV, None)
    done = subprocess.run([sys.executable, str(DRIVER), str(path)], capture_output=True, text=True, env=env,
                          timeout=1800, check=False)
    assert done.returncode == 0 and done.stdout.strip(), done.stderr[-4000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def needs_line(name: str, result: dict[str, Any]) -> str:
    return f"{name}: " + ", ".join(f"{key} {value:.2e}" for key, value in sorted(result["needs"].items()))


@pytest.mark.parametrize("kind", [SOURCE_MXFP4, SOURCE_BF16])
def test_check_accuracy_logits_passes_against_the_dequantized_reference(made: dict[str, Path], tmp_path: Path, kind: str) -> None:
    result = run_driver({"ckpt": str(made[f"{kind}-fp8"]), "reference": "dequantized", "prompt": PROMPT,
                         "num_tokens": TOKENS, "call": "logits", "tol_map": TIGHT, "divergence": 1e-3}, tmp_path)
    assert result["passed"], result
    print("\n" + needs_line(f"dequantized reference, {kind} conversion", result))


def test_check_accuracy_logits_against_the_source_passes_with_the_documented_tolerances(made: dict[str, Path], tmp_path: Path) -> None:
    """The BF16 source: FP8's own rounding shows, and stays within the recipe's tolerances."""
    tol_map = tiers_within(recipes.SOURCE_REFERENCE_TOL_MAP, SOURCE_DIMS.vocab_size)
    result = run_driver({"ckpt": str(made[f"{SOURCE_BF16}-fp8"]), "reference": str(made[SOURCE_BF16]), "prompt": PROMPT,
                         "num_tokens": TOKENS, "call": "logits", "tol_map": tol_map,
                         "divergence": recipes.SOURCE_REFERENCE_DIVERGENCE_TOL}, tmp_path)
    assert result["passed"], result
    assert 0 < result["needs"]["5"] <= tol_map["5"][1]  # quantization error shows, within the tolerance
    print("\n" + needs_line("BF16 source reference", result))


def test_check_accuracy_logits_fails_when_one_experts_scale_is_doubled(made: dict[str, Path], tmp_path: Path) -> None:
    ckpt = Path(shutil.copytree(made[f"{SOURCE_BF16}-fp8"], tmp_path / "doubled"))
    key = f"{fmt.layer_prefix(0)}{fmt.GATE_UP}.scale"  # expert 0 of layer 0: one expert of the checkpoint
    edit_shard(ckpt, shard_of(ckpt, key), lambda t: t[key][0].mul_(2))
    tol_map = tiers_within(recipes.SOURCE_REFERENCE_TOL_MAP, SOURCE_DIMS.vocab_size)
    result = run_driver({"ckpt": str(ckpt), "reference": str(made[SOURCE_BF16]), "prompt": PROMPT, "num_tokens": TOKENS,
                         "call": "logits", "tol_map": tol_map, "divergence": recipes.SOURCE_REFERENCE_DIVERGENCE_TOL}, tmp_path)
    assert not result["passed"] and result["error"] == "LogitMatchingValidationError", result
    print("\n" + needs_line("layer 0 expert 0's gate_up scale doubled, vs the BF16 source", result))


@pytest.mark.parametrize("mode", ["logit-matching", "token-matching"])
@pytest.mark.parametrize("reference", ["dequantized", "source"])
def test_a_goldens_file_is_accepted_by_inference_demos_accuracy_check(made: dict[str, Path], tmp_path: Path,
                                                                      mode: str, reference: str) -> None:
    """No reference is set for NxDI's run: the file alone answers, as on a Neuron host."""
    ckpt = made[f"{SOURCE_MXFP4}-fp8"]
    goldens = tmp_path / "goldens.pt"
    chosen = "dequantized" if reference == "dequantized" else str(made[SOURCE_MXFP4])
    report = make_goldens(ckpt, chosen, prompt=PROMPT, num_tokens=TOKENS, output=goldens, dtype="float32",
                          allow_custom_model=True)
    job = {"ckpt": str(ckpt), "reference": None, "prompt": PROMPT, "num_tokens": TOKENS, "call": "demo", "mode": mode,
           "expected_outputs_path": str(goldens), "tol_map": TIGHT, "divergence": 1e-3}
    if mode == "token-matching":
        job["num_tokens_to_check"] = report.token_matching_count  # NxDI compares prompt and generated ids, pads dropped
    result = run_driver(job, tmp_path)
    assert result["passed"], result


def test_a_wrong_goldens_file_fails_inference_demos_logit_check(made: dict[str, Path], tmp_path: Path) -> None:
    """The check reads the file: goldens of the BF16 conversion do not match the MXFP4 one's model."""
    goldens = tmp_path / "other.pt"
    make_goldens(made[f"{SOURCE_BF16}-fp8"], "dequantized", prompt=PROMPT, num_tokens=TOKENS, output=goldens,
                 dtype="float32", allow_custom_model=True)
    result = run_driver({"ckpt": str(made[f"{SOURCE_MXFP4}-fp8"]), "reference": None, "prompt": PROMPT,
                         "num_tokens": TOKENS, "call": "demo", "mode": "logit-matching",
                         "expected_outputs_path": str(goldens), "tol_map": TIGHT, "divergence": 1e-3}, tmp_path)
    assert result["error"] == "LogitMatchingValidationError", result


def test_check_accuracy_logits_passes_on_a_20b_shaped_layer(tmp_path_factory: pytest.TempPathFactory, tmp_path: Path) -> None:
    """One gpt-oss-20b-shaped decoder layer (32 experts, H = I = 2880, 64 heads; vocabulary cut
    to 2048), against the dequantized reference with NxDI's default tolerances."""
    root = tmp_path_factory.mktemp("accuracy-20b")
    dims = dataclasses.replace(fmt.PROFILES[fmt.PROFILE_20B], num_hidden_layers=1, vocab_size=2048)
    source = write_source(root / "bf16", source_tensors(dims, SOURCE_BF16), source_config(dims, SOURCE_BF16),
                          original=False, kind=SOURCE_BF16)
    write_tokenizer(source, dims.vocab_size)
    convert(source, root / "fp8", progress=False, extra_files=companion_files(source))
    shutil.rmtree(source)  # only the checkpoint is needed from here
    result = run_driver({"ckpt": str(root / "fp8"), "reference": "dequantized",
                         "prompt": prompt_of([3, 7, 1, 9, 2, 5, 11, 40]), "num_tokens": TOKENS, "call": "logits",
                         "tol_map": None, "divergence": 1e-3}, tmp_path)
    assert result["passed"], result
    print("\n" + needs_line("20b-shaped layer, dequantized reference, NxDI's default tolerances", result))
