"""The accuracy references and ``goldens``: transformers' model from a normalized checkpoint (or its
recorded source), the file NxDI's ``--expected-outputs-path`` reads, and every refusal."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import torch
from ckpt_edit import edit_shard, shard_of
from tiny_tokenizer import prompt_of, write_tokenizer

from nxdi_gptoss_fp8 import format as fmt
from nxdi_gptoss_fp8.convert import convert
from nxdi_gptoss_fp8.errors import ConfigError, ConversionError, CpuModelError
from nxdi_gptoss_fp8.forward.goldens import make_goldens, read_goldens
from nxdi_gptoss_fp8.forward.hf_reference import build_reference, reference_dtype
from nxdi_gptoss_fp8.hub import companion_files
from nxdi_gptoss_fp8.synthetic.sources import (
    SOURCE_BF16,
    SOURCE_COMPRESSED_TENSORS,
    SOURCE_DIMS,
    SOURCE_MXFP4,
    make_source,
)
from nxdi_gptoss_fp8.validate.nxdi_config import parse_reference, reference_choice

ROOT = Path(__file__).resolve().parent.parent
TOKENS = (3, 7, 1, 9, 2, 5, 11, 4)
GATE_UP_0 = f"{fmt.layer_prefix(0)}{fmt.GATE_UP}"


@pytest.fixture(scope="module")
def made(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """Tiny sources with a tokenizer, and their conversions (one padded), made once."""
    root = tmp_path_factory.mktemp("accuracy")
    out: dict[str, Path] = {}
    for kind in (SOURCE_MXFP4, SOURCE_BF16):
        source = make_source(root / kind, kind, original=False)
        write_tokenizer(source, SOURCE_DIMS.vocab_size)
        out[kind] = source
        convert(source, root / f"{kind}-fp8", max_shard_size="64KB", progress=False, extra_files=companion_files(source))
        out[f"{kind}-fp8"] = root / f"{kind}-fp8"
    convert(out[SOURCE_MXFP4], root / "padded", padded_hidden_size=96, padded_intermediate_size=128,
            max_shard_size="64KB", progress=False, extra_files=companion_files(out[SOURCE_MXFP4]))
    out["padded"] = root / "padded"
    out["other"] = make_source(root / "other", SOURCE_MXFP4, seed=1, original=False)
    out["ct"] = make_source(root / "ct", SOURCE_COMPRESSED_TENSORS, original=False)
    return out


def logits_of(model: Any) -> torch.Tensor:
    with torch.no_grad():
        return model(input_ids=torch.tensor([TOKENS])).logits[0].float()


# --------------------------------------------------------------------------- an independent dequantization


def independent_state(ckpt: Path) -> dict[str, torch.Tensor]:
    """transformers' float32 state dict from the checkpoint's bytes, written here without the
    package's mapping: torch's own E4M3 cast × scale, the padding sliced off, gate/up re-interleaved."""
    from safetensors.torch import load_file

    index = json.loads((ckpt / fmt.INDEX_FILE).read_text())
    stored: dict[str, torch.Tensor] = {}
    for shard in sorted(set(index["weight_map"].values())):
        stored.update(load_file(str(ckpt / shard)))
    d = SOURCE_DIMS
    h, i = d.hidden_size, d.intermediate_size
    out = {"model.embed_tokens.weight": stored["embed_tokens.weight"][:, :h], "model.norm.weight": stored["norm.weight"][:h],
           "lm_head.weight": stored["lm_head.weight"][:, :h]}
    for layer in range(d.num_hidden_layers):
        n, m = f"layers.{layer}.", f"model.layers.{layer}."
        out[m + "input_layernorm.weight"] = stored[n + "input_layernorm.weight"][:h]
        out[m + "post_attention_layernorm.weight"] = stored[n + "post_attention_layernorm.weight"][:h]
        for p in "qkv":
            out[m + f"self_attn.{p}_proj.weight"] = stored[n + f"self_attn.{p}_proj.weight"][:, :h]
            out[m + f"self_attn.{p}_proj.bias"] = stored[n + f"self_attn.{p}_proj.bias"]
        out[m + "self_attn.o_proj.weight"] = stored[n + "self_attn.o_proj.weight"][:h]
        out[m + "self_attn.o_proj.bias"] = stored[n + "self_attn.o_proj.bias"][:h]
        out[m + "self_attn.sinks"] = stored[n + "self_attn.learned_sinks.sink"]
        out[m + "mlp.router.weight"] = stored[n + "feed_forward.moe.router.linear_router.weight"][:, :h]
        out[m + "mlp.router.bias"] = stored[n + "feed_forward.moe.router.linear_router.bias"]
        gu = stored[n + f"{fmt.GATE_UP}.weight"].to(torch.float32) * stored[n + f"{fmt.GATE_UP}.scale"]
        half = gu.shape[2] // 2
        gate, up = gu[:, :h, :i], gu[:, :h, half:half + i]
        out[m + "mlp.experts.gate_up_proj"] = torch.stack([gate, up], dim=3).reshape(gate.shape[0], h, 2 * i)
        bias = stored[n + f"{fmt.GATE_UP}.bias"]
        out[m + "mlp.experts.gate_up_proj_bias"] = torch.stack([bias[:, :i], bias[:, half:half + i]], dim=2).reshape(-1, 2 * i)
        dn = stored[n + f"{fmt.DOWN}.weight"].to(torch.float32) * stored[n + f"{fmt.DOWN}.scale"]
        out[m + "mlp.experts.down_proj"] = dn[:, :i, :h]
        out[m + "mlp.experts.down_proj_bias"] = stored[n + f"{fmt.DOWN}.bias"][:, :h]
    return {name: value.to(torch.float32).contiguous() for name, value in out.items()}


@pytest.mark.parametrize("ckpt", ["mxfp4-fp8", "padded", "bf16-fp8"])
def test_the_dequantized_reference_equals_an_independent_dequantization(made: dict[str, Path], ckpt: str) -> None:
    from nxdi_gptoss_fp8.forward.reference import reference_model

    key = {"mxfp4-fp8": f"{SOURCE_MXFP4}-fp8", "bf16-fp8": f"{SOURCE_BF16}-fp8"}.get(ckpt, ckpt)
    build = build_reference(made[key], "dequantized", dtype="float32", allow_custom_model=True)
    config = json.loads((made[key] / fmt.CONFIG_FILE).read_text())
    theirs = reference_model(config, independent_state(made[key]), SOURCE_DIMS.num_hidden_layers)
    ours, expected = logits_of(build.model), logits_of(theirs)
    assert torch.allclose(ours, expected, rtol=0, atol=1e-6 * float(expected.abs().max())), float((ours - expected).abs().max())
    assert build.kind == "dequantized" and len(build.layer_s) == SOURCE_DIMS.num_hidden_layers


def test_an_mxfp4_source_reference_equals_the_dequantized_one(made: dict[str, Path]) -> None:
    """MXFP4 → FP8 is exact here, so the source and the checkpoint are the same model."""
    source = build_reference(made[f"{SOURCE_MXFP4}-fp8"], str(made[SOURCE_MXFP4]), dtype="float32", allow_custom_model=True)
    dequantized = build_reference(made[f"{SOURCE_MXFP4}-fp8"], "dequantized", dtype="float32", allow_custom_model=True)
    assert source.kind == SOURCE_MXFP4
    assert torch.allclose(logits_of(source.model), logits_of(dequantized.model), rtol=0, atol=1e-5)


def test_the_default_dtype_is_bfloat16(made: dict[str, Path]) -> None:
    build = build_reference(made["padded"], "dequantized", allow_custom_model=True)
    assert build.dtype == "bfloat16" and build.model.model.layers[0].mlp.experts.gate_up_proj.dtype == torch.bfloat16
    assert reference_dtype("torch.float32") == torch.float32
    with pytest.raises(ValueError, match="not one of"):
        reference_dtype("float16")


@pytest.mark.parametrize(("source", "message"), [
    ("other", "records that it was converted from a source whose"),
    ("ct", "compressed-tensors"),
    (SOURCE_BF16, r"format hf-mxfp4 \(this source is hf-bf16\)"),
], ids=["another-fingerprint", "compressed-tensors", "another-format"])
def test_a_source_that_is_not_the_recorded_one_is_refused(made: dict[str, Path], source: str, message: str) -> None:
    with pytest.raises(ConversionError, match=message) as caught:
        build_reference(made[f"{SOURCE_MXFP4}-fp8"], str(made[source]), allow_custom_model=True, option="--reference")
    assert "\n" not in str(caught.value)


def test_a_host_without_the_memory_is_refused_after_saying_how_much(made: dict[str, Path]) -> None:
    with pytest.raises(CpuModelError, match=r"needs about .*the reference model .* the test host offers 1.00 kB: build it on a host"):
        build_reference(made["padded"], "dequantized", allow_custom_model=True, available=(1000, "the test host"))


def test_a_checkpoint_with_a_doubled_scale_gives_another_reference(made: dict[str, Path], tmp_path: Path) -> None:
    ckpt = Path(shutil.copytree(made["padded"], tmp_path / "doubled"))
    key = f"{GATE_UP_0}.scale"
    edit_shard(ckpt, shard_of(ckpt, key), lambda t: t[key][1].mul_(2))
    before = logits_of(build_reference(made["padded"], "dequantized", dtype="float32", allow_custom_model=True).model)
    after = logits_of(build_reference(ckpt, "dequantized", dtype="float32", allow_custom_model=True).model)
    assert not torch.allclose(before, after, atol=1e-3)


# --------------------------------------------------------------------------- the setting


@pytest.mark.parametrize(("value", "expected"), [
    (None, None), ("", None), ("  ", None), ("dequantized", "dequantized"), (" Dequantized ", "dequantized"),
    ("/data/models/gpt-oss-120b", "/data/models/gpt-oss-120b"), ("./gpt-oss-20b", "./gpt-oss-20b"),
])
def test_parse_reference_accepts(value: Any, expected: str | None) -> None:
    assert parse_reference(value) == expected


@pytest.mark.parametrize(("value", "message"), [
    ("dequantised", "did you mean 'dequantized'"), ("source", "is not a reference"), (True, "is not a reference"),
    (1, "is not a reference"),
])
def test_parse_reference_refuses(value: Any, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        parse_reference(value)


def test_the_environment_and_the_neuron_config_must_agree() -> None:
    nc = {fmt.REFERENCE_ATTR: "dequantized"}
    assert reference_choice(nc, {}) == "dequantized"
    assert reference_choice(nc, {fmt.REFERENCE_ENV: "DEQUANTIZED"}) == "dequantized"
    assert reference_choice(None, {fmt.REFERENCE_ENV: "/src"}) == "/src"
    assert reference_choice(None, {}) is None
    with pytest.raises(ConfigError, match="contradicts"):
        reference_choice(nc, {fmt.REFERENCE_ENV: "/src"})
    with pytest.raises(ConfigError, match=f"^{fmt.REFERENCE_ENV}='bf16' is not a reference"):
        reference_choice(None, {fmt.REFERENCE_ENV: "bf16"})


# --------------------------------------------------------------------------- goldens


@pytest.mark.parametrize("reference", ["dequantized", "source"])
def test_goldens_file_has_what_nxdis_demo_reads(made: dict[str, Path], tmp_path: Path, reference: str) -> None:
    ckpt = made[f"{SOURCE_MXFP4}-fp8"]
    chosen = "dequantized" if reference == "dequantized" else str(made[SOURCE_MXFP4])
    output = tmp_path / "goldens.pt"
    report = make_goldens(ckpt, chosen, prompt=prompt_of(list(TOKENS)), num_tokens=5, output=output, dtype="float32",
                          batch_size=2, allow_custom_model=True)
    loaded = torch.load(output)  # NxDI's call: weights_only by default
    sequences, scores = loaded.sequences, torch.stack(loaded.scores)  # token matching, logit matching
    assert sequences.shape == (2, len(TOKENS) + 5) and scores.shape == (5, 2, SOURCE_DIMS.vocab_size)
    assert sequences[0, :len(TOKENS)].tolist() == list(TOKENS) == report.input_ids
    assert torch.equal(scores.argmax(dim=2).T, sequences[:, len(TOKENS):])  # greedy: each token is its step's argmax
    assert report.generated_ids == sequences[0, len(TOKENS):].tolist()
    again = read_goldens(output)
    assert torch.equal(torch.stack(again.scores), scores)


@pytest.mark.parametrize(("num_tokens", "generated"), [(1, "1 token generated"), (2, "2 tokens generated")])
def test_goldens_report_counts_tokens_in_words(made: dict[str, Path], tmp_path: Path, num_tokens: int,
                                               generated: str) -> None:
    report = make_goldens(made[f"{SOURCE_MXFP4}-fp8"], "dequantized", prompt=prompt_of([5]), num_tokens=num_tokens,
                          output=tmp_path / "g.pt", allow_custom_model=True)
    text = report.render_text()
    assert f"prompt     {len(report.input_ids)} token" in text and f"; {generated} greedily" in text, text
    assert re.search(r"(?<![\d,])1 tokens", text) is None, text


def run_cli(*args: str) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    env.pop(fmt.REFERENCE_ENV, None)
    return subprocess.run([sys.executable, "-m", "nxdi_gptoss_fp8.cli", *args], capture_output=True, text=True,
                          env=env, timeout=300, check=False)


def test_goldens_cli_json(made: dict[str, Path], tmp_path: Path) -> None:
    output = tmp_path / "g.pt"
    done = run_cli("goldens", str(made["padded"]), "--reference", "dequantized", "--prompt", prompt_of([1, 2, 3]),
                   "--num-tokens", "3", "--output", str(output), "--allow-custom-model", "--json")
    assert done.returncode == 0, done.stderr[-2000:]
    result = json.loads(done.stdout)
    assert result["ok"] and result["kind"] == "dequantized" and result["dtype"] == "bfloat16" and result["layers"] == 2
    assert len(result["generated_ids"]) == 3 and output.is_file()
    assert "needs about" in done.stderr  # the memory, stated before building


@pytest.mark.parametrize(("output", "message"), [("{tmp}", "is a directory"), ("{tmp}/missing/g.pt", "does not exist"),
                                                ("{tmp}/file/g.pt", "does not exist")],
                         ids=["a-directory", "missing-parent", "parent-is-a-file"])
def test_goldens_output_path_is_a_usage_error(tmp_path: Path, capsys: pytest.CaptureFixture[str], output: str,
                                              message: str) -> None:
    """An --output that cannot be the file is a path error: exit 2, kind ``usage``, before any
    reference is built (the checkpoint here is an empty directory, never read)."""
    from nxdi_gptoss_fp8.cli import main

    (tmp_path / "ckpt").mkdir()
    (tmp_path / "file").write_text("not a directory")
    code = main(["goldens", str(tmp_path / "ckpt"), "--reference", "dequantized", "--prompt", "x", "--num-tokens", "1",
                 "--output", output.format(tmp=tmp_path), "--json"])
    captured = capsys.readouterr()
    error = json.loads(captured.out)["error"]
    assert code == 2 and error["kind"] == "usage" and message in error["message"], captured
    assert len(captured.err.strip().splitlines()) == 1


@pytest.mark.parametrize(("args", "code", "message"), [
    (["--reference", "dequantised"], 2, "dequantised does not exist"),
    (["--reference", "dequantized", "--num-tokens", "0"], 2, "at least 1"),
    (["--reference", "dequantized", "--output", "{tmp}"], 2, "is a directory"),
    (["--reference", "dequantized", "--output", "{tmp}/missing/g.pt"], 2, "does not exist"),
    (["--reference", "dequantized", "--tokenizer", "{tmp}"], 1, "holds no tokenizer"),
    (["--reference", "{other}"], 1, "records that it was converted from"),
    (["--reference", "{ct}"], 1, "compressed-tensors"),
], ids=["typo", "no-tokens", "output-dir", "output-parent", "no-tokenizer", "other-source", "ct-source"])
def test_goldens_cli_refuses_in_one_line(made: dict[str, Path], tmp_path: Path, args: list[str], code: int, message: str) -> None:
    values = {"tmp": str(tmp_path), "other": str(made["other"]), "ct": str(made["ct"])}
    argv = [arg.format(**values) for arg in args]
    defaults = {"--prompt": prompt_of([1, 2]), "--num-tokens": "2", "--output": str(tmp_path / "g.pt")}
    for option, value in defaults.items():
        if option not in argv:
            argv += [option, value]
    done = run_cli("goldens", str(made[f"{SOURCE_MXFP4}-fp8"]), *argv, "--allow-custom-model")
    assert done.returncode == code, done.stderr[-2000:]
    lines = [line for line in done.stderr.splitlines() if line.startswith("nxdi-gptoss-fp8 goldens") and "needs about" not in line]
    assert len(lines) == 1 and message in lines[0], done.stderr[-2000:]
    assert not (tmp_path / "g.pt").exists()
