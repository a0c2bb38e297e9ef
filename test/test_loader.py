"""The zero-copy loader: views into private mappings of the shard files, the same bytes as
safetensors reads, derived entries per NeuronConfig, the cast rule, and the refusal of shards
that changed after the preflight."""

from __future__ import annotations

import dataclasses
import gc
import hashlib
import math
import os
import shutil
import struct
from collections.abc import Callable
from pathlib import Path

import ckpt_edit
import pytest
import torch
from safetensors.torch import load_file, save_file

from nxdi_gptoss_fp8 import format as fmt
from nxdi_gptoss_fp8 import loader
from nxdi_gptoss_fp8.errors import IntegrityError, LoadError, PreflightError, ReportBindingError
from nxdi_gptoss_fp8.safeio.files import FileIdentity
from nxdi_gptoss_fp8.synthetic.tiny import make_tiny
from nxdi_gptoss_fp8.validate.binding import CheckedCheckpoint
from nxdi_gptoss_fp8.validate.findings import PreflightReport
from nxdi_gptoss_fp8.validate.pipeline import preflight

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
    state_dict = loader.load_state_dict(tiny_template, options_config(options), report=clean_report(tiny_template, options),
                                        allow_custom_model=True)
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
    loaded = loader.load_checkpoint(tiny_checkpoint, options_config(options), report=clean_report(tiny_checkpoint, options),
                                    allow_custom_model=True)
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
    options = {"torch_dtype": "float16"}
    loaded = loader.load_checkpoint(tiny_template, options_config(options), allow_custom_model=True,
                                    report=clean_report(tiny_template, options))
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
    return "change time changed"  # os.utime cannot put ctime back


def _scale_nan_in_place_mtime_restored(path: Path) -> str:
    """The attack of a same-size in-place edit: one scale becomes NaN, the mtime is put back."""
    stat = path.stat()
    header, _ = ckpt_edit.raw_header(path)
    scale = next(name for name in header if name.endswith(".scale"))
    position = 8 + int.from_bytes(path.read_bytes()[:8], "little") + header[scale]["data_offsets"][0]
    with open(path, "r+b") as handle:
        handle.seek(position)
        handle.write(struct.pack("<f", math.nan))
    os.utime(path, ns=(stat.st_atime_ns, stat.st_mtime_ns))
    assert path.stat().st_mtime_ns == stat.st_mtime_ns and path.stat().st_size == stat.st_size
    return "change time changed"


def _removed(path: Path) -> str:
    path.unlink()
    return "can no longer be opened"


def _link_to_outside_copy(path: Path) -> str:
    outside = path.parent.parent / "elsewhere"
    outside.mkdir()
    shutil.copy2(path, outside / path.name)
    path.unlink()
    path.symlink_to(outside / path.name)
    return "outside the checkpoint directory"


def _link_to_outside_hard_link(path: Path) -> str:
    """Same inode, same bytes, reached through a link outside the directory: still refused."""
    outside = path.parent.parent / "elsewhere"
    outside.mkdir()
    os.link(path, outside / path.name)
    path.unlink()
    path.symlink_to(outside / path.name)
    return "outside the checkpoint directory"


SHARD_CHANGES = [_rewrite_in_place, _truncate, _replace, _header_rewritten_same_size_and_mtime, _removed,
                 _scale_nan_in_place_mtime_restored, _link_to_outside_copy, _link_to_outside_hard_link]


@pytest.mark.parametrize("change", SHARD_CHANGES)
def test_shard_changed_after_preflight_is_refused(tiny_checkpoint: Path, change: Callable[[Path], str]) -> None:
    report = preflight(tiny_checkpoint, allow_custom_model=True).raise_if_failed()
    shard = ckpt_edit.shards(tiny_checkpoint)[1]
    if change is _scale_nan_in_place_mtime_restored:
        shard = ckpt_edit.shard_of(tiny_checkpoint, ckpt_edit.GATE_UP_SCALE)
    expected = change(tiny_checkpoint / shard)
    with pytest.raises(IntegrityError, match=shard) as caught:
        loader.load_state_dict(tiny_checkpoint, report=report, allow_custom_model=True)
    assert expected in str(caught.value) and "changed after the preflight" in str(caught.value)


def test_describe_load_names_what_was_mapped_and_derived(tiny_template: Path) -> None:
    text = loader.describe_load(tiny_template)
    assert "mapped 41 tensors" in text and "4 F8_E4M3" in text and "rank_util.rank" in text


def test_header_bytes_are_compared_even_when_the_stat_identity_matches(tiny_checkpoint: Path) -> None:
    """Defence in depth where ctime is unreliable: the header's SHA-256 is checked on the descriptor."""
    report = preflight(tiny_checkpoint, allow_custom_model=True).raise_if_failed()
    shard = ckpt_edit.shards(tiny_checkpoint)[1]
    _header_rewritten_same_size_and_mtime(tiny_checkpoint / shard)
    header = report.view.headers[shard]
    now = dataclasses.replace(header, identity=FileIdentity.of(os.stat(tiny_checkpoint / shard)))
    with pytest.raises(IntegrityError, match="header bytes differ"):
        loader.map_shard(shard, now, root=os.path.realpath(tiny_checkpoint))


@pytest.mark.parametrize("name", [fmt.CONFIG_FILE, fmt.INDEX_FILE])
def test_config_or_index_changed_after_preflight_is_refused(tiny_checkpoint: Path, name: str) -> None:
    report = preflight(tiny_checkpoint, allow_custom_model=True).raise_if_failed()
    path = tiny_checkpoint / name
    stat = path.stat()
    path.write_bytes(path.read_bytes())  # same bytes, rewritten: the identity says so
    os.utime(path, ns=(stat.st_atime_ns, stat.st_mtime_ns))
    with pytest.raises(IntegrityError, match=name):
        loader.load_state_dict(tiny_checkpoint, report=report, allow_custom_model=True)


# --------------------------------------------------------------------------- the report's binding


def _other_directory(ckpt: Path) -> tuple[dict, dict]:
    other = Path(shutil.copytree(ckpt, ckpt.parent / "other"))
    return {"report": preflight(other, allow_custom_model=True)}, {}


def _headers_only(ckpt: Path) -> tuple[dict, dict]:
    return {"report": preflight(ckpt, allow_custom_model=True, read_scales=False)}, {}


def _with_errors(ckpt: Path) -> tuple[dict, dict]:
    ckpt_edit.remove_tensor(ckpt, ckpt_edit.DOWN_SCALE)
    return {"report": preflight(ckpt, allow_custom_model=True)}, {}


def _errors_removed_from_the_report(ckpt: Path) -> tuple[dict, dict]:
    ckpt_edit.remove_tensor(ckpt, ckpt_edit.DOWN_SCALE)
    report = preflight(ckpt, allow_custom_model=True)
    report.findings.clear()  # the verdict was sealed when the run ended
    return {"report": report}, {}


def _no_config_at_preflight(ckpt: Path) -> tuple[dict, dict]:
    return {"report": preflight(ckpt, allow_custom_model=True)}, {"config": options_config({})}


def _config_at_preflight_none_at_load(ckpt: Path) -> tuple[dict, dict]:
    return {"report": clean_report(ckpt, {})}, {}


def _different_config(ckpt: Path) -> tuple[dict, dict]:
    return {"report": clean_report(ckpt, {"tp_degree": 2})}, {"config": options_config({"tp_degree": 4})}


def _config_changed_in_between(ckpt: Path) -> tuple[dict, dict]:
    config = options_config({"tp_degree": 2})
    report = preflight(ckpt, neuron_config=config, allow_custom_model=True)
    config["fused_qkv"] = True  # the same object, edited after its preflight
    return {"report": report}, {"config": config}


def _custom_opt_in_only_at_preflight(ckpt: Path) -> tuple[dict, dict]:
    return {"report": preflight(ckpt, allow_custom_model=True)}, {"allow_custom_model": False}


def _unbound(ckpt: Path) -> tuple[dict, dict]:
    return {"report": PreflightReport(path=str(ckpt))}, {}


BINDING_CASES = {
    "another-directory": (_other_directory, "not"),
    "headers-only": (_headers_only, "headers-only"),
    "with-errors": (_with_errors, "errors (first: "),
    "errors-removed": (_errors_removed_from_the_report, "findings removed from the report since"),
    "no-config-at-preflight": (_no_config_at_preflight, "made with no NxDI config"),
    "no-config-at-load": (_config_at_preflight_none_at_load, "this load has no NxDI config"),
    "different-config": (_different_config, "a different NxDI config"),
    "config-edited-in-between": (_config_changed_in_between, "a different NxDI config"),
    "custom-opt-in": (_custom_opt_in_only_at_preflight, "custom-model opt-in"),
    "unbound": (_unbound, "not made by preflight()"),
}


@pytest.mark.parametrize("case", list(BINDING_CASES))
def test_a_report_that_does_not_vouch_for_this_load_is_refused_before_mapping(
    tiny_checkpoint: Path, monkeypatch: pytest.MonkeyPatch, case: str,
) -> None:
    make, expected = BINDING_CASES[case]
    report_kwargs, load_kwargs = make(tiny_checkpoint)
    load_kwargs = {"allow_custom_model": True, **load_kwargs}

    def must_not_map(*args: object, **kwargs: object) -> None:
        raise AssertionError("the loader mapped a shard for a report that does not vouch for this load")

    monkeypatch.setattr(loader, "map_shard", must_not_map)
    monkeypatch.setattr(loader.mmap, "mmap", must_not_map)
    before = set(file_mappings())
    with pytest.raises(ReportBindingError) as caught:
        loader.load_state_dict(tiny_checkpoint, load_kwargs.pop("config", None), **report_kwargs, **load_kwargs)
    message = str(caught.value)
    assert expected in message and "nothing was mapped" in message and "\n" not in message
    assert not {p for p in file_mappings() if p.startswith(str(tiny_checkpoint.parent))} - before
    if case == "with-errors":  # still a PreflightError carrying every finding
        assert isinstance(caught.value, PreflightError) and "sidecar.missing_scale" in caught.value.codes


def test_the_same_config_object_or_an_equal_one_is_accepted(tiny_template: Path) -> None:
    config = options_config({"tp_degree": 2})
    report = preflight(tiny_template, neuron_config=config, allow_custom_model=True)
    assert loader.load_state_dict(tiny_template, config, report=report, allow_custom_model=True)
    assert loader.load_state_dict(tiny_template, dict(config), report=report, allow_custom_model=True)


def test_a_checked_checkpoint_cannot_be_built_outside_the_preflight(tiny_template: Path) -> None:
    checked = preflight(tiny_template, allow_custom_model=True).checked
    assert checked is not None and checked.binding.root == os.path.realpath(tiny_template)
    with pytest.raises(TypeError, match="made only by preflight"):
        CheckedCheckpoint(checked.view, checked.binding)
    with pytest.raises(dataclasses.FrozenInstanceError):
        checked.binding.headers_only = True  # type: ignore[misc]


def test_the_binding_records_every_file_the_preflight_read(tiny_template: Path) -> None:
    binding = preflight(tiny_template, allow_custom_model=True).checked.binding  # type: ignore[union-attr]
    names = {bound.name for bound in binding.files}
    assert names == {fmt.CONFIG_FILE, fmt.INDEX_FILE, *ckpt_edit.shards(tiny_template)}
    for bound in binding.files:
        stat = os.stat(tiny_template / bound.name)
        assert bound.identity == FileIdentity.of(stat)
        assert (bound.identity.device, bound.identity.inode, bound.identity.ctime_ns) == (stat.st_dev, stat.st_ino, stat.st_ctime_ns)
    assert binding.file(fmt.CONFIG_FILE).sha256 == hashlib.sha256((tiny_template / fmt.CONFIG_FILE).read_bytes()).hexdigest()  # type: ignore[union-attr]


# --------------------------------------------------------------------------- load policy: verify, private memory


def _flip_fp8_byte(ckpt: Path) -> str:
    """Change one FP8 weight byte in place to another in-range value (no check but a digest sees it)."""
    shard = ckpt_edit.shard_of(ckpt, ckpt_edit.GATE_UP_WEIGHT)
    path = ckpt / shard
    header, _ = ckpt_edit.raw_header(path)
    position = 8 + int.from_bytes(path.read_bytes()[:8], "little") + header[ckpt_edit.GATE_UP_WEIGHT]["data_offsets"][0]
    with open(path, "r+b") as handle:
        handle.seek(position)
        byte = handle.read(1)[0]
        handle.seek(position)
        handle.write(bytes([byte ^ 0x01]))
    return shard


@pytest.mark.parametrize("mode", fmt.LOAD_MODES)
def test_verify_at_load_hashes_the_loaded_bytes(tiny_template: Path, mode: str) -> None:
    policy = loader.LoadPolicy(verify_digests=True, load_mode=mode)
    loaded = loader.load_checkpoint(tiny_template, allow_custom_model=True, policy=policy)
    assert loaded.verified_bytes == sum(os.path.getsize(tiny_template / s) for s in ckpt_edit.shards(tiny_template))
    assert "verified 4 shards" in loaded.describe()


@pytest.mark.parametrize("mode", fmt.LOAD_MODES)
def test_verify_at_load_refuses_a_digest_mismatch(tiny_checkpoint: Path, mode: str) -> None:
    shard = _flip_fp8_byte(tiny_checkpoint)
    assert loader.load_checkpoint(tiny_checkpoint, allow_custom_model=True)  # no check but a digest sees it
    with pytest.raises(IntegrityError, match=f"{shard}: the loaded bytes have SHA-256"):
        loader.load_checkpoint(tiny_checkpoint, allow_custom_model=True,
                               policy=loader.LoadPolicy(verify_digests=True, load_mode=mode))


def test_verify_at_load_refuses_an_index_without_digests(tiny_checkpoint: Path) -> None:
    ckpt_edit.edit_index(tiny_checkpoint, lambda index: index["metadata"].pop("shard_sha256"))
    with pytest.raises(IntegrityError, match=r"no metadata\.shard_sha256"):
        loader.load_checkpoint(tiny_checkpoint, allow_custom_model=True, policy=loader.LoadPolicy(verify_digests=True))


def _write_after_load(ckpt: Path, mode: str) -> tuple[bytes, bytes]:
    loaded = loader.load_checkpoint(ckpt, allow_custom_model=True, policy=loader.LoadPolicy(load_mode=mode))
    weight = loaded.state_dict[ckpt_edit.GATE_UP_WEIGHT]
    before = raw_bytes(weight)
    _flip_fp8_byte(ckpt)
    return before, raw_bytes(weight)


def test_a_mapping_shows_later_writes_to_the_file_private_memory_does_not(tiny_checkpoint: Path) -> None:
    """The mmap caveat docs/loading.md states, and the private mode that removes it."""
    before, after = _write_after_load(tiny_checkpoint, fmt.LOAD_MODE_MMAP)
    assert before != after  # the mapping shows the write
    before, after = _write_after_load(tiny_checkpoint, fmt.LOAD_MODE_PRIVATE)
    assert before == after  # private memory does not


def test_private_mode_reads_into_anonymous_memory_with_the_same_bytes(tiny_template: Path) -> None:
    loaded = loader.load_checkpoint(tiny_template, allow_custom_model=True, policy=loader.LoadPolicy(load_mode="private"))
    maps = file_mappings()
    reference = all_tensors(tiny_template)
    for name in loaded.mapped:
        tensor = loaded.state_dict[name]
        assert raw_bytes(tensor) == raw_bytes(reference[name]), name
        assert not any(lo <= tensor.data_ptr() < hi for ranges in maps.values() for lo, hi in ranges), name
    assert loaded.private_bytes == sum(os.path.getsize(tiny_template / s) for s in ckpt_edit.shards(tiny_template))
    assert "read into private memory" in loaded.describe()


@pytest.mark.parametrize(("env", "attrs", "expected"), [
    ({}, {}, (False, "mmap")),
    ({fmt.VERIFY_AT_LOAD_ENV: "1"}, {}, (True, "mmap")),
    ({fmt.VERIFY_AT_LOAD_ENV: "off"}, {fmt.VERIFY_AT_LOAD_ATTR: True}, (True, "mmap")),
    ({}, {fmt.VERIFY_AT_LOAD_ATTR: "yes"}, (True, "mmap")),
    ({fmt.LOAD_MODE_ENV: "Private"}, {}, (False, "private")),
    ({}, {fmt.LOAD_MODE_ATTR: "private"}, (False, "private")),
    ({fmt.LOAD_MODE_ENV: "private"}, {fmt.LOAD_MODE_ATTR: "private"}, (False, "private")),
    ({fmt.LOAD_MODE_ENV: ""}, {fmt.LOAD_MODE_ATTR: "mmap"}, (False, "mmap")),
    ({fmt.VERIFY_AT_LOAD_ENV: "maybe"}, {}, "is not on or off"),
    ({}, {fmt.VERIFY_AT_LOAD_ATTR: 2}, "is not on or off"),
    ({fmt.LOAD_MODE_ENV: "copy"}, {}, "is not a load mode"),
    ({}, {fmt.LOAD_MODE_ATTR: ["private"]}, "is not a load mode"),
    ({fmt.LOAD_MODE_ENV: "mmap"}, {fmt.LOAD_MODE_ATTR: "private"}, "contradicts"),
])
def test_load_policy_from_environment_and_neuron_config(env: dict, attrs: dict, expected: tuple | str) -> None:
    config = {"neuron_config": attrs}
    if isinstance(expected, str):
        with pytest.raises(LoadError, match=expected):
            loader.LoadPolicy.resolve(config, env)
        return
    policy = loader.LoadPolicy.resolve(config, env)
    assert (policy.verify_digests, policy.load_mode) == expected
