"""The zero-copy loader: views into private mappings of the shard files, the same bytes as
safetensors reads, derived entries per NeuronConfig, the cast rule, and the refusal of shards
that changed after the preflight."""

from __future__ import annotations

import gc
import hashlib
import os
import sys
from collections.abc import Callable
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

sys.path.insert(0, os.path.dirname(__file__))

import ckpt_edit

from nxdi_gptoss_fp8 import format as fmt
from nxdi_gptoss_fp8 import loader
from nxdi_gptoss_fp8.checks import preflight
from nxdi_gptoss_fp8.errors import IntegrityError, PreflightError
from nxdi_gptoss_fp8.tiny import make_tiny

MIB = 1 << 20


def file_mappings() -> dict[str, list[tuple[int, int]]]:
    """Address ranges of file-backed mappings of this process, by file path (/proc/self/maps)."""
    ranges: dict[str, list[tuple[int, int]]] = {}
    with open("/proc/self/maps") as handle:
        for line in handle:
            parts = line.split(maxsplit=5)
            if len(parts) == 6 and parts[5].startswith("/"):
                start, end = (int(x, 16) for x in parts[0].split("-"))
                ranges.setdefault(parts[5].strip(), []).append((start, end))
    return ranges


def rss_anon() -> int:
    with open("/proc/self/status") as handle:
        for line in handle:
            if line.startswith("RssAnon:"):
                return int(line.split()[1]) * 1024
    raise AssertionError("no RssAnon in /proc/self/status")


def all_tensors(ckpt: Path) -> dict[str, torch.Tensor]:
    out: dict[str, torch.Tensor] = {}
    for shard in ckpt_edit.shards(ckpt):
        out.update(load_file(str(ckpt / shard)))
    return out


def raw_bytes(tensor: torch.Tensor) -> bytes:
    return tensor.contiguous().reshape(-1).view(torch.uint8).numpy().tobytes()


def test_every_stored_tensor_is_a_view_into_its_own_shard(tiny_template: Path) -> None:
    loaded = loader.load_checkpoint(tiny_template, allow_custom_model=True)
    maps = file_mappings()
    weight_map = ckpt_edit.read_json(tiny_template / fmt.INDEX_FILE)["weight_map"]
    reference = all_tensors(tiny_template)
    assert set(loaded.mapped) == set(reference)
    for name in loaded.mapped:
        tensor = loaded.state_dict[name]
        path = os.path.realpath(tiny_template / weight_map[name])
        start, end = tensor.data_ptr(), tensor.data_ptr() + tensor.numel() * tensor.element_size()
        assert any(lo <= start and end <= hi for lo, hi in maps[path]), f"{name} is not inside a mapping of {path}"
        assert tensor.dtype == reference[name].dtype and raw_bytes(tensor) == raw_bytes(reference[name]), name
        assert tensor.is_contiguous()


def test_loading_does_not_grow_anonymous_memory(tmp_path: Path) -> None:
    dims = fmt.ModelDims(num_hidden_layers=2, num_local_experts=8, hidden_size=1024, intermediate_size=1024, head_dim=64,
                         num_attention_heads=8, num_key_value_heads=2, vocab_size=2048, num_experts_per_tok=2, sliding_window=8)
    ckpt = make_tiny(tmp_path / "mid", dims=dims, max_shard_size=40_000_000)
    total = sum(os.path.getsize(os.path.join(ckpt, f)) for f in os.listdir(ckpt))
    assert total > 60 * MIB
    gc.collect()
    before = rss_anon()
    loaded = loader.load_checkpoint(ckpt, allow_custom_model=True)
    for tensor in loaded.state_dict.values():  # read every byte once
        tensor.reshape(-1).view(torch.uint8).max() if tensor.numel() else None
    growth = rss_anon() - before
    assert loaded.copied_bytes < 64 * 1024
    assert growth < 8 * MIB, f"anonymous memory grew by {growth / MIB:.1f} MiB for {total / MIB:.0f} MiB of shards"


def test_mapping_is_copy_on_write_and_outlives_its_handles(tiny_checkpoint: Path) -> None:
    digests = {s: hashlib.sha256((tiny_checkpoint / s).read_bytes()).hexdigest() for s in ckpt_edit.shards(tiny_checkpoint)}
    state_dict = loader.load_state_dict(tiny_checkpoint, allow_custom_model=True)
    weight = state_dict[ckpt_edit.GATE_UP_WEIGHT]
    original = raw_bytes(weight)
    weight.view(torch.uint8).fill_(0x11)  # NxD's preshard hooks may write in place
    assert {s: hashlib.sha256((tiny_checkpoint / s).read_bytes()).hexdigest() for s in digests} == digests
    again = loader.load_state_dict(tiny_checkpoint, allow_custom_model=True)
    assert raw_bytes(again[ckpt_edit.GATE_UP_WEIGHT]) == original

    keep = again[ckpt_edit.DOWN_WEIGHT]
    expected = raw_bytes(keep)
    del again, state_dict, weight
    gc.collect()
    assert raw_bytes(keep) == expected  # the tensor keeps its mapping alive


def test_derived_entries_can_be_saved_by_nxd(tiny_template: Path) -> None:
    """NxD saves per-rank checkpoints with safetensors, which refuses tensors sharing storage."""
    options = {"tp_degree": 2, "fused_qkv": True, "vocab_parallel": True, "attention_dp_degree": 2, "lm_head_pad": True,
               "lm_head_pad_alignment_size": 3}
    state_dict = loader.load_state_dict(tiny_template, options_config(options), report=clean_report(tiny_template, options))
    save_file({k: v.contiguous() for k, v in state_dict.items()}, str(Path(tiny_template).parent / "saved.safetensors"))
    os.remove(Path(tiny_template).parent / "saved.safetensors")
    assert torch.equal(state_dict["layers.0.self_attn.tkg_learned_sinks.sink"], state_dict["layers.0.self_attn.learned_sinks.sink"])
    wqkv = state_dict["layers.1.self_attn.Wqkv.bias"]
    parts = [load_file(str(tiny_template / ckpt_edit.shard_of(tiny_template, f"layers.1.self_attn.{p}_proj.bias")))[f"layers.1.self_attn.{p}_proj.bias"] for p in "qkv"]
    assert torch.equal(wqkv, torch.cat(parts))


@pytest.mark.parametrize("adjacent", [True, False], ids=["written-by-us", "rewritten-by-safetensors"])
def test_fused_qkv_is_a_view_when_q_k_v_are_back_to_back(tiny_checkpoint: Path, adjacent: bool) -> None:
    """Our writer places q, k, v back to back, so Wqkv is a view of the file; a shard written
    in another order gets a concatenated copy with the same values."""
    layer1 = "layers.1.self_attn."
    shard = ckpt_edit.shard_of(tiny_checkpoint, f"{layer1}q_proj.weight")
    if not adjacent:
        ckpt_edit.edit_shard(tiny_checkpoint, shard, lambda tensors: None)  # safetensors orders by dtype, name
    reference = all_tensors(tiny_checkpoint)
    options = {"tp_degree": 2, "fused_qkv": True}
    loaded = loader.load_checkpoint(tiny_checkpoint, options_config(options), report=clean_report(tiny_checkpoint, options))
    maps = file_mappings()[os.path.realpath(tiny_checkpoint / shard)]
    for part in ("weight", "bias"):
        wqkv = loaded.state_dict[f"{layer1}Wqkv.{part}"]
        assert torch.equal(wqkv, torch.cat([reference[f"{layer1}{p}_proj.{part}"] for p in "qkv"]))
        inside = any(lo <= wqkv.data_ptr() < hi for lo, hi in maps)
        assert inside is adjacent
    layer1_qkv = sum(reference[f"{layer1}{p}_proj.{part}"].nbytes for p in "qkv" for part in ("weight", "bias"))
    assert (loaded.copied_bytes >= layer1_qkv) is not adjacent


def options_config(options: dict) -> dict:
    return {"quantized": True, "quantization_type": fmt.QUANTIZATION_TYPE, "quantization_dtype": fmt.QUANTIZATION_DTYPE,
            "modules_to_not_convert": ["lm_head", "self_attn"], **options}


def clean_report(ckpt: Path, options: dict):  # type: ignore[no-untyped-def]
    return preflight(ckpt, neuron_config=options_config(options), allow_custom_model=True).raise_if_failed()


@pytest.mark.parametrize(("vocab", "tp", "align", "lnc", "pad", "expected"), [
    (201088, 64, 1, 2, None, False),  # 201088 = 128 · 1571
    (201088, 64, 2, 2, None, True),
    (201088, 64, 2, 1, None, False),  # lm_head_pad defaults to lnc > 1
    (201088, 64, 2, 2, False, False),
    (128, 2, 3, 1, True, True),
    (128, 4, 1, 2, True, False),
])
def test_lm_head_padding_rule(vocab: int, tp: int, align: int, lnc: int, pad: bool | None, expected: bool) -> None:
    config = {"tp_degree": tp, "lm_head_pad_alignment_size": align, "logical_nc_config": lnc}
    if pad is not None:
        config["lm_head_pad"] = pad
    assert loader.RuntimeOptions.from_config(config).pads_lm_head(vocab) is expected


def test_options_follow_nxdi_defaults_and_cast_rule() -> None:
    options = loader.RuntimeOptions.from_config({"tp_degree": 4, "ep_degree": 2, "torch_dtype": "float16"})
    assert options.local_ranks_size == 8 and options.casts
    assert options.final_dtype("x.weight", torch.bfloat16) == torch.float16
    assert options.final_dtype("x.scale", torch.float32) == torch.float32
    assert options.final_dtype("x.weight", torch.float8_e4m3fn) == torch.float8_e4m3fn
    assert options.final_dtype("x.rank", torch.int32) == torch.int32
    assert not loader.RuntimeOptions.from_config({"torch_dtype": "float32"}).casts
    assert not loader.RuntimeOptions.from_config({"cast_type": "as-declared"}).casts


def test_a_float16_runtime_gets_float16_tensors_from_the_loader(tiny_template: Path) -> None:
    loaded = loader.load_checkpoint(tiny_template, {"torch_dtype": "float16"}, allow_custom_model=True,
                                    report=preflight(tiny_template, allow_custom_model=True))
    dtypes = {t.dtype for k, t in loaded.state_dict.items() if t.is_floating_point() and not k.endswith("scale")}
    assert dtypes == {torch.float16, torch.float8_e4m3fn}
    assert loaded.cast and all(loaded.state_dict[k].dtype == torch.float16 for k in loaded.cast)


def test_invalid_checkpoint_is_refused_before_mapping(tiny_checkpoint: Path) -> None:
    ckpt_edit.remove_tensor(tiny_checkpoint, ckpt_edit.DOWN_SCALE)
    before = set(file_mappings())
    with pytest.raises(PreflightError) as caught:
        loader.load_state_dict(tiny_checkpoint, allow_custom_model=True)
    assert "sidecar.missing_scale" in caught.value.codes
    assert not {p for p in file_mappings() if p.startswith(str(tiny_checkpoint))} - before


def _rewrite_in_place(path: Path) -> str:
    data = bytearray(path.read_bytes())
    data[-1] ^= 0xFF
    path.write_bytes(bytes(data))
    return "modification time changed"


def _truncate(path: Path) -> str:
    os.truncate(path, path.stat().st_size - 8)
    return "truncated"


def _replace(path: Path) -> str:
    copy = path.with_suffix(".new")
    copy.write_bytes(path.read_bytes())
    os.utime(copy, ns=(path.stat().st_atime_ns, path.stat().st_mtime_ns))
    os.replace(copy, path)
    return "the file was replaced"


def _header_rewritten_same_size_and_mtime(path: Path) -> str:
    stat = path.stat()
    data = bytearray(path.read_bytes())
    length = int.from_bytes(data[:8], "little")
    name = next(iter(ckpt_edit.raw_header(path)[0])).encode()
    position = data.find(name, 8, 8 + length)
    data[position] = ord("X") if data[position] != ord("X") else ord("Y")  # same length, another name
    path.write_bytes(bytes(data))
    os.utime(path, ns=(stat.st_atime_ns, stat.st_mtime_ns))
    return "header bytes differ"


def _removed(path: Path) -> str:
    path.unlink()
    return "can no longer be opened"


@pytest.mark.parametrize("change", [_rewrite_in_place, _truncate, _replace, _header_rewritten_same_size_and_mtime, _removed])
def test_shard_changed_after_preflight_is_refused(tiny_checkpoint: Path, change: Callable[[Path], str]) -> None:
    report = preflight(tiny_checkpoint, allow_custom_model=True).raise_if_failed()
    shard = ckpt_edit.shards(tiny_checkpoint)[1]
    expected = change(tiny_checkpoint / shard)
    with pytest.raises(IntegrityError, match=shard) as caught:
        loader.load_state_dict(tiny_checkpoint, report=report)
    assert expected in str(caught.value) and "changed after the preflight" in str(caught.value)


def test_describe_load_names_what_was_mapped_and_derived(tiny_template: Path) -> None:
    text = loader.describe_load(tiny_template)
    assert "mapped 41 tensors" in text and "4 F8_E4M3" in text and "rank_util.rank" in text
