"""The converter: detection, layout, exactness, crash safety, determinism, SRC untouched, CLI."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from nxdi_gptoss_fp8 import format as fmt
from nxdi_gptoss_fp8.cli import main
from nxdi_gptoss_fp8.convert import convert, mxfp4, non_expert_names, open_source
from nxdi_gptoss_fp8.convert.kinds import hf_mxfp4
from nxdi_gptoss_fp8.convert.source import FINGERPRINT_FIELDS, provenance_fingerprint
from nxdi_gptoss_fp8.errors import ConversionError
from nxdi_gptoss_fp8.padding import TARGETS
from nxdi_gptoss_fp8.synthetic.sources import (
    SOURCE_BF16,
    SOURCE_COMPRESSED_TENSORS,
    SOURCE_DIMS,
    SOURCE_MXFP4,
    load_source,
    make_compressed_tensors_source,
    make_source,
    source_config,
    source_tensors,
    write_source,
)
from nxdi_gptoss_fp8.synthetic.tiny import make_tiny
from nxdi_gptoss_fp8.validate.pipeline import preflight

REPO = Path(__file__).resolve().parent.parent
PADDINGS = [pytest.param((None, None), id="unpadded"), pytest.param((96, 128), id="padded")]


def load_output(out: Path) -> dict[str, torch.Tensor]:
    index = json.loads((out / fmt.INDEX_FILE).read_text())
    tensors: dict[str, torch.Tensor] = {}
    for shard in sorted(set(index["weight_map"].values())):
        tensors.update(load_file(str(out / shard)))
    return tensors


def reference_experts(source: dict[str, torch.Tensor], kind: str, layer: int, hp: int, ip: int) -> dict[str, torch.Tensor]:
    """The expected dequantized experts, the NxDI way (decode, de-interleave rows, cat, transpose, pad)."""
    prefix = f"model.layers.{layer}.mlp.experts."
    if kind == SOURCE_MXFP4:
        gate_up = mxfp4.decode(source[prefix + "gate_up_proj_blocks"], source[prefix + "gate_up_proj_scales"])
        down = mxfp4.decode(source[prefix + "down_proj_blocks"], source[prefix + "down_proj_scales"])
    else:
        gate_up = source[prefix + "gate_up_proj"].float().transpose(1, 2)  # → [E, 2I, H]
        down = source[prefix + "down_proj"].float().transpose(1, 2)  # → [E, H, I]
    experts, two_i, h = gate_up.shape
    i = two_i // 2
    chunked = torch.zeros((experts, 2 * ip, hp))
    chunked[:, :i, :h] = gate_up[:, 0::2]
    chunked[:, ip:ip + i, :h] = gate_up[:, 1::2]
    padded_down = torch.zeros((experts, hp, ip))
    padded_down[:, :h, :i] = down
    return {fmt.GATE_UP: chunked.transpose(1, 2), fmt.DOWN: padded_down.transpose(1, 2)}


def dequantized(tensors: dict[str, torch.Tensor], layer: int, proj: str) -> torch.Tensor:
    prefix = f"layers.{layer}.{proj}"
    return tensors[prefix + ".weight"].float() * tensors[prefix + ".scale"]


def tree_digest(root: Path) -> dict[str, str]:
    return {str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(root.rglob("*")) if p.is_file()}


@pytest.fixture(scope="module")
def mxfp4_source(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_source(tmp_path_factory.mktemp("src") / "mxfp4", SOURCE_MXFP4)


@pytest.fixture(scope="module")
def bf16_source(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_source(tmp_path_factory.mktemp("src") / "bf16", SOURCE_BF16)


# --------------------------------------------------------------------------- values and layout


@pytest.mark.parametrize("rows_per_pass", [1024, 16], ids=["one-pass", "many-passes"])
@pytest.mark.parametrize("padding", PADDINGS)
def test_mxfp4_round_trip_is_exact(mxfp4_source: Path, tmp_path: Path, padding: tuple, rows_per_pass: int,
                                   monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(hf_mxfp4, "ENCODE_ROWS", rows_per_pass)
    hp, ip = padding
    report = convert(mxfp4_source, tmp_path / "out", padded_hidden_size=hp, padded_intermediate_size=ip,
                     max_shard_size="40KB", progress=False)
    hp, ip = hp or SOURCE_DIMS.hidden_size, ip or SOURCE_DIMS.intermediate_size
    checked = preflight(tmp_path / "out", allow_custom_model=True, deep=True, verify_checksums=True)
    assert checked.ok, checked.render_text()
    assert report.exact and report.inexact_values == 0
    assert report.fp8_values == 2 * 3 * SOURCE_DIMS.num_local_experts * SOURCE_DIMS.hidden_size * SOURCE_DIMS.intermediate_size
    out, source = load_output(tmp_path / "out"), load_source(mxfp4_source)
    for layer in range(SOURCE_DIMS.num_hidden_layers):
        expected = reference_experts(source, SOURCE_MXFP4, layer, hp, ip)
        for proj in (fmt.GATE_UP, fmt.DOWN):
            assert torch.equal(dequantized(out, layer, proj), expected[proj]), (layer, proj)
            scale = out[f"layers.{layer}.{proj}.scale"]
            mantissa, _ = torch.frexp(scale)
            assert bool((mantissa == 0.5).all()), "MXFP4 scales are powers of two"
            weight = out[f"layers.{layer}.{proj}.weight"].view(torch.uint8)
            assert not bool(((weight & 0x78) == 0x78).any())


def test_known_values_land_where_nxdi_puts_them(tmp_path: Path) -> None:
    """Source row 0 (gate 0) and row 1 (up 0), first byte 0x21: elements 0.5 and 1.0."""
    tensors = source_tensors(SOURCE_DIMS, SOURCE_MXFP4)
    blocks = tensors["model.layers.0.mlp.experts.gate_up_proj_blocks"]
    scales = tensors["model.layers.0.mlp.experts.gate_up_proj_scales"]
    blocks[0, :2] = 0
    blocks[0, 0, 0, 0], blocks[0, 1, 0, 0] = 0x21, 0x43  # gate: 0.5, 1.0; up: 1.5, 2.0
    scales[0, :2] = 127
    down_blocks = tensors["model.layers.0.mlp.experts.down_proj_blocks"]
    down_blocks[0, 5] = 0
    down_blocks[0, 5, 0, 0] = 0x7F  # down row (output channel) 5: elements 0 and 1 are -6.0 and 6.0
    tensors["model.layers.0.mlp.experts.down_proj_scales"][0, 5] = 128
    src = write_source(tmp_path / "src", tensors, source_config(SOURCE_DIMS, SOURCE_MXFP4))
    convert(src, tmp_path / "out", padded_intermediate_size=128, progress=False)
    out = load_output(tmp_path / "out")
    gate_up = dequantized(out, 0, fmt.GATE_UP)[0]  # [H, 2I']
    assert gate_up[:3, 0].tolist() == [0.5, 1.0, 0.0]
    assert gate_up[:3, 128].tolist() == [1.5, 2.0, 0.0]  # up starts at I' = 128
    down = dequantized(out, 0, fmt.DOWN)[0]  # [I', H]
    assert down[:3, 5].tolist() == [-12.0, 12.0, 0.0]


@pytest.mark.parametrize("padding", PADDINGS)
def test_bf16_errors_stay_within_the_bound(bf16_source: Path, tmp_path: Path, padding: tuple) -> None:
    hp, ip = padding
    report = convert(bf16_source, tmp_path / "out", padded_hidden_size=hp, padded_intermediate_size=ip, progress=False)
    hp, ip = hp or SOURCE_DIMS.hidden_size, ip or SOURCE_DIMS.intermediate_size
    assert report.fp8_values == 2 * 3 * SOURCE_DIMS.num_local_experts * SOURCE_DIMS.hidden_size * SOURCE_DIMS.intermediate_size
    assert preflight(tmp_path / "out", allow_custom_model=True).ok
    out, source = load_output(tmp_path / "out"), load_source(bf16_source)
    worst = 0.0
    for layer in range(SOURCE_DIMS.num_hidden_layers):
        expected = reference_experts(source, SOURCE_BF16, layer, hp, ip)
        for proj in (fmt.GATE_UP, fmt.DOWN):
            got, want = dequantized(out, layer, proj).double(), expected[proj].double()
            scale = out[f"layers.{layer}.{proj}.scale"].double()
            bound = torch.maximum(2.0**-4 * want.abs(), 2.0**-10 * scale.expand_as(want)) * (1 + 2.0**-16)
            assert bool(((got - want).abs() <= bound).all())
            assert bool((got[want == 0] == 0).all()), "padding and zeros stay zero"
            kept = (want != 0) & (got != 0)  # flushed values are counted apart, not as relative error 1
            worst = max(worst, float(((got - want).abs()[kept] / want.abs()[kept]).max()))
            stats = next(s for s in report.experts if s.name == f"layers.{layer}.{proj}.weight")
            assert stats.mean_rel_error is not None and 0 < stats.mean_rel_error < 2.0**-4
    assert report.max_rel_error == pytest.approx(worst, rel=1e-5)


@pytest.mark.parametrize("kind", [SOURCE_MXFP4, SOURCE_BF16])
def test_non_expert_tensors_are_renamed_padded_and_bit_exact(kind: str, mxfp4_source: Path, bf16_source: Path,
                                                             tmp_path: Path) -> None:
    src = mxfp4_source if kind == SOURCE_MXFP4 else bf16_source
    convert(src, tmp_path / "out", padded_hidden_size=96, padded_intermediate_size=128, progress=False)
    out, source = load_output(tmp_path / "out"), load_source(src)
    renames = non_expert_names(SOURCE_DIMS)
    assert renames["model.layers.1.self_attn.sinks"] == "layers.1.self_attn.learned_sinks.sink"
    assert renames["model.layers.0.mlp.router.bias"] == "layers.0.feed_forward.moe.router.linear_router.bias"
    for hf_name, name in renames.items():
        want = source[hf_name].to(torch.bfloat16)
        got = out[name]
        assert got.dtype == torch.bfloat16
        assert torch.equal(got[tuple(slice(0, n) for n in want.shape)], want), name
        rest = got.clone()
        rest[tuple(slice(0, n) for n in want.shape)] = 0
        assert not bool(rest.any()), f"{name}: padding is zero"
    # o_proj pads its rows (H is its output dim), q/k/v pad their columns
    assert out["layers.0.self_attn.o_proj.weight"].shape == (96, 64)
    assert out["layers.0.self_attn.q_proj.weight"].shape == (64, 96)
    prefix = "model.layers.0.mlp.experts."
    bias = out[f"layers.0.{fmt.GATE_UP}.bias"]
    assert torch.equal(bias[:, :96], source[prefix + "gate_up_proj_bias"][:, 0::2])
    assert torch.equal(bias[:, 128:224], source[prefix + "gate_up_proj_bias"][:, 1::2])
    assert not bool(bias[:, 96:128].any()) and not bool(bias[:, 224:].any())
    assert torch.equal(out[f"layers.0.{fmt.DOWN}.bias"][:, :64], source[prefix + "down_proj_bias"])


def test_inexact_values_are_counted(tmp_path: Path) -> None:
    src = make_source(tmp_path / "src", SOURCE_MXFP4, scale_range=(90, 130), seed=4)
    report = convert(src, tmp_path / "out", progress=False)
    out, source = load_output(tmp_path / "out"), load_source(src)
    wrong, flushed, worst = 0, 0, 0.0
    for layer in range(SOURCE_DIMS.num_hidden_layers):
        expected = reference_experts(source, SOURCE_MXFP4, layer, 64, 96)
        for proj in (fmt.GATE_UP, fmt.DOWN):
            got, want = dequantized(out, layer, proj).double(), expected[proj].double()
            mismatch = got != want
            wrong += int(mismatch.sum())
            flushed += int((mismatch & (got == 0)).sum())
            rounded = mismatch & (got != 0)
            if bool(rounded.any()):
                worst = max(worst, float(((got - want).abs() / want.abs())[rounded].max()))
    assert wrong > 0 and report.inexact_values == wrong and report.flushed_to_zero == flushed > 0
    assert report.max_rel_error == pytest.approx(worst) and worst < 1.0
    text = report.render_text()
    assert f"{flushed:,} flushed to zero" in text and "relative error 1 " not in text
    metadata = json.loads((tmp_path / "out" / fmt.INDEX_FILE).read_text())["metadata"]
    assert metadata["source"]["exactness"]["inexact_values"] == wrong


def test_config_is_rewritten_and_provenance_recorded(mxfp4_source: Path, tmp_path: Path) -> None:
    convert(mxfp4_source, tmp_path / "out", progress=False)
    config = json.loads((tmp_path / "out" / fmt.CONFIG_FILE).read_text())
    original = json.loads((mxfp4_source / fmt.CONFIG_FILE).read_text())
    assert config["quantization_config"]["quant_method"] == fmt.QUANT_METHOD
    assert config["rope_scaling"] == original["rope_scaling"]
    assert config["transformers_version"] == original["transformers_version"]
    metadata = json.loads((tmp_path / "out" / fmt.INDEX_FILE).read_text())["metadata"]
    assert metadata["source"]["format"] == SOURCE_MXFP4
    assert set(metadata["source"]["fingerprint"]) == set(FINGERPRINT_FIELDS)
    assert set(metadata["shard_sha256"]) == set(json.loads((tmp_path / "out" / fmt.INDEX_FILE).read_text())["weight_map"].values())


def test_hf_cache_paths_give_repo_and_revision(tmp_path: Path) -> None:
    revision = "a" * 40
    src = make_source(tmp_path / "models--openai--gpt-oss-120b" / "snapshots" / revision, SOURCE_MXFP4)
    convert(src, tmp_path / "out", progress=False)
    source = json.loads((tmp_path / "out" / fmt.INDEX_FILE).read_text())["metadata"]["source"]
    assert (source["repo"], source["revision"]) == ("openai/gpt-oss-120b", revision)


def test_the_index_records_no_local_path_and_no_repo_from_name_or_path(mxfp4_source: Path, tmp_path: Path) -> None:
    """The output travels with an upload: the index names what identifies the source (its
    fingerprint, the Hub repo when known), and no file names where the source sat — config.json's
    ``_name_or_path`` (the source's path) is dropped, as transformers replaces it on load anyway."""
    config_path = mxfp4_source / fmt.CONFIG_FILE
    config = json.loads(config_path.read_text())
    config["_name_or_path"] = str(mxfp4_source)
    config_path.write_text(json.dumps(config))
    convert(mxfp4_source, tmp_path / "out", progress=False)
    raw = (tmp_path / "out" / fmt.INDEX_FILE).read_text()
    source = json.loads(raw)["metadata"]["source"]
    assert str(mxfp4_source) not in raw and str(tmp_path) not in raw
    assert "path" not in source and "repo" not in source
    for written in sorted((tmp_path / "out").rglob("*")):  # no file of the output names where the source sat
        if written.is_file():
            assert str(mxfp4_source).encode() not in written.read_bytes(), written.name
    assert "_name_or_path" not in json.loads((tmp_path / "out" / fmt.CONFIG_FILE).read_text())
    moved = tmp_path / "elsewhere"
    shutil.copytree(mxfp4_source, moved)
    assert open_source(moved).fingerprint() == source["fingerprint"]  # the same files anywhere


@pytest.mark.parametrize("change", ["config", "header", "data"])
def test_the_fingerprint_tells_each_part_of_another_source(mxfp4_source: Path, tmp_path: Path, change: str) -> None:
    before = open_source(mxfp4_source).fingerprint()
    other = tmp_path / "other"
    shutil.copytree(mxfp4_source, other)
    shard = sorted(other.glob("*.safetensors"))[0]
    if change == "config":
        (other / fmt.CONFIG_FILE).write_text((other / fmt.CONFIG_FILE).read_text() + "\n")
    elif change == "header":
        raw = shard.read_bytes()
        length = int.from_bytes(raw[:8], "little")
        text = (b"{ " + raw[9:8 + length]).ljust(length + 8)  # the same JSON in other bytes
        shard.write_bytes(len(text).to_bytes(8, "little") + text + raw[8 + length:])
    else:
        raw = bytearray(shard.read_bytes())
        start = 8 + int.from_bytes(raw[:8], "little")
        raw[start + (len(raw) - start) // 16] ^= 0x01  # the middle of the first sampled block
        shard.write_bytes(bytes(raw))
    after = provenance_fingerprint(str(other), sorted(str(p) for p in other.glob("*.safetensors")))
    part = {"config": "config_sha256", "header": "headers_sha256", "data": "samples_sha256"}[change]
    assert [name for name in FINGERPRINT_FIELDS if before[name] != after[name]] == [part]


def test_a_config_above_the_json_limit_is_refused_not_fingerprinted_in_part(mxfp4_source: Path, tmp_path: Path,
                                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    other = tmp_path / "other"
    shutil.copytree(mxfp4_source, other)
    size = (other / fmt.CONFIG_FILE).stat().st_size
    monkeypatch.setattr("nxdi_gptoss_fp8.convert.source.MAX_JSON_FILE_BYTES", size - 1)
    with pytest.raises(ConversionError, match=f"cannot fingerprint the source at .*{size:,} bytes, above the"):
        provenance_fingerprint(str(other), sorted(str(p) for p in other.glob("*.safetensors")))


# --------------------------------------------------------------------------- wrong sources


def _rewrite_shard(src: Path, edit) -> None:  # type: ignore[no-untyped-def]
    index = json.loads((src / fmt.INDEX_FILE).read_text())
    shard = sorted(set(index["weight_map"].values()))[0]
    tensors = dict(load_file(str(src / shard)))
    edit(tensors, index, shard)
    save_file(tensors, str(src / shard))
    (src / fmt.INDEX_FILE).write_text(json.dumps(index))


def _drop_tensor(tensors, index, shard):  # type: ignore[no-untyped-def]
    name = sorted(tensors)[0]
    del tensors[name]
    del index["weight_map"][name]


def _add_tensor(tensors, index, shard):  # type: ignore[no-untyped-def]
    tensors["model.layers.0.mlp.extra"] = torch.zeros(2)
    index["weight_map"]["model.layers.0.mlp.extra"] = shard


def _nan_scale(tensors, index, shard):  # type: ignore[no-untyped-def]
    name = next(n for n in tensors if n.endswith("_scales"))
    tensors[name][0, 0, 0] = 255


def _config(src: Path, **changes: object) -> None:
    config = json.loads((src / fmt.CONFIG_FILE).read_text())
    for key, value in changes.items():
        if value is None:
            config.pop(key, None)
        else:
            config[key] = value
    (src / fmt.CONFIG_FILE).write_text(json.dumps(config))


def _legacy(src: Path) -> None:
    for path in src.glob("*.safetensors"):
        path.unlink()
    save_file({"block.0.mlp.mlp1_weight.blocks": torch.zeros(2, dtype=torch.uint8),
               "embedding.weight": torch.zeros(2)}, str(src / "model.safetensors"))
    (src / fmt.INDEX_FILE).unlink()


def _index_into_original(src: Path) -> None:
    index = json.loads((src / fmt.INDEX_FILE).read_text())
    name = sorted(index["weight_map"])[0]
    index["weight_map"][name] = "original/model.safetensors"
    (src / fmt.INDEX_FILE).write_text(json.dumps(index))


def _truncate(src: Path) -> None:
    shard = sorted(src.glob("model-*.safetensors"))[0]
    shard.write_bytes(shard.read_bytes()[:-100])


def _pickle_only(src: Path) -> None:
    for path in src.glob("*.safetensors"):
        path.unlink()
    (src / fmt.INDEX_FILE).unlink()
    (src / "pytorch_model.bin").write_bytes(b"\x80\x04not really a pickle")


WRONG_SOURCES = {
    "no_config": (lambda src: (src / fmt.CONFIG_FILE).unlink(), "has no config.json"),
    "not_gpt_oss": (lambda src: _config(src, model_type="llama"), "only GPT-OSS"),
    "bad_dimension": (lambda src: _config(src, hidden_size=64.0), "hidden_size"),
    "mxfp4_without_quant_config": (lambda src: _config(src, quantization_config=None), "quant_method is None"),
    "wrong_shapes_for_config": (lambda src: _config(src, intermediate_size=64), "expected U8"),
    "legacy_names": (_legacy, "original layout"),
    "index_into_original": (_index_into_original, "original/ set is never mixed"),
    "truncated_shard": (_truncate, "not a valid safetensors file"),
    "missing_tensor": (lambda src: _rewrite_shard(src, _drop_tensor), "lacks 1 tensor the config"),
    "extra_tensor": (lambda src: _rewrite_shard(src, _add_tensor), "does not"),
    "pickle_only": (_pickle_only, "found: config.json, original/, pytorch_model.bin"),
    "nan_scale": (lambda src: _rewrite_shard(src, _nan_scale), "scale byte 255"),
}


@pytest.mark.parametrize("case", sorted(WRONG_SOURCES))
def test_wrong_sources_are_refused_with_what_was_found(case: str, mxfp4_source: Path, tmp_path: Path) -> None:
    import shutil

    src = Path(shutil.copytree(mxfp4_source, tmp_path / "src"))
    mutate, message = WRONG_SOURCES[case]
    mutate(src)
    with pytest.raises(ConversionError, match=message.replace("(", r"\(").replace(")", r"\)")):
        convert(src, tmp_path / "out", progress=False)
    assert not (tmp_path / "out").exists()
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".out")]


def test_the_original_directory_itself_is_refused(mxfp4_source: Path, tmp_path: Path) -> None:
    with pytest.raises(ConversionError, match="point SRC at its parent"):
        convert(mxfp4_source / "original", tmp_path / "out", progress=False)


def test_dense_tensors_with_an_mxfp4_config_are_refused(bf16_source: Path, tmp_path: Path) -> None:
    import shutil

    src = Path(shutil.copytree(bf16_source, tmp_path / "src"))
    _config(src, quantization_config={"quant_method": "mxfp4"})
    with pytest.raises(ConversionError, match="tensors are dense"):
        convert(src, tmp_path / "out", progress=False)


def test_a_normalized_checkpoint_is_not_a_source(tmp_path: Path) -> None:
    tiny = make_tiny(tmp_path / "tiny")
    with pytest.raises(ConversionError, match="already a normalized FP8 checkpoint"):
        convert(tiny, tmp_path / "out", progress=False)


def test_a_file_is_not_a_source(tmp_path: Path) -> None:
    (tmp_path / "model.safetensors").write_bytes(b"")
    with pytest.raises(ConversionError, match="is not a directory"):
        convert(tmp_path / "model.safetensors", tmp_path / "out", progress=False)


def test_bad_padding_is_refused(mxfp4_source: Path, tmp_path: Path) -> None:
    with pytest.raises(ConversionError, match="not a multiple of 32"):
        convert(mxfp4_source, tmp_path / "out", padded_hidden_size=80, progress=False)


# --------------------------------------------------------------------------- output safety


def test_non_empty_output_needs_overwrite(mxfp4_source: Path, tmp_path: Path) -> None:
    out = tmp_path / "out"
    out.mkdir()
    (out / "keep.txt").write_text("mine")
    with pytest.raises(ConversionError, match="not empty"):
        convert(mxfp4_source, out, progress=False)
    assert (out / "keep.txt").read_text() == "mine"
    with pytest.raises(ConversionError, match="does not look like an earlier output"):
        convert(mxfp4_source, out, overwrite=True, progress=False)  # a user's files are never deleted
    assert [p.name for p in out.iterdir()] == ["keep.txt"]
    (out / "keep.txt").unlink()
    convert(mxfp4_source, out, progress=False)
    convert(mxfp4_source, out, overwrite=True, progress=False, max_shard_size="40KB")  # an earlier output of ours
    assert preflight(out, allow_custom_model=True).ok
    assert not [p for p in out.iterdir() if p.name.startswith(".")] and not [p for p in tmp_path.iterdir() if p.name != "out"]


@pytest.mark.parametrize("where", ["same", "inside"])
def test_output_may_not_overlap_the_source(mxfp4_source: Path, where: str) -> None:
    out = mxfp4_source if where == "same" else mxfp4_source / "fp8"
    with pytest.raises(ConversionError, match="overlaps SRC"):
        convert(mxfp4_source, out, overwrite=True, progress=False)
    assert not (mxfp4_source / "fp8").exists()


def test_source_is_never_modified_and_pickles_never_opened(mxfp4_source: Path, tmp_path: Path,
                                                            monkeypatch: pytest.MonkeyPatch) -> None:
    before = tree_digest(mxfp4_source)

    def refuse(*args: object, **kwargs: object) -> None:
        raise AssertionError("torch.load must never be called")

    monkeypatch.setattr(torch, "load", refuse)
    convert(mxfp4_source, tmp_path / "out", progress=False)
    from nxdi_gptoss_fp8.convert.verify import verify_conversion

    assert verify_conversion(tmp_path / "out", mxfp4_source).ok
    assert tree_digest(mxfp4_source) == before


def test_reconversion_is_byte_identical(mxfp4_source: Path, tmp_path: Path) -> None:
    convert(mxfp4_source, tmp_path / "a", max_shard_size="40KB", progress=False)
    convert(mxfp4_source, tmp_path / "b", max_shard_size="40KB", progress=False)
    assert tree_digest(tmp_path / "a") == tree_digest(tmp_path / "b")
    assert len([p for p in (tmp_path / "a").iterdir() if p.suffix == ".safetensors"]) > 1


def test_an_exception_mid_way_leaves_nothing(mxfp4_source: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    calls = {"n": 0}
    real = hf_mxfp4.scale_row  # every expert's last step, on either encoder path

    def failing(*args, **kwargs):  # type: ignore[no-untyped-def]
        calls["n"] += 1
        if calls["n"] == 5:
            raise RuntimeError("disk on fire")
        return real(*args, **kwargs)

    monkeypatch.setattr(hf_mxfp4, "scale_row", failing)
    with pytest.raises(RuntimeError, match="disk on fire"):
        convert(mxfp4_source, tmp_path / "out", progress=False)
    assert list(tmp_path.iterdir()) == []


def test_a_killed_conversion_leaves_no_valid_output(mxfp4_source: Path, tmp_path: Path) -> None:
    script = textwrap.dedent(f"""
        import os, signal
        from nxdi_gptoss_fp8 import convert as conversion
        from nxdi_gptoss_fp8.convert.kinds import hf_mxfp4
        real = hf_mxfp4._projection
        calls = []
        def dying(*args, **kwargs):
            calls.append(1)
            if len(calls) == 3:
                os.kill(os.getpid(), signal.SIGKILL)
            return real(*args, **kwargs)
        hf_mxfp4._projection = dying
        conversion.convert({str(mxfp4_source)!r}, {str(tmp_path / 'out')!r}, progress=False)
    """)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")])}
    done = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, timeout=120, check=False)
    assert done.returncode == -signal.SIGKILL, done.stderr.decode()
    assert not (tmp_path / "out").exists()
    assert not preflight(tmp_path / "out", allow_custom_model=True).ok
    leftovers = [p for p in tmp_path.iterdir() if p.name.startswith(".out.partial-")]
    assert leftovers, "the kill happened mid-way, leaving the hidden temporary directory"
    for partial in leftovers:
        assert not (partial / fmt.INDEX_FILE).exists()
        assert not preflight(partial, allow_custom_model=True).ok


def test_progress_bar_stays_off_without_a_terminal(mxfp4_source: Path, tmp_path: Path,
                                                   capsys: pytest.CaptureFixture[str]) -> None:
    convert(mxfp4_source, tmp_path / "out", progress=True)
    assert capsys.readouterr().err == ""


def test_progress_bar_on_a_terminal_shows_layers_bytes_and_rate(mxfp4_source: Path, tmp_path: Path,
                                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    import io

    class Terminal(io.StringIO):
        def isatty(self) -> bool:
            return True

    terminal = Terminal()
    monkeypatch.setattr(sys, "stderr", terminal)
    convert(mxfp4_source, tmp_path / "out", progress=True)
    shown = terminal.getvalue()
    assert f"{SOURCE_DIMS.num_hidden_layers}/{SOURCE_DIMS.num_hidden_layers} layers" in shown
    assert "100%" in shown and "B/s" in shown  # bytes done of the total, and the rate


# --------------------------------------------------------------------------- CLI


def test_cli_convert(mxfp4_source: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code = main(["convert", str(mxfp4_source), str(tmp_path / "out"), "--padded-hidden-size", "96",
                 "--max-shard-size", "40KB"])
    captured = capsys.readouterr()
    assert code == 0, captured.err
    assert "expert values exact" in captured.out
    assert preflight(tmp_path / "out", allow_custom_model=True).ok
    code = main(["convert", str(mxfp4_source), str(tmp_path / "out")])
    captured = capsys.readouterr()
    assert code == 2 and "--overwrite" in captured.err and "Traceback" not in captured.err


@pytest.mark.parametrize("argv, message", [
    (["--padded-hidden-size", "70"], "not a multiple of 32"),
    (["--max-shard-size", "lots"], "cannot read a size"),
])
def test_cli_convert_usage_errors(mxfp4_source: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                  argv: list[str], message: str) -> None:
    code = main(["convert", str(mxfp4_source), str(tmp_path / "out"), *argv])
    captured = capsys.readouterr()
    assert code == 2
    assert message in captured.err and captured.err.count("\n") == 1
    assert not (tmp_path / "out").exists()


def test_cli_convert_wrong_source(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "src").mkdir()
    code = main(["convert", str(tmp_path / "src"), str(tmp_path / "out")])
    captured = capsys.readouterr()
    assert code == 2 and "has no config.json" in captured.err and "Traceback" not in captured.err


# --------------------------------------------------------------------------- NxDI conformance


@pytest.mark.nxdi
@pytest.mark.parametrize("padding", PADDINGS)
def test_matches_nxdis_own_hf_conversion(mxfp4_source: Path, tmp_path: Path, padding: tuple,
                                        monkeypatch: pytest.MonkeyPatch) -> None:
    """Dequantized, our output equals what NxDI's HF path (pad, MXFP4→BF16, de-interleave,
    transpose, rename) produces from the same source, bit for bit. Needs NxDI or NXDI_SRC."""
    import contextlib
    import importlib.util
    import types

    source_tree = os.environ.get("NXDI_SRC")
    if importlib.util.find_spec("neuronx_distributed_inference") is not None and not source_tree:
        context: contextlib.AbstractContextManager[None] = contextlib.nullcontext()
    elif source_tree:
        from nxdi_standin import neuron_stubs

        context = neuron_stubs.installed(os.path.join(source_tree, "src"))
    else:
        pytest.skip("NxDI is not installed and NXDI_SRC is not set")
    hp, ip = padding
    convert(mxfp4_source, tmp_path / "out", padded_hidden_size=hp, padded_intermediate_size=ip, progress=False)
    hp, ip = hp or SOURCE_DIMS.hidden_size, ip or SOURCE_DIMS.intermediate_size
    out = load_output(tmp_path / "out")
    state = {k.removeprefix("model."): v.clone() for k, v in load_source(mxfp4_source).items()}
    monkeypatch.setenv("NEURON_PLATFORM_TARGET_OVERRIDE", os.environ.get("NEURON_PLATFORM_TARGET_OVERRIDE", "trn2"))
    with context:
        modeling = __import__("neuronx_distributed_inference.models.gpt_oss.modeling_gpt_oss",
                              fromlist=["NeuronGptOssForCausalLM"])
        config = types.SimpleNamespace(hidden_size=hp, original_hidden_size=SOURCE_DIMS.hidden_size,
                                       intermediate_size=ip, original_intermediate_size=SOURCE_DIMS.intermediate_size)
        modeling.NeuronGptOssForCausalLM._pad_hf_state_dict(state, config)
        for layer in range(SOURCE_DIMS.num_hidden_layers):
            prefix = f"layers.{layer}."
            for proj, ours in (("gate_up_proj", fmt.GATE_UP), ("down_proj", fmt.DOWN)):
                dense = modeling.convert_moe_packed_tensors(state[f"{prefix}mlp.experts.{proj}_blocks"],
                                                            state[f"{prefix}mlp.experts.{proj}_scales"])
                bias = state[f"{prefix}mlp.experts.{proj}_bias"]
                if proj == "gate_up_proj":
                    weight, bias = modeling.convert_gate_up_proj(dense), modeling.convert_gate_up_proj(bias, is_bias=True)
                else:
                    weight = dense.transpose(1, 2)
                assert torch.equal(dequantized(out, layer, ours).to(torch.bfloat16), weight), (layer, proj)
                assert torch.equal(out[f"{prefix}{ours}.bias"], bias.to(torch.bfloat16)), (layer, proj)
    for hf_name, name in non_expert_names(SOURCE_DIMS).items():
        assert torch.equal(out[name], state[hf_name.removeprefix("model.")].to(torch.bfloat16)), name


# --------------------------------------------------------------------------- byte-identical to 0.3.0

IDENTITY_DIMS = fmt.ModelDims(num_hidden_layers=2, num_local_experts=4, hidden_size=256, intermediate_size=192,
                              head_dim=16, num_attention_heads=4, num_key_value_heads=2, vocab_size=40,
                              num_experts_per_tok=2, sliding_window=8)
# SHA-256 of the one output shard 0.3.0 wrote for each source below (every worker count alike)
SHARD_SHA256_0_3_0 = {
    "bf16-tiny": "a3ed192f4edcd961bd3ad7bfa81765c74dedb42452f35be786ee4f8557b1aa9b",
    "bf16-padded": "8804f07b16a8b7acfbf62b4928583276a678cf9241dc4de3eda1286ec2678550",
    "bf16-edge": "56da9db216604b6660b7fa4161f6f425d5ad4b88ed5e7f564f1d81c6921520e9",
    "mxfp4-tiny": "ac5488b4051438eda59685bbc911747fa86d68d2e4b971372f05a096e5c6fa0a",
    "mxfp4-wide-scales": "cc1bbc1d51e7a7115f08590a7ee6aa7429cc6f7cdc458f8af2cd8746a0157560",
    "ct-tiny": "61ab00704454e3afe0aa423c53f3b7786707b655f8fe44a41eb372d4a9a40e4b",
    "ct-halves": "52f278e4113c99ff127dfe873fca798f66abab099e3c71f90103ef5b36c8a42b",
}
PADDED = {"padded_hidden_size": 288, "padded_intermediate_size": 224}


def _bf16_edge_source(root: Path) -> Path:
    """BF16 experts with zeros, an all-zero channel, subnormal-to-large columns and 1e30 rows."""
    tensors = source_tensors(IDENTITY_DIMS, SOURCE_BF16, seed=3)
    generator = torch.Generator().manual_seed(103)
    for layer in range(IDENTITY_DIMS.num_hidden_layers):
        for short in ("gate_up_proj", "down_proj"):
            name = f"model.layers.{layer}.mlp.experts.{short}"
            weight = tensors[name].float()
            weight[0, :3] = 0
            weight[1] *= torch.logspace(-45, 2, weight.shape[-1], base=2.0)
            weight[2, :, 5] = 0
            weight[2, 7, :] = torch.randn(weight.shape[-1], generator=generator) * 1e30
            weight[3].view(-1)[::7] = 2.0**-130
            tensors[name] = weight.to(torch.bfloat16)
    return write_source(root, tensors, source_config(IDENTITY_DIMS, SOURCE_BF16), shards=2)


IDENTITY_SOURCES = {
    "bf16-tiny": (lambda root: make_source(root, SOURCE_BF16, seed=1), {}),
    "bf16-padded": (lambda root: make_source(root, SOURCE_BF16, dims=IDENTITY_DIMS, seed=2), PADDED),
    "bf16-edge": (_bf16_edge_source, {}),
    "mxfp4-tiny": (lambda root: make_source(root, SOURCE_MXFP4, seed=1), {}),
    "mxfp4-wide-scales": (lambda root: make_source(root, SOURCE_MXFP4, dims=IDENTITY_DIMS, seed=4, scale_range=(90, 160)),
                          {}),
    "ct-tiny": (lambda root: make_source(root, SOURCE_COMPRESSED_TENSORS, seed=1), {}),
    "ct-halves": (lambda root: make_compressed_tensors_source(root, dims=IDENTITY_DIMS, seed=3, split="halves",
                                                              transformers_version="5.0.0"), {"gate_up_split": "halves"}),
}


@pytest.mark.parametrize("workers", [1, 2, 4], ids=["one-lane", "two-lanes", "two-processes"])
@pytest.mark.parametrize("case", list(IDENTITY_SOURCES))
def test_output_is_byte_identical_to_0_3_0(case: str, workers: int, tmp_path_factory: pytest.TempPathFactory) -> None:
    if workers == 4 and case.endswith("-tiny"):
        pytest.skip("the other sources cover the worker processes (each start costs seconds)")
    make, options = IDENTITY_SOURCES[case]
    src = tmp_path_factory.getbasetemp() / "identity" / case
    if not src.exists():
        make(src)
    out = tmp_path_factory.mktemp("out") / case
    convert(str(src), str(out), progress=False, workers=workers, **options)
    shards = {name: digest for name, digest in tree_digest(out).items() if name.endswith(".safetensors")}
    assert shards == {"model-00001-of-00001.safetensors": SHARD_SHA256_0_3_0[case]}, (
        "the output differs from 0.3.0's (if the synthetic sources changed on purpose, recompute the digests with 0.3.0)")


@pytest.mark.parametrize(("workers", "threads"), [(1, 2), (3, 3)])
def test_shards_are_hashed_by_as_many_threads_as_workers(mxfp4_source: Path, tmp_path: Path, workers: int, threads: int,
                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    from nxdi_gptoss_fp8 import writer

    seen: list[int] = []
    real = writer.BackgroundHasher

    def counting(workers: int, **kwargs):  # type: ignore[no-untyped-def]
        seen.append(workers)
        return real(workers, **kwargs)

    monkeypatch.setattr(writer, "BackgroundHasher", counting)
    convert(mxfp4_source, tmp_path / "out", progress=False, workers=workers)
    assert seen == [threads]


# --------------------------------------------------------------------------- named targets


def test_the_nki_moe_target_pads_records_and_is_named(mxfp4_source: Path, tmp_path: Path,
                                                      capsys: pytest.CaptureFixture[str]) -> None:
    target = TARGETS["nki-moe"]
    report = convert(mxfp4_source, tmp_path / "out", target="nki-moe", progress=False)
    assert (report.padded_hidden_size, report.padded_intermediate_size, report.target) == (3072, 3072, "nki-moe")
    metadata = json.loads((tmp_path / "out" / fmt.INDEX_FILE).read_text())["metadata"]
    assert metadata["target"] == "nki-moe" and metadata["padded_hidden_size"] == metadata["padded_intermediate_size"] == 3072
    checked = preflight(tmp_path / "out", allow_custom_model=True)
    assert checked.ok and checked.target == "nki-moe" and "target nki-moe" in checked.render_text()
    card = (tmp_path / "out" / "README.md").read_text()
    assert f"| target | `nki-moe`: {target.purpose}; {target.status} |" in card
    assert main(["inspect", str(tmp_path / "out"), "--allow-custom-model"]) == 0
    shown = capsys.readouterr().out
    assert "metadata.target = 'nki-moe'" in shown and "no released vLLM Neuron plugin" in shown
    assert "target      nki-moe" in shown


@pytest.mark.parametrize(("sizes", "refused"), [
    ({"padded_hidden_size": 2880 + 64}, True), ({"padded_intermediate_size": 96}, True),
    ({"padded_hidden_size": 3072, "padded_intermediate_size": 3072}, False),
])
def test_padded_sizes_beside_a_target_must_be_the_targets(mxfp4_source: Path, tmp_path: Path,
                                                          capsys: pytest.CaptureFixture[str],
                                                          sizes: dict[str, int], refused: bool) -> None:
    from nxdi_gptoss_fp8.convert import plan

    if not refused:
        assert plan(mxfp4_source, tmp_path / "out", target="nki-moe", **sizes).target == "nki-moe"
        return
    with pytest.raises(ConversionError, match="contradicts it: drop one of the two"):
        plan(mxfp4_source, tmp_path / "out", target="nki-moe", **sizes)
    options = [f"--{key.replace('_', '-')}={value}" for key, value in sizes.items()]
    assert main(["convert", str(mxfp4_source), str(tmp_path / "out"), "--target", "nki-moe", *options]) == 2
    error = capsys.readouterr().err
    assert error.count("\n") == 1 and "target nki-moe sets" in error and not (tmp_path / "out").exists()


def test_the_dry_run_says_what_the_target_is_for(mxfp4_source: Path, tmp_path: Path,
                                                 capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["convert", str(mxfp4_source), str(tmp_path / "out"), "--target", "nki-moe", "--dry-run"]) == 0
    text = capsys.readouterr().out
    assert "H'=3072, I'=3072" in text and "target nki-moe: " + TARGETS["nki-moe"].purpose in text
    assert "no released vLLM Neuron plugin loads" in text and not (tmp_path / "out").exists()
