"""NxDI's real GPT-OSS model in its CPU mode, through ``selfcheck`` and ``check-forward``.

Runs when ``NXDI_SRC`` and ``NXD_SRC`` point at source checkouts of neuronx-distributed-inference
and neuronx-distributed. Every run is a CLI subprocess whose interpreter installs the test-only
stand-ins for the Neuron-only import roots (``nxdi_standin/cpu_site``), so the real NxDI never
mixes with the stand-in NxDI classes other test modules install in this process.

Run: ``NXDI_SRC=/path/nxdi NXD_SRC=/path/nxd python -m pytest -s -m nxdi test/test_forward_cpu_model.py``
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import torch
from ckpt_edit import edit_shard, shard_of
from nxdi_standin import cpu_roots

from nxdi_gptoss_fp8 import format as fmt
from nxdi_gptoss_fp8.convert import convert
from nxdi_gptoss_fp8.synthetic.sources import SOURCE_BF16, SOURCE_MXFP4, make_source

if cpu_roots.sources() is None:
    pytest.skip("NxDI CPU-mode tests need NXDI_SRC and NXD_SRC (source checkouts); not set", allow_module_level=True)

pytestmark = pytest.mark.nxdi
ROOT = Path(__file__).resolve().parent.parent
GATE_UP_0 = f"{fmt.layer_prefix(0)}{fmt.GATE_UP}"
# a device NeuronConfig (tp 8, an NKI kernel on): the preflight checks it as given; the CPU run
# replaces what CPU mode needs and reports those keys
DEVICE_CONFIG = {
    "tp_degree": 8, "quantized": True, "quantization_type": fmt.QUANTIZATION_TYPE,
    "quantization_dtype": fmt.QUANTIZATION_DTYPE, "qkv_kernel_enabled": True,
    "modules_to_not_convert": ["lm_head", "layers.0.self_attn", "layers.1.self_attn"],
}


def run_cli(*args: str) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([cpu_roots.site_dir(), str(ROOT)]))
    env.pop(fmt.ALLOW_CUSTOM_ENV, None)
    return subprocess.run([sys.executable, "-m", "nxdi_gptoss_fp8.cli", *args], capture_output=True, text=True,
                          env=env, timeout=600, check=False)


def run_json(*args: str, code: int) -> dict[str, Any]:
    done = run_cli(*args, "--json")
    assert done.returncode == code, done.stdout[-3000:] + done.stderr[-3000:]
    return json.loads(done.stdout)


@pytest.fixture(scope="module")
def sources(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """Tiny HF sources (H 64 ≠ I 96) and their conversions: plain, padded, from BF16."""
    root = tmp_path_factory.mktemp("cpu-model")
    mxfp4 = make_source(root / "hf-mxfp4", SOURCE_MXFP4, original=False)
    bf16 = make_source(root / "hf-bf16", SOURCE_BF16, original=False)
    convert(mxfp4, root / "fp8", max_shard_size="64KB", progress=False)
    convert(mxfp4, root / "fp8-padded", padded_hidden_size=96, padded_intermediate_size=128,
            max_shard_size="64KB", progress=False)
    convert(bf16, root / "fp8-from-bf16", max_shard_size="64KB", progress=False)
    return {"mxfp4": mxfp4, "bf16": bf16, "fp8": root / "fp8", "fp8-padded": root / "fp8-padded",
            "fp8-from-bf16": root / "fp8-from-bf16"}


def report_line(name: str, result: dict[str, Any]) -> str:
    s = result["summary"]
    return (f"{name}: max|Δ| {s['max_abs_diff']:.3e} cos {s['min_cosine']:.7f} top-1 {s['top1_agreement']:.0%} "
            f"KL {s['max_kl']:.2e} ({result['bound']['kind']}) {result['timings_s'].get('total', 0):.1f} s")


@pytest.mark.parametrize("tp", [1, 2])
def test_selfcheck_json(tp: int) -> None:
    result = run_json("selfcheck", "--tp", str(tp), code=0)
    assert result["ok"] and result["tp"] == tp and result["conversion_exact"]
    by_name = {c["name"]: c for c in result["comparisons"]}
    assert by_name["NxDI normalized (hook) vs NxDI legacy FP8"]["max_abs_diff"] == 0.0
    for comparison in result["comparisons"]:
        assert comparison["ok"] and comparison["max_abs_diff"] <= 1e-5
        assert comparison["top1_agree"] == comparison["positions"] == 6
    nxdi_src = os.path.realpath(os.environ["NXDI_SRC"])
    assert os.path.realpath(result["environment"]["neuronx_distributed_inference"]["path"]).startswith(nxdi_src)
    assert len(result["package"]["files_sha256"]) == 64
    print(f"\nselfcheck tp {tp}: " + ", ".join(f"{c['name']} {c['max_abs_diff']:.3e}" for c in result["comparisons"])
          + f" ({result['elapsed_s']} s)")


@pytest.mark.parametrize(("ckpt", "neuron_config", "layers"), [
    ("fp8", {}, 2),
    ("fp8", {}, 1),  # a 1-layer window of a 2-layer checkpoint
    ("fp8-padded", {"fused_qkv": True, "padded_hidden_size": 96, "padded_intermediate_size": 128}, 2),
    ("fp8", {"lm_head_pad": True, "lm_head_pad_alignment_size": 3}, 2),  # 40 % 3 ≠ 0: NxDI pads the head
], ids=["plain", "window", "padded-fused-qkv", "lm-head-pad"])
def test_check_forward_mxfp4_source_agrees_to_float32_rounding(
    sources: dict[str, Path], tmp_path: Path, ckpt: str, neuron_config: dict[str, Any], layers: int,
) -> None:
    config = tmp_path / "neuron_config.json"
    config.write_text(json.dumps({**DEVICE_CONFIG, **neuron_config}))
    result = run_json("check-forward", str(sources[ckpt]), "--source", str(sources["mxfp4"]), "--layers", str(layers),
                      "--neuron-config", str(config), "--allow-custom-model", code=0)
    assert result["ok"] and result["model_built"] and result["bound"]["kind"] == "exact"
    assert {"tp_degree", "qkv_kernel_enabled"} <= set(result["neuron_config_changed_for_cpu"])
    assert result["summary"]["max_abs_diff"] <= result["bound"]["max_abs_diff"] < 1e-4
    assert result["summary"]["top1_agreement"] == 1.0 and len(result["positions"]) == 6
    print("\n" + report_line(f"check-forward {ckpt} {neuron_config} K={layers}", result))


def test_check_forward_bf16_source_reports_quantization_error(sources: dict[str, Path]) -> None:
    result = run_json("check-forward", str(sources["fp8-from-bf16"]), "--source", str(sources["bf16"]),
                      "--allow-custom-model", code=0)
    assert result["bound"]["kind"] == "quantized" and result["summary"]["violations"] == 0
    assert result["summary"]["max_abs_diff"] > 0  # FP8 rounding shows
    assert result["summary"]["min_cosine"] >= result["bound"]["min_cosine"]
    print("\n" + report_line("check-forward BF16 source", result))


def test_corrupted_checkpoint_is_refused_before_any_model_is_built(sources: dict[str, Path], tmp_path: Path) -> None:
    ckpt = Path(shutil.copytree(sources["fp8"], tmp_path / "ckpt"))
    scale = f"{GATE_UP_0}.scale"
    edit_shard(ckpt, shard_of(ckpt, scale), lambda t: t.__setitem__(scale, t[scale].to(torch.bfloat16)))
    done = run_cli("check-forward", str(ckpt), "--source", str(sources["mxfp4"]), "--allow-custom-model", "--json")
    assert done.returncode == 1, done.stderr[-2000:]
    result = json.loads(done.stdout)
    assert not result["preflight"]["ok"] and not result["model_built"] and result["positions"] == []
    assert "K shape" not in done.stderr  # NxDI never built a layer


def swap_gate_up(ckpt: Path, expert: int) -> None:
    """Swap the gate and up halves of one expert's gate_up weight and scale (chunked layout)."""
    for key in (f"{GATE_UP_0}.weight", f"{GATE_UP_0}.scale"):
        def change(tensors: dict[str, torch.Tensor], key: str = key) -> None:
            value = tensors[key].clone()
            half = value.shape[2] // 2
            value[expert] = torch.cat([value[expert, :, half:], value[expert, :, :half]], dim=1)
            tensors[key] = value

        edit_shard(ckpt, shard_of(ckpt, key), change)


def test_check_forward_catches_a_gate_up_swap_the_preflight_cannot(sources: dict[str, Path], tmp_path: Path) -> None:
    ckpt = Path(shutil.copytree(sources["fp8"], tmp_path / "swapped"))
    swap_gate_up(ckpt, expert=1)
    validate = run_cli("validate", str(ckpt), "--deep", "--allow-custom-model")
    assert validate.returncode == 0, validate.stdout + validate.stderr
    result = run_json("check-forward", str(ckpt), "--source", str(sources["mxfp4"]), "--allow-custom-model", code=1)
    assert result["preflight"]["ok"] and result["model_built"] and not result["ok"]
    assert result["summary"]["violations"] > 0
    assert result["summary"]["max_abs_diff"] > 100 * result["bound"]["max_abs_diff"]
    print("\n" + report_line("check-forward gate/up swap (expert 1, layer 0)", result))
