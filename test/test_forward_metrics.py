"""The parts of selfcheck/check-forward that need no NxDI: metrics, bounds, the token plan, the
CPU settings, and the CLI's answer when NxDI is absent (one line, exit 2)."""

from __future__ import annotations

import importlib.util
import json
import math
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from ckpt_edit import edit_config

from nxdi_gptoss_fp8.convert import convert
from nxdi_gptoss_fp8.forward import cpu_model
from nxdi_gptoss_fp8.forward import metrics as fm
from nxdi_gptoss_fp8.synthetic.sources import SOURCE_MXFP4, make_source

ROOT = Path(__file__).resolve().parent.parent


def logits(rows: int = 4, vocab: int = 32, seed: int = 0) -> torch.Tensor:
    return torch.randn((rows, vocab), generator=torch.Generator().manual_seed(seed))


def test_exact_tolerance_matches_the_stated_values() -> None:
    assert fm.exact_tolerance(64, 2, 1.0) == pytest.approx(16 * 2.0 ** -24 * 3 * 8)
    assert fm.exact_tolerance(64, 2, 1.0) == pytest.approx(2.3e-5, rel=0.01)
    assert fm.exact_tolerance(2880, 2, 0.5) == pytest.approx(1.5e-4, rel=0.03)
    assert fm.exact_tolerance(64, 2, 10.0) == pytest.approx(10 * fm.exact_tolerance(64, 2, 1.0))


@pytest.mark.parametrize(("layers", "expected"), [(1, 0.9974), (2, 0.9896), (100, fm.MIN_QUANTIZED_COSINE)])
def test_quantized_min_cosine(layers: int, expected: float) -> None:
    assert fm.quantized_min_cosine(layers) == pytest.approx(expected, abs=1e-4)


def test_identical_logits_pass_with_zero_difference() -> None:
    ref = logits()
    bound = fm.bound_for(fm.EXACT, hidden_size=64, layers=2, reference=ref)
    metrics = fm.compare(ref.clone(), ref, range(5, 9), bound)
    assert [m.position for m in metrics] == [5, 6, 7, 8]
    assert all(m.ok and m.top1_agree and m.max_abs_diff == 0 and m.kl == 0 for m in metrics)
    assert all(m.cosine == pytest.approx(1.0) for m in metrics)


def test_exact_bound_flags_only_the_position_beyond_it() -> None:
    ref = logits()
    bound = fm.bound_for(fm.EXACT, hidden_size=64, layers=2, reference=ref)
    assert bound.max_abs_diff is not None
    checked = ref.clone()
    checked[0] += bound.max_abs_diff / 2
    checked[2, 3] += bound.max_abs_diff * 10
    metrics = fm.compare(checked, ref, range(4), bound)
    assert [m.ok for m in metrics] == [True, True, False, True]
    summary = fm.summarize(metrics)
    assert summary["violations"] == 1 and summary["max_abs_diff"] == pytest.approx(bound.max_abs_diff * 10, rel=1e-4)


def test_exact_bound_tolerates_a_top1_flip_only_on_a_near_tie() -> None:
    ref = torch.zeros((2, 8), dtype=torch.float64)
    ref[:, 0], ref[:, 1] = 1.0, 1.0 - 1e-7  # a near-tie at row 0
    ref[1, 1] = 0.5  # a clear winner at row 1
    bound = fm.bound_for(fm.EXACT, hidden_size=64, layers=2, reference=ref)
    checked = ref.clone()
    checked[0, 1] += 2e-7  # the runner-up overtakes within the bound
    checked[1, 1] += 0.5 + 1e-7  # overtakes by far more than the bound
    first, second = fm.compare(checked, ref, range(2), bound)
    assert not first.top1_agree and first.ok
    assert not second.top1_agree and not second.ok


def test_quantized_bound_is_on_cosine() -> None:
    ref = logits(rows=2, vocab=256)
    bound = fm.bound_for(fm.QUANTIZED, hidden_size=64, layers=2, reference=ref)
    assert bound.min_cosine == pytest.approx(fm.quantized_min_cosine(2))
    noise = logits(rows=2, vocab=256, seed=1)
    checked = ref + torch.stack([0.01 * noise[0], 1.0 * noise[1]])
    near, far = fm.compare(checked, ref, range(2), bound)
    assert near.ok and near.cosine > 0.999
    assert not far.ok and far.cosine < bound.min_cosine
    assert far.kl > near.kl > 0


def test_non_finite_logits_fail() -> None:
    ref = logits(rows=1)
    checked = ref.clone()
    checked[0, 0] = math.nan
    bound = fm.bound_for(fm.EXACT, hidden_size=64, layers=1, reference=ref)
    assert not fm.compare(checked, ref, range(1), bound)[0].ok


def test_bad_inputs() -> None:
    with pytest.raises(ValueError, match="unknown bound kind"):
        fm.bound_for("loose", hidden_size=64, layers=1, reference=logits())
    with pytest.raises(ValueError, match="shapes differ"):
        fm.compare(logits(rows=2), logits(rows=3), range(2), fm.bound_for(fm.EXACT, hidden_size=64, layers=1, reference=logits()))


def test_fixed_plan_is_deterministic_and_in_range() -> None:
    plan = cpu_model.fixed_plan(40, tokens=12, steps=6)
    assert plan == cpu_model.fixed_plan(40, tokens=12, steps=6)
    assert plan != cpu_model.fixed_plan(40, tokens=12, steps=6, seed=1)
    assert len(plan.tokens) == 12 and all(0 <= t < 40 for t in plan.tokens) and len(set(plan.tokens)) > 6
    assert plan.context == 6 and list(plan.positions) == [5, 6, 7, 8, 9, 10] and plan.seq_len == 16
    assert cpu_model.fixed_plan(201088, tokens=40, steps=8).seq_len == 48


@pytest.mark.parametrize(("tokens", "steps"), [(1, 0), (12, 0), (12, 12), (12, 13)])
def test_fixed_plan_refuses_bad_counts(tokens: int, steps: int) -> None:
    with pytest.raises(ValueError):
        cpu_model.fixed_plan(40, tokens=tokens, steps=steps)


def test_neuron_settings_replace_what_cpu_mode_needs_and_report_it() -> None:
    user = {"tp_degree": 64, "torch_dtype": "bfloat16", "fused_qkv": True, "qkv_kernel_enabled": True,
            "moe_ep_degree": 4, "modules_to_not_convert": ["lm_head", "self_attn"], "lm_head_pad": True}
    plan = cpu_model.fixed_plan(40)
    spec = cpu_model.RunSpec("/ckpt", cpu_model.ROUTE_NORMALIZED, user)
    settings, changed = cpu_model.neuron_settings(spec, plan, tp=2, layers=2)
    assert settings["tp_degree"] == 2 and settings["torch_dtype"] == torch.float32 and settings["on_cpu"]
    assert settings["seq_len"] == settings["max_context_length"] == plan.seq_len and settings["apply_seq_ids_mask"]
    assert settings["fused_qkv"] and settings["lm_head_pad"] and "qkv_kernel_enabled" not in settings
    assert settings["quantized"] and settings["quantized_checkpoints_path"] == "/ckpt"
    assert settings["modules_to_not_convert"] == ["lm_head", "self_attn", "layers.0.self_attn", "layers.1.self_attn"]
    assert changed == ["moe_ep_degree", "qkv_kernel_enabled", "torch_dtype", "tp_degree"]
    windowed, _ = cpu_model.neuron_settings(spec, plan, tp=1, layers=2, sliding_window=128)
    assert windowed["seq_len"] == windowed["max_context_length"] == 128  # the context covers one window
    hf_settings, _ = cpu_model.neuron_settings(cpu_model.RunSpec("/hf", cpu_model.ROUTE_HF), plan, tp=1, layers=2)
    assert hf_settings["quantized"] is False and "quantized_checkpoints_path" not in hf_settings


# --------------------------------------------------------------------------- without NxDI

needs_no_nxdi = pytest.mark.skipif(importlib.util.find_spec("neuronx_distributed_inference") is not None,
                                   reason="NxDI is installed here")


def cli(*args: str) -> subprocess.CompletedProcess[str]:
    env = {key: value for key, value in os.environ.items() if key not in ("NXDI_SRC", "NXD_SRC")}
    env["PYTHONPATH"] = str(ROOT)
    return subprocess.run([sys.executable, "-m", "nxdi_gptoss_fp8.cli", *args], capture_output=True, text=True,
                          env=env, timeout=120, check=False)


@needs_no_nxdi
@pytest.mark.parametrize("extra", [[], ["--tp", "2"], ["--json"]])
def test_selfcheck_without_nxdi_says_so_in_one_line(extra: list[str]) -> None:
    done = cli("selfcheck", *extra)
    assert done.returncode == 2
    assert done.stderr.count("\n") == 1 and done.stderr.startswith("nxdi-gptoss-fp8 selfcheck: needs NxDI:")
    if "--json" in extra:  # the error as the one JSON error document, as for every command
        error = json.loads(done.stdout)["error"]
        assert error["kind"] == "missing_dependency" and error["message"].startswith("needs NxDI:")
    else:
        assert done.stdout == ""


@needs_no_nxdi
@pytest.mark.parametrize("setting", ["src-folders", "empty-folders", "only-nxdi", "files"])
def test_selfcheck_names_unusable_source_root_variables(setting: str, tmp_path: Path) -> None:
    """``NXDI_SRC``/``NXD_SRC`` set to something that is no repository root (its ``src/`` folder,
    an empty folder, a file, one of the two unset): the one line names each variable, what it
    holds and what it must be, never only "run this where NxDI is installed"."""
    for repo in ("nxdi", "nxd"):
        (tmp_path / repo / "src").mkdir(parents=True)
    (tmp_path / "file").write_text("")
    values = {"src-folders": (tmp_path / "nxdi" / "src", tmp_path / "nxd" / "src"),
              "empty-folders": (tmp_path / "nxdi", tmp_path / "nxd"),
              "only-nxdi": (tmp_path / "nxdi" / "src", None),
              "files": (tmp_path / "file", tmp_path / "file")}[setting]
    env = {key: value for key, value in os.environ.items() if key not in ("NXDI_SRC", "NXD_SRC")}
    env.update({var: str(value) for var, value in zip(("NXDI_SRC", "NXD_SRC"), values, strict=True) if value is not None})
    env["PYTHONPATH"] = str(ROOT)
    done = subprocess.run([sys.executable, "-m", "nxdi_gptoss_fp8.cli", "selfcheck", "--json"], capture_output=True,
                          text=True, env=env, timeout=120, check=False)
    assert done.returncode == 2 and done.stderr.count("\n") == 1, done.stderr
    error = json.loads(done.stdout)["error"]
    assert error["kind"] == "missing_dependency"
    nxdi, nxd = values
    assert f"NXDI_SRC={nxdi} has no src/neuronx_distributed_inference" in error["message"]
    assert (f"NXD_SRC={nxd} has no src/neuronx_distributed" if nxd else "NXD_SRC is not set") in error["message"]
    assert "the root of a neuronx-distributed-inference checkout" in error["message"]
    assert "not src/ itself" in error["message"] and "where neuronx-distributed-inference is installed" not in error["message"]


@needs_no_nxdi
def test_check_forward_without_nxdi_preflights_first(tiny_template: Path, tmp_path: Path) -> None:
    source = make_source(tmp_path / "hf", SOURCE_MXFP4, original=False)
    ckpt = tmp_path / "fp8"
    convert(source, ckpt, max_shard_size="64KB", progress=False)
    done = cli("check-forward", str(ckpt), "--source", str(source), "--allow-custom-model")
    assert done.returncode == 2 and done.stdout == ""
    # the memory line first, then the refusal
    said, refused = done.stderr.splitlines()
    assert said.startswith("nxdi-gptoss-fp8 check-forward: needs about ")
    assert refused.startswith("nxdi-gptoss-fp8 check-forward: needs NxDI:")
    not_a_source = cli("check-forward", str(ckpt), "--source", str(tmp_path), "--allow-custom-model")
    assert not_a_source.returncode == 2 and not_a_source.stderr.count("\n") == 1
    broken = Path(shutil.copytree(tiny_template, tmp_path / "broken"))
    edit_config(broken, lambda c: c.__setitem__("hidden_size", 48))
    refused = cli("check-forward", str(broken), "--source", str(tmp_path), "--allow-custom-model")
    assert refused.returncode == 1 and "no model was built" in refused.stdout


def test_selfcheck_rejects_a_bad_tp() -> None:
    done = cli("selfcheck", "--tp", "0")
    assert done.returncode == 2 and "--tp must be at least 1" in done.stderr
