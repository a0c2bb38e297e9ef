"""The preflight: a valid checkpoint passes; each fault gives a finding of the right check."""

from __future__ import annotations

import json
import os
import shutil
import struct
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch
from ckpt_edit import (
    DOWN_SCALE,
    DOWN_WEIGHT,
    GATE_UP_SCALE,
    GATE_UP_WEIGHT,
    add_tensor,
    edit_config,
    edit_header,
    edit_index,
    edit_shard,
    move_tensor,
    raw_header,
    read_json,
    remove_tensor,
    rename_tensor,
    replace_tensor,
    shard_of,
    shards,
    write_raw,
)
from hypothesis import given
from hypothesis import strategies as st

from nxdi_gptoss_fp8 import PreflightError, preflight
from nxdi_gptoss_fp8 import format as fmt
from nxdi_gptoss_fp8.validate.findings import CHECKS, Severity
from nxdi_gptoss_fp8.validate.pipeline import allow_custom_from_env
from nxdi_gptoss_fp8.validate.scales import scale_stats

Mutation = Callable[[Path], Any]


def test_valid_tiny_checkpoint_passes(tiny_checkpoint: Path) -> None:
    report = preflight(tiny_checkpoint, allow_custom_model=True)
    assert report.ok, report.render_text()
    assert report.findings == []
    assert report.tensors == 41 and report.shards == len(shards(tiny_checkpoint))
    assert report.profile == "custom"
    assert report.bytes_read > 0


def test_valid_padded_checkpoint_passes(tiny_padded_template: Path) -> None:
    report = preflight(tiny_padded_template, allow_custom_model=True)
    assert report.ok, report.render_text()
    assert report.view.layout.padded_hidden_size == 96


def test_preflight_reads_no_weight_bytes(tiny_checkpoint: Path) -> None:
    """Bytes read = config + index + headers + scales; no weight byte."""
    report = preflight(tiny_checkpoint, allow_custom_model=True)
    view = report.view
    headers = sum(h.bytes_read for h in view.headers.values())
    scales = sum(info.nbytes for h in view.headers.values() for k, info in h.tensors.items() if fmt.is_expert_scale(k))
    json_files = os.path.getsize(tiny_checkpoint / fmt.INDEX_FILE) + os.path.getsize(tiny_checkpoint / fmt.CONFIG_FILE)
    assert report.bytes_read == headers + scales + json_files
    headers_only = preflight(tiny_checkpoint, allow_custom_model=True, read_scales=False)
    assert headers_only.clean and not headers_only.complete and not headers_only.ok  # partial: never ok
    assert headers_only.not_checked == ["scale values"] and headers_only.bytes_read == headers + json_files
    assert headers_only.codes() == ["values.not_checked"]


def _symlink_outside(ckpt: Path) -> None:
    shard = shards(ckpt)[0]
    outside = ckpt.parent / "elsewhere.safetensors"
    shutil.move(ckpt / shard, outside)
    os.symlink(outside, ckpt / shard)


def _hf_names(ckpt: Path) -> None:
    rename_tensor(ckpt, "layers.0.input_layernorm.weight", "model.layers.0.input_layernorm.weight")


def _truncate_file(ckpt: Path, size: int) -> None:
    path = ckpt / shards(ckpt)[-1]
    os.truncate(path, size)


def _set_prefix(ckpt: Path, length: int) -> None:
    path = ckpt / shards(ckpt)[0]
    data = bytearray(path.read_bytes())
    data[:8] = struct.pack("<Q", length)
    path.write_bytes(bytes(data))


def _raw_text(ckpt: Path, text: bytes) -> None:
    path = ckpt / shards(ckpt)[0]
    _, payload = raw_header(path)
    write_raw(path, text, payload)


def _duplicate_name_in_header(ckpt: Path) -> None:
    path = ckpt / shard_of(ckpt, GATE_UP_SCALE)
    header, payload = raw_header(path)
    text = json.dumps(header)
    entry = json.dumps(header[GATE_UP_SCALE])
    text = text[:-1] + f', "{GATE_UP_SCALE}": {entry}' + "}"
    write_raw(path, text.encode(), payload)


def _header_field(key: str, field: str, value: Any) -> Mutation:
    def mutate(ckpt: Path) -> None:
        edit_header(ckpt, shard_of(ckpt, key), lambda h: h[key].__setitem__(field, value))
    return mutate


def _shift_offsets(ckpt: Path, gap: int) -> None:
    """Move every tensor after the first ``gap`` bytes later (or earlier: overlap)."""
    shard = shard_of(ckpt, GATE_UP_SCALE)

    def change(header: dict) -> None:
        entries = sorted((k for k in header if k != "__metadata__"), key=lambda k: header[k]["data_offsets"][0])
        for k in entries[1:]:
            begin, end = header[k]["data_offsets"]
            header[k]["data_offsets"] = [begin + gap, end + gap]

    edit_header(ckpt, shard, change)


def _append_bytes(ckpt: Path, count: int) -> None:
    with open(ckpt / shard_of(ckpt, GATE_UP_SCALE), "ab") as handle:
        handle.write(b"\0" * count)


def _second_checkpoint_shard(ckpt: Path) -> None:
    """Another checkpoint's shard (same name) dropped in: same keys, different physical layout."""
    other = shards(ckpt)[0]
    keys = [k for k, v in read_json(ckpt / fmt.INDEX_FILE)["weight_map"].items() if v == other]
    move_tensor(ckpt, keys[0], shards(ckpt)[1], update_index=False)


def _duplicate_across_shards(key: str) -> Mutation:
    def mutate(ckpt: Path) -> None:
        from ckpt_edit import load_shard

        tensor = load_shard(ckpt, shard_of(ckpt, key))[key]
        target = next(s for s in shards(ckpt) if s != shard_of(ckpt, key))
        edit_shard(ckpt, target, lambda t: t.__setitem__(key, tensor))
    return mutate


def _set_scale_value(value: float, key: str = GATE_UP_SCALE) -> Mutation:
    def mutate(ckpt: Path) -> None:
        def change(tensors: dict[str, torch.Tensor]) -> None:
            scale = tensors[key].clone()
            scale.view(-1)[3] = value
            tensors[key] = scale
        edit_shard(ckpt, shard_of(ckpt, key), change)
    return mutate


def _metadata(change: Callable[[dict], None]) -> Mutation:
    return lambda ckpt: edit_index(ckpt, lambda index: change(index["metadata"]))


def _config(change: Callable[[dict], None]) -> Mutation:
    return lambda ckpt: edit_config(ckpt, change)


def _write(name: str, content: bytes) -> Mutation:
    return lambda ckpt: (ckpt / name).write_bytes(content)


# (case id, mutation, expected finding code, preflight keyword arguments)
CASES: list[tuple[str, Mutation, str, dict[str, Any]]] = [
    # filesystem
    ("stray-bin", _write("pytorch_model.bin", b"PK\x03\x04pickle"), "filesystem.stray_weight_file", {}),
    ("stray-safetensors", lambda c: shutil.copy(c / shards(c)[0], c / "model.safetensors"), "filesystem.stray_weight_file", {}),
    ("stray-pth", _write("consolidated.pth", b"x"), "filesystem.stray_weight_file", {}),
    ("unsafe-shard-name", lambda c: edit_index(c, lambda i: i["weight_map"].__setitem__("norm.weight", "../model.safetensors")), "filesystem.unsafe_shard_name", {}),
    ("absolute-shard-name", lambda c: edit_index(c, lambda i: i["weight_map"].__setitem__("norm.weight", "/etc/passwd")), "filesystem.unsafe_shard_name", {}),
    ("symlink-outside", _symlink_outside, "filesystem.link_outside", {}),
    ("missing-index", lambda c: os.remove(c / fmt.INDEX_FILE), "filesystem.missing_index", {}),
    # index
    ("index-not-json", _write(fmt.INDEX_FILE, b"{not json"), "index.invalid_json", {}),
    ("index-duplicate-key", lambda c: (c / fmt.INDEX_FILE).write_text((c / fmt.INDEX_FILE).read_text().replace('"weight_map": {', '"weight_map": {"norm.weight": "x.safetensors", ', 1)), "index.duplicate_key", {}),
    ("index-missing-field", _metadata(lambda m: m.pop("fp8_max")), "index.missing_metadata_field", {}),
    ("index-extra-field", _metadata(lambda m: m.__setitem__("compression", "zstd")), "index.unexpected_metadata", {}),
    ("index-wrong-format", _metadata(lambda m: m.__setitem__("format", "nxdi_gptoss_fp8")), "index.wrong_metadata_value", {}),
    ("index-wrong-version", _metadata(lambda m: m.__setitem__("format_version", 2)), "index.wrong_metadata_value", {}),
    ("index-bool-version", _metadata(lambda m: m.__setitem__("format_version", True)), "index.wrong_metadata_type", {}),
    ("index-fp8-max-448", _metadata(lambda m: m.__setitem__("fp8_max", 448.0)), "index.wrong_metadata_value", {}),
    ("index-total-size", _metadata(lambda m: m.__setitem__("total_size", m["total_size"] + 2)), "index.total_size_mismatch", {}),
    ("index-empty-weight-map", lambda c: edit_index(c, lambda i: i.__setitem__("weight_map", {})), "index.empty_weight_map", {}),
    ("index-hf-metadata", lambda c: edit_index(c, lambda i: i.__setitem__("metadata", {"total_size": i["metadata"]["total_size"]})), "index.not_normalized", {}),
    ("index-unknown-profile", _metadata(lambda m: m.__setitem__("model_profile", "gpt-oss-70b")), "index.unknown_profile", {}),
    ("index-unknown-target", _metadata(lambda m: m.__setitem__("target", "vllm-neuron-2")), "index.unknown_target", {}),
    ("index-target-not-a-string", _metadata(lambda m: m.__setitem__("target", ["nki-moe"])), "index.wrong_metadata_type", {}),
    ("index-target-other-sizes", _metadata(lambda m: m.__setitem__("target", "nki-moe")), "index.target_mismatch", {}),
    ("index-bad-digest", lambda c: edit_index(c, lambda i: i["metadata"].__setitem__("shard_sha256", {s: "abc" for s in shards(c)})), "index.bad_shard_sha256", {}),
    # header
    ("header-short-file", lambda c: _truncate_file(c, 5), "header.too_short", {}),
    ("header-length-beyond-file", lambda c: _set_prefix(c, 10**7), "header.header_beyond_file", {}),
    ("header-length-2-64", lambda c: _set_prefix(c, 2**64 - 1), "header.header_too_large", {}),
    ("header-not-utf8", lambda c: _raw_text(c, b'{"a\xff": 1}'), "header.not_utf8", {}),
    ("header-nul-padding", lambda c: _pad_header_with(c, b"\0"), "header.invalid_json", {}),
    ("header-duplicate-name", _duplicate_name_in_header, "header.duplicate_key", {}),
    ("header-unknown-dtype", _header_field(GATE_UP_SCALE, "dtype", "F8_E4M3FNUZ"), "header.unknown_dtype", {}),
    ("header-negative-shape", _header_field(GATE_UP_SCALE, "shape", [-4, 1, 128]), "header.bad_shape", {}),
    ("header-float-shape", _header_field(GATE_UP_SCALE, "shape", [4.0, 1, 128]), "header.bad_shape", {}),
    ("header-size-mismatch", _header_field(GATE_UP_SCALE, "shape", [4, 1, 64]), "header.size_mismatch", {}),
    ("header-gap", lambda c: (_shift_offsets(c, 4), _append_bytes(c, 4)), "header.offsets_gap", {}),
    ("header-shifted-past-end", lambda c: _shift_offsets(c, 4), "header.data_beyond_file", {}),
    ("header-overlap", lambda c: _shift_offsets(c, -4), "header.offsets_overlap", {}),
    ("header-trailing-bytes", lambda c: _append_bytes(c, 16), "header.trailing_bytes", {}),
    ("header-half-copied", lambda c: _truncate_file(c, os.path.getsize(c / shards(c)[-1]) // 2), "header.data_beyond_file", {}),
    # ownership
    ("ownership-scale-other-shard", lambda c: edit_index(c, lambda i: i["weight_map"].__setitem__(GATE_UP_SCALE, shards(c)[-1])), "ownership.key_in_other_shard", {}),
    ("ownership-second-checkpoint-shard", _second_checkpoint_shard, "ownership.key_in_other_shard", {}),
    ("ownership-unlisted-key", lambda c: edit_index(c, lambda i: (i["weight_map"].pop("norm.weight"), i["metadata"].__setitem__("total_size", i["metadata"]["total_size"] - 128))), "ownership.unlisted_key", {}),
    ("ownership-missing-shard", lambda c: os.remove(c / shards(c)[-1]), "ownership.missing_shard", {}),
    ("ownership-phantom-key", lambda c: remove_tensor(c, "norm.weight", from_index=False), "ownership.key_not_in_shard", {}),
    # collision
    ("collision-scale", _duplicate_across_shards(GATE_UP_SCALE), "collision.duplicate_tensor", {}),
    ("collision-norm", _duplicate_across_shards("norm.weight"), "collision.duplicate_tensor", {}),
    ("collision-expert-weight", _duplicate_across_shards(DOWN_WEIGHT), "collision.duplicate_tensor", {}),
    # namespace
    ("namespace-missing-key", lambda c: remove_tensor(c, "layers.1.self_attn.o_proj.bias"), "namespace.missing_key", {}),
    ("namespace-unexpected-key", lambda c: add_tensor(c, "layers.0.mlp.extra", torch.zeros(4, dtype=torch.bfloat16)), "namespace.unexpected_key", {}),
    ("namespace-derived-rank", lambda c: add_tensor(c, "rank_util.rank", torch.arange(2, dtype=torch.int32)), "namespace.derived_key", {}),
    ("namespace-derived-unpadded", lambda c: add_tensor(c, "norm.weight_unpadded", torch.ones(64, dtype=torch.bfloat16)), "namespace.derived_key", {}),
    ("namespace-derived-lm-head-bias", lambda c: add_tensor(c, "lm_head.bias", torch.zeros(128)), "namespace.derived_key", {}),
    ("namespace-hf-prefix", _hf_names, "namespace.hf_name", {}),
    ("namespace-hf-blocks", lambda c: add_tensor(c, "layers.0.mlp.experts.gate_up_proj_blocks", torch.zeros(4, dtype=torch.uint8)), "namespace.hf_name", {}),
    ("namespace-legacy-name", lambda c: rename_tensor(c, "layers.0.input_layernorm.weight", "block.0.attn.norm.scale"), "namespace.legacy_name", {}),
    # dtype_shape
    ("dtype-bf16-expert", lambda c: replace_tensor(c, DOWN_WEIGHT, torch.zeros(4, 64, 64, dtype=torch.bfloat16)), "dtype_shape.wrong_dtype", {}),
    ("dtype-e5m2-expert", lambda c: replace_tensor(c, DOWN_WEIGHT, torch.zeros(4, 64, 64, dtype=torch.float8_e5m2)), "dtype_shape.wrong_dtype", {}),
    ("dtype-f32-norm", lambda c: replace_tensor(c, "norm.weight", torch.ones(64)), "dtype_shape.wrong_dtype", {}),
    ("shape-transposed-expert", lambda c: replace_tensor(c, GATE_UP_WEIGHT, torch.zeros(4, 128, 64, dtype=torch.float8_e4m3fn)), "dtype_shape.wrong_shape", {}),
    ("shape-per-tensor-scale", lambda c: replace_tensor(c, DOWN_SCALE, torch.ones(1)), "dtype_shape.wrong_shape", {}),
    ("shape-norm", lambda c: replace_tensor(c, "norm.weight", torch.ones(65, dtype=torch.bfloat16)), "dtype_shape.wrong_shape", {}),
    # sidecar
    ("sidecar-missing-scale", lambda c: remove_tensor(c, GATE_UP_SCALE), "sidecar.missing_scale", {}),
    ("sidecar-orphan-scale", lambda c: remove_tensor(c, DOWN_WEIGHT), "sidecar.orphan_scale", {}),
    ("sidecar-split-shard", lambda c: move_tensor(c, DOWN_SCALE, next(s for s in shards(c) if s != shard_of(c, DOWN_SCALE)), update_index=True), "sidecar.split_shard", {}),
    ("sidecar-weight-scale", lambda c: add_tensor(c, "layers.0.self_attn.q_proj.weight_scale", torch.ones(1)), "sidecar.stray_scale", {}),
    ("sidecar-input-scale", lambda c: add_tensor(c, f"layers.0.{fmt.DOWN}.input_scale", torch.ones(1)), "sidecar.stray_scale", {}),
    # values
    ("values-nan-scale", _set_scale_value(float("nan")), "values.bad_scale", {}),
    ("values-zero-scale", _set_scale_value(0.0), "values.bad_scale", {}),
    ("values-negative-scale", _set_scale_value(-0.5, DOWN_SCALE), "values.bad_scale", {}),
    ("values-inf-scale", _set_scale_value(float("inf")), "values.bad_scale", {}),
    # config
    ("config-missing", lambda c: os.remove(c / fmt.CONFIG_FILE), "config.missing", {}),
    ("config-mxfp4", _config(lambda c: c.__setitem__("quantization_config", {"quant_method": "mxfp4"})), "config.mxfp4_quantization_config", {}),
    ("config-model-type", _config(lambda c: c.__setitem__("model_type", "llama")), "config.wrong_model_type", {}),
    ("config-architecture", _config(lambda c: c.__setitem__("architectures", ["LlamaForCausalLM"])), "config.wrong_architecture", {}),
    ("config-string-dim", _config(lambda c: c.__setitem__("hidden_size", "64")), "config.bad_field", {}),
    ("config-custom-not-allowed", lambda c: None, "config.custom_profile_not_allowed", {"allow_custom_model": False}),
    ("config-profile-mismatch", _metadata(lambda m: m.__setitem__("model_profile", "gpt-oss-20b")), "config.profile_mismatch", {}),
    ("config-padding-not-32", _metadata(lambda m: m.__setitem__("padded_hidden_size", 80)), "config.padding_mismatch", {}),
    ("config-padding-smaller", _metadata(lambda m: m.__setitem__("padded_intermediate_size", 32)), "config.padding_mismatch", {}),
    ("config-invalid-json", _write(fmt.CONFIG_FILE, b'{"model_type": "gpt_oss", "model_type": "x"}'), "config.duplicate_key", {}),
]

GOOD_NEURON_CONFIG: dict[str, Any] = {
    "tp_degree": 4,
    "quantized": True,
    "quantized_checkpoints_path": "/ckpt",
    "quantization_type": fmt.QUANTIZATION_TYPE,
    "quantization_dtype": fmt.QUANTIZATION_DTYPE,
    "modules_to_not_convert": ["self_attn", "lm_head"],
}


def _nc(**changes: Any) -> dict[str, Any]:
    config = {**GOOD_NEURON_CONFIG, **changes}
    return {"neuron_config": {k: v for k, v in config.items() if v is not None}}


NEURON_CONFIG_CASES: list[tuple[str, dict[str, Any], str]] = [
    ("not-quantized", _nc(quantized=False), "neuron_config.not_quantized"),
    ("quantized-missing", _nc(quantized=None), "neuron_config.not_quantized"),
    ("int8-default", _nc(quantization_dtype=None), "neuron_config.wrong_quantization_dtype"),
    ("f8e5m2", _nc(quantization_dtype="f8e5m2"), "neuron_config.wrong_quantization_dtype"),
    ("per-tensor", _nc(quantization_type="per_tensor_symmetric"), "neuron_config.wrong_quantization_type"),
    ("per-channel", _nc(quantization_type="per_channel_symmetric"), "neuron_config.wrong_quantization_type"),
    ("padding-hidden", _nc(padded_hidden_size=96), "neuron_config.padding_mismatch"),
    ("padding-intermediate", _nc(padded_intermediate_size=128), "neuron_config.padding_mismatch"),
    ("mxfp4-compute", _nc(is_mxfp4_compute=True), "neuron_config.mxfp4_compute"),
    ("attention-converted", _nc(modules_to_not_convert=["lm_head"]), "neuron_config.attention_not_excluded"),
    ("only-q-excluded", _nc(modules_to_not_convert=["q_proj", "lm_head"]), "neuron_config.attention_not_excluded"),
    ("lm-head-converted", _nc(modules_to_not_convert=["self_attn"]), "neuron_config.lm_head_not_excluded"),
    ("no-exclusions", _nc(modules_to_not_convert=None), "neuron_config.lm_head_not_excluded"),
    ("experts-excluded", _nc(modules_to_not_convert=["self_attn", "lm_head", "mlp_op"]), "neuron_config.experts_excluded"),
    ("empty-string-excludes-all", _nc(modules_to_not_convert=["", "lm_head"]), "neuron_config.experts_excluded"),
    ("tp-indivisible", _nc(tp_degree=3), "neuron_config.expert_tp_indivisible"),
    ("moe-tp-indivisible", _nc(moe_ep_degree=2, moe_tp_degree=3, tp_degree=6), "neuron_config.expert_tp_indivisible"),
    ("ep-indivisible", _nc(moe_ep_degree=3, moe_tp_degree=2), "neuron_config.expert_ep_indivisible"),
    ("tp-not-int", _nc(tp_degree="8"), "neuron_config.bad_degree"),
]


@pytest.mark.parametrize(("case", "mutate", "code", "kwargs"), CASES, ids=[c[0] for c in CASES])
def test_fault_is_found(tiny_checkpoint: Path, case: str, mutate: Mutation, code: str, kwargs: dict[str, Any]) -> None:
    mutate(tiny_checkpoint)
    report = preflight(tiny_checkpoint, **{"allow_custom_model": True, **kwargs})
    assert not report.ok
    assert code in report.codes(), report.render_text()
    finding = next(f for f in report.findings if f.code == code)
    assert finding.severity is Severity.ERROR
    assert finding.message
    with pytest.raises(PreflightError) as raised:
        report.raise_if_failed()
    assert code in raised.value.codes
    assert code in str(raised.value)


def test_every_check_category_has_three_cases() -> None:
    checks = [code.split(".")[0] for _, _, code, _ in CASES] + [c.split(".")[0] for _, _, c in NEURON_CONFIG_CASES]
    for check in CHECKS:
        if check in ("integrity", "presharded"):
            continue  # digests and TOCTOU: with the integrity checks and the loader; presharded: test_validate_presharded
        assert checks.count(check) >= 3, check


@pytest.mark.parametrize(("case", "neuron_config", "code"), NEURON_CONFIG_CASES, ids=[c[0] for c in NEURON_CONFIG_CASES])
def test_neuron_config_fault_is_found(tiny_template: Path, case: str, neuron_config: dict, code: str) -> None:
    report = preflight(tiny_template, neuron_config=neuron_config, allow_custom_model=True)
    assert code in report.codes(), report.render_text()
    assert all(f.check == "neuron_config" for f in report.errors)


@pytest.mark.parametrize("shape", ["nested", "flat", "object"])
def test_good_neuron_config_passes(tiny_template: Path, shape: str) -> None:
    flat = dict(GOOD_NEURON_CONFIG)
    config: Any = {"nested": {"neuron_config": flat}, "flat": flat, "object": type("NeuronConfig", (), flat)()}[shape]
    report = preflight(tiny_template, neuron_config=config, allow_custom_model=True)
    assert report.ok, report.render_text()


def test_padded_neuron_config(tiny_padded_template: Path) -> None:
    good = _nc(padded_hidden_size=96, padded_intermediate_size=128)
    assert preflight(tiny_padded_template, neuron_config=good, allow_custom_model=True).ok
    unpadded = preflight(tiny_padded_template, neuron_config=_nc(), allow_custom_model=True)
    assert unpadded.codes().count("neuron_config.padding_mismatch") == 2


def test_inference_config_mismatch(tiny_template: Path) -> None:
    class InferenceConfig:
        attention_bias = True
        hidden_size = 96  # NxDI stores the padded size here ...
        original_hidden_size = 64  # ... and the checkpoint's here
        num_hidden_layers = 2
        num_local_experts = 8

    report = preflight(tiny_template, inference_config=InferenceConfig(), allow_custom_model=True)
    assert [f.key for f in report.errors] == ["num_local_experts"]


def test_all_findings_are_collected(tiny_checkpoint: Path) -> None:
    """Several independent faults: every one is reported, not only the first."""
    _set_scale_value(float("nan"))(tiny_checkpoint)
    (tiny_checkpoint / "pytorch_model.bin").write_bytes(b"x")
    remove_tensor(tiny_checkpoint, "layers.1.self_attn.o_proj.bias")
    codes = set(preflight(tiny_checkpoint, allow_custom_model=True).codes())
    assert {"values.bad_scale", "filesystem.stray_weight_file", "namespace.missing_key"} <= codes
    # a config error as well: every finding is still reported, but the scale bytes are no
    # longer read (they are read only when config, index and headers are clean)
    edit_config(tiny_checkpoint, lambda c: c.__setitem__("quantization_config", {"quant_method": "mxfp4"}))
    codes = set(preflight(tiny_checkpoint, allow_custom_model=True).codes())
    assert {"filesystem.stray_weight_file", "config.mxfp4_quantization_config", "namespace.missing_key",
            "values.not_checked"} <= codes
    assert "values.bad_scale" not in codes


def test_hf_checkpoint_gets_the_hf_hint(tiny_checkpoint: Path) -> None:
    _hf_names(tiny_checkpoint)
    report = preflight(tiny_checkpoint, allow_custom_model=True)
    finding = next(f for f in report.findings if f.code == "namespace.hf_name")
    assert "unset CHECKPOINT_FORMAT" in finding.message and "convert" in finding.message


def test_missing_directory_and_file_path(tmp_path: Path) -> None:
    assert preflight(tmp_path / "nope").codes() == ["filesystem.missing_directory"]
    (tmp_path / "f").write_text("x")
    assert preflight(tmp_path / "f").codes() == ["filesystem.not_a_directory"]


def test_custom_profile_with_published_dims_gets_a_hint(tmp_path: Path) -> None:
    """A checkpoint of 20b dimensions labelled custom is told which profile to name."""
    import sparse_checkpoint

    ckpt = Path(sparse_checkpoint.build_sparse_checkpoint(str(tmp_path / "c"), fmt.PROFILE_20B))
    edit_index(ckpt, lambda i: i["metadata"].__setitem__("model_profile", "custom"))
    finding = next(f for f in preflight(ckpt).findings if f.code == "config.custom_profile_not_allowed")
    assert "gpt-oss-20b" in finding.message


@pytest.mark.parametrize(("value", "expected"), [("1", True), ("true", True), (" YES ", True), ("0", False), ("", False), ("no", False)])
def test_allow_custom_from_env(value: str, expected: bool) -> None:
    assert allow_custom_from_env({fmt.ALLOW_CUSTOM_ENV: value}) is expected


@pytest.mark.parametrize("value", ["ture", "2", "enabled", "y", "of", "1 1", "\u0661"])
def test_allow_custom_from_env_refuses_what_it_cannot_read(value: str) -> None:
    """The one on/off parser: a switch that is neither on nor off is an error, never silently off."""
    from nxdi_gptoss_fp8.errors import ConfigError
    from nxdi_gptoss_fp8.validate.nxdi_config import parse_verify_at_load

    with pytest.raises(ConfigError, match=fmt.ALLOW_CUSTOM_ENV + ".*is not on or off"):
        allow_custom_from_env({fmt.ALLOW_CUSTOM_ENV: value})
    with pytest.raises(ValueError, match="is not on or off"):  # the same parser as verify-at-load
        parse_verify_at_load(value)


@pytest.mark.parametrize(("kwargs", "message"), [
    ({"neuron_config": 2}, "not int"), ({"neuron_config": [GOOD_NEURON_CONFIG]}, "not list"),
    ({"neuron_config": b"nc.json"}, "not bytes"), ({"inference_config": 1.5}, "not float"),
    ({"allow_custom_model": "false"}, "True or False"), ({"deep": 1}, "True or False"),
    ({"read_scales": None}, "True or False"), ({"verify_checksums": "yes"}, "True or False"),
])
def test_preflight_refuses_arguments_of_the_wrong_type(tiny_template: Path, kwargs: dict[str, Any], message: str) -> None:
    with pytest.raises(TypeError, match=message):
        preflight(tiny_template, **kwargs)


@pytest.mark.parametrize("path", [3, b"/ckpt", None])
def test_preflight_refuses_a_path_of_the_wrong_type(path: Any) -> None:
    with pytest.raises(TypeError, match="preflight"):
        preflight(path)


def test_preflight_reads_a_neuron_config_path_as_the_cli_does(tiny_template: Path, tmp_path: Path) -> None:
    from nxdi_gptoss_fp8.errors import ConfigError

    nc = tmp_path / "nc.json"
    nc.write_text(json.dumps({**GOOD_NEURON_CONFIG, "tp_degree": 3}))
    for spelled in (str(nc), nc):
        codes = {f.code for f in preflight(tiny_template, neuron_config=spelled, allow_custom_model=True).errors}
        assert codes == {"neuron_config.expert_tp_indivisible"}
    nc.write_text(json.dumps({"neuron_config": GOOD_NEURON_CONFIG}))
    assert preflight(tiny_template, neuron_config=str(nc), allow_custom_model=True).ok
    for content, message in (("{", "not valid JSON"), ("[]", "JSON object"), (None, "cannot read")):
        (nc.write_text(content) if content is not None else nc.unlink())
        with pytest.raises(ConfigError, match=message):
            preflight(tiny_template, neuron_config=str(nc))


@pytest.mark.parametrize("path", ["dir\x00x", "\x00", Path("a\x00b")])
def test_a_path_with_a_nul_byte_is_a_finding_not_a_raw_value_error(path: Any) -> None:
    report = preflight(path)
    assert [f.code for f in report.errors] == ["filesystem.missing_directory"] and "NUL" in report.errors[0].message


def _pad_header_with(ckpt: Path, pad: bytes) -> None:
    path = ckpt / shards(ckpt)[0]
    header, payload = raw_header(path)
    write_raw(path, json.dumps(header).encode() + pad * 8, payload)


@pytest.mark.parametrize(
    ("values", "bad", "negative", "zero", "non_finite"),
    [
        ([1.0, 2.0, 0.5], 0, 0, 0, 0),
        ([1.0, 0.0, -0.0], 2, 1, 2, 0),
        ([float("inf"), float("nan"), 1e-40], 3, 0, 0, 2),  # a subnormal scale is bad too (flushed to zero)
        ([-1.0, 3.4e38, 1e-45], 2, 1, 0, 0),
    ],
)
def test_scale_stats(values: list[float], bad: int, negative: int, zero: int, non_finite: int) -> None:
    stats = scale_stats(struct.pack(f"<{len(values)}f", *values))
    assert (stats.bad, stats.negative, stats.zero, stats.non_finite) == (bad, negative, zero, non_finite)


def _reference_stats(bits: list[int]) -> tuple[int, int, int, int, int, int]:
    """Per value, in Python: the definition ``scale_stats`` computes with C loops."""
    bad = negative = zero = non_finite = subnormal = 0
    first = -1
    for index, value in enumerate(bits):
        sign, exponent, mantissa = value >> 31, (value >> 23) & 0xFF, value & 0x7FFFFF
        if sign or exponent in (0, 255):
            bad += 1
            first = index if first < 0 else first
        negative += sign
        zero += exponent == 0 and mantissa == 0
        subnormal += exponent == 0 and mantissa != 0
        non_finite += exponent == 255
    return bad, negative, zero, non_finite, subnormal, first


_SPECIAL_BITS = [0, 0x80000000, 1, 0x80000001, 0x007FFFFF, 0x00800000, 0x7F7FFFFF, 0x7F800000, 0xFF800000,
                 0x7FC00000, 0x3F800000, 0xBF800000]


@given(st.lists(st.sampled_from(_SPECIAL_BITS) | st.integers(0, 2**32 - 1), max_size=40))
def test_scale_stats_matches_the_per_value_definition(bits: list[int]) -> None:
    stats = scale_stats(struct.pack(f"<{len(bits)}I", *bits))
    assert (stats.bad, stats.negative, stats.zero, stats.non_finite, stats.subnormal, stats.first_bad) == _reference_stats(bits)


_ORDINARY_BITS = st.integers(0x0100_0000, 0x7EFF_FFFF)  # positive, normal, finite: top byte 0x01 … 0x7E


@given(st.lists(st.sampled_from(_SPECIAL_BITS) | st.integers(0, 2**32 - 1), max_size=40)
       | st.tuples(st.lists(_ORDINARY_BITS, min_size=1, max_size=200), st.lists(st.sampled_from(_SPECIAL_BITS) | st.integers(0, 2**32 - 1), max_size=3),
                   st.randoms()).map(lambda t: t[2].sample(t[0] + t[1], len(t[0]) + len(t[1]))),
       st.binary(max_size=3), st.sampled_from(["bytes", "bytearray", "memoryview"]))
def test_scale_stats_with_numpy_matches_the_stdlib_path(bits: list[int], tail: bytes, kind: str) -> None:
    """The numpy path (a min and a max over 32-bit words) decides exactly as the stdlib path and
    the per-value definition, whatever float32 patterns (normal, subnormal, ±0, negative, NaN,
    inf) sit at whatever positions; a trailing partial value is ignored by both."""
    import numpy

    packed = struct.pack(f"<{len(bits)}I", *bits) + tail
    raw = {"bytes": packed, "bytearray": bytearray(packed), "memoryview": memoryview(bytearray(packed))}[kind]
    with_numpy, stdlib = scale_stats(raw, numpy=numpy), scale_stats(raw)
    assert with_numpy == stdlib
    assert (stdlib.bad, stdlib.negative, stdlib.zero, stdlib.non_finite, stdlib.subnormal, stdlib.first_bad) == _reference_stats(bits)


def _scale_findings(ckpt: Path) -> list[tuple[str, str | None, str | None, str]]:
    return [(f.code, f.file, f.key, f.message) for f in preflight(ckpt, allow_custom_model=True).findings]


@pytest.mark.parametrize("path", ["numpy", "stdlib"])
@pytest.mark.parametrize("chunk", [4, 12, 40, 4096])
def test_the_scale_chunk_size_does_not_change_the_findings(tiny_checkpoint: Path, monkeypatch: pytest.MonkeyPatch,
                                                          path: str, chunk: int) -> None:
    """Bad scales on both sides of a chunk boundary and in a tensor's last, shorter chunk are
    counted whole, with the first one's coordinates, whatever the chunk size and path."""
    import numpy

    from nxdi_gptoss_fp8.validate import scales as checks

    for key, places in ((GATE_UP_SCALE, (2, 3, 9, 10)), (DOWN_SCALE, (-1,))):
        def change(tensors: dict[str, torch.Tensor], key: str = key, places: tuple[int, ...] = places) -> None:
            scale = tensors[key].clone()
            for index, value in zip(places, (0.0, float("nan"), -1.0, 1e-40), strict=False):
                scale.view(-1)[index] = value
            tensors[key] = scale
        edit_shard(tiny_checkpoint, shard_of(tiny_checkpoint, key), change)
    reference = _scale_findings(tiny_checkpoint)
    assert sum(code == "values.bad_scale" for code, *_ in reference) == 2
    monkeypatch.setattr(checks, "loaded_numpy", lambda: numpy if path == "numpy" else None)
    monkeypatch.setattr(checks, "cache_chunk_bytes", lambda: chunk)
    assert _scale_findings(tiny_checkpoint) == reference


def test_each_shard_is_opened_once_and_one_buffer_reads_every_scale(tiny_checkpoint: Path,
                                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    from nxdi_gptoss_fp8.safeio import reader as checks

    opened: list[str] = []
    buffers: set[int] = set()
    real_open = checks.open_regular

    class Recorder:
        def __init__(self, path: str, **kwargs: Any) -> None:
            opened.append(os.path.basename(path))
            self.handle = real_open(path, **kwargs)

        def __enter__(self) -> Recorder:
            return self

        def __exit__(self, *exc: object) -> None:
            self.handle.close()

        def seek(self, position: int) -> int:
            return self.handle.seek(position)

        def readinto(self, view: memoryview) -> int:
            buffers.add(id(view.obj))
            return self.handle.readinto(view)

    monkeypatch.setattr(checks, "open_regular", Recorder)
    report = preflight(tiny_checkpoint, allow_custom_model=True)
    assert report.ok, report.render_text()
    holding = {shard_of(tiny_checkpoint, key) for key in report.view.expected() if fmt.is_expert_scale(key)}
    assert sorted(opened) == sorted(holding) and len(buffers) == 1


@pytest.mark.parametrize("fault", ["unreadable", "shrank"])
def test_a_shard_failing_while_its_scales_are_read_is_one_finding_per_scale(
        tiny_checkpoint: Path, monkeypatch: pytest.MonkeyPatch, fault: str) -> None:
    """A shard that cannot be opened, or ends early, after its header was read: each of its
    scale tensors gets the finding, in key order; the other shards' scales are still checked."""
    import errno
    import io

    from nxdi_gptoss_fp8.safeio import reader as checks

    broken = shard_of(tiny_checkpoint, GATE_UP_SCALE)
    assert shard_of(tiny_checkpoint, DOWN_SCALE) != broken
    _set_scale_value(0.0, DOWN_SCALE)(tiny_checkpoint)  # in a shard that still reads
    real_open = checks.open_regular

    def failing_open(path: str, **kwargs: Any) -> Any:
        if os.path.basename(path) != broken:
            return real_open(path, **kwargs)
        if fault == "unreadable":
            raise PermissionError(errno.EACCES, "Permission denied", path)
        return io.BytesIO(b"")  # every read returns nothing: the file ended
    monkeypatch.setattr(checks, "open_regular", failing_open)
    report = preflight(tiny_checkpoint, allow_custom_model=True)
    code = "filesystem.unreadable" if fault == "unreadable" else "header.data_beyond_file"
    hit = [f for f in report.findings if f.code == code]
    scales_there = sorted(key for key in report.view.expected() if fmt.is_expert_scale(key)
                          and shard_of(tiny_checkpoint, key) == broken)
    assert [f.key for f in hit] == scales_there and {f.file for f in hit} == {broken}
    assert all(("Permission denied" if fault == "unreadable" else "ended while reading") in f.message for f in hit)
    assert [f.key for f in report.findings if f.code == "values.bad_scale"] == [DOWN_SCALE]


def test_preflight_never_writes(tiny_checkpoint: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """docs/format.md, Bounds and trust: nothing is opened for writing, nothing in the directory changes."""
    import builtins

    from nxdi_gptoss_fp8 import cli

    before = {path: path.stat().st_mtime_ns for path in tiny_checkpoint.rglob("*")}
    writes: list[str] = []
    real_os_open, real_open = os.open, builtins.open
    write_flags = os.O_WRONLY | os.O_RDWR | os.O_CREAT | os.O_TRUNC | os.O_APPEND

    def os_open(path: Any, flags: int, *args: Any, **kwargs: Any) -> int:
        if flags & write_flags:
            writes.append(os.fspath(path))
        return real_os_open(path, flags, *args, **kwargs)

    def plain_open(file: Any, mode: str = "r", *args: Any, **kwargs: Any) -> Any:
        if set(mode) & set("wax+"):
            writes.append(str(file))
        return real_open(file, mode, *args, **kwargs)

    monkeypatch.setattr(os, "open", os_open)
    monkeypatch.setattr(builtins, "open", plain_open)
    report = preflight(tiny_checkpoint, allow_custom_model=True, deep=True, verify_checksums=True,
                       neuron_config={"quantized": True, "quantization_dtype": fmt.QUANTIZATION_DTYPE,
                                      "quantization_type": fmt.QUANTIZATION_TYPE, "modules_to_not_convert": ["self_attn", "lm_head"]})
    assert report.ok, report.render_text()
    assert cli.main(["validate", str(tiny_checkpoint), "--allow-custom-model", "--deep", "--verify-checksums"]) == 0
    assert cli.main(["inspect", str(tiny_checkpoint), "--allow-custom-model"]) == 0
    monkeypatch.undo()
    assert writes == []
    assert {path: path.stat().st_mtime_ns for path in tiny_checkpoint.rglob("*")} == before


@pytest.mark.parametrize(("folder", "fix"), [
    ("original", "move it out"),
    ("neuron-compiled-artifacts", "export NEURON_COMPILED_ARTIFACTS=DIR"),  # where vllm-neuron compiles when it is unset
])
def test_a_nested_weight_set_is_a_warning_with_its_own_fix(tiny_checkpoint: Path, folder: str, fix: str) -> None:
    nested = tiny_checkpoint / folder / "0123abcd" if folder != "original" else tiny_checkpoint / folder
    nested.mkdir(parents=True)
    (nested / "model.safetensors").write_bytes(b"\x00" * 16)
    report = preflight(tiny_checkpoint, allow_custom_model=True)
    (finding,) = [f for f in report.findings if f.code == "filesystem.nested_weight_files"]
    assert report.ok and finding.severity == Severity.WARNING and finding.file == folder
    assert fix in finding.message and (folder == "original") == ("NEURON_COMPILED_ARTIFACTS" not in finding.message)


@pytest.mark.parametrize("inside", [
    "neuron-compiled-artifacts/0123abcd/weights/tp0_sharded_checkpoint.safetensors",  # what vLLM writes: depth 3
    "neuron-compiled-artifacts/0123abcd/tp0_sharded_checkpoint.safetensors",
    "neuron-compiled-artifacts/model.safetensors",
    "neuron-compiled-artifacts/a/b/c/d/weights/tp0_sharded_checkpoint.safetensors",
    "cache/neuron-compiled-artifacts/0123abcd/weights/tp0_sharded_checkpoint.safetensors",  # the folder deeper down
    "neuron-compiled-artifacts/0123abcd/",  # a compile that has written no weights yet
])
def test_vllms_compile_folder_is_warned_at_any_depth(tiny_checkpoint: Path, inside: str) -> None:
    """vLLM's ``neuron-compiled-artifacts/`` inside the checkpoint, wherever it sits and however
    deep its weight files: one warning under that folder, with the NEURON_COMPILED_ARTIFACTS fix."""
    path = tiny_checkpoint / inside
    if inside.endswith("/"):
        path.mkdir(parents=True)
    else:
        path.parent.mkdir(parents=True)
        path.write_bytes(b"\x00" * 16)
    report = preflight(tiny_checkpoint, allow_custom_model=True)
    (finding,) = [f for f in report.findings if f.code == "filesystem.nested_weight_files"]
    folder = inside[:inside.index("neuron-compiled-artifacts") + len("neuron-compiled-artifacts")]
    assert report.ok and finding.severity == Severity.WARNING and finding.file == folder
    assert "export NEURON_COMPILED_ARTIFACTS=DIR" in finding.message


def test_the_nested_search_is_bounded_and_follows_no_link(tiny_checkpoint: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A link loop is never followed, a tree deeper than NESTED_SEARCH_DEPTH is not descended
    further, and no more than NESTED_SEARCH_ENTRIES entries are listed."""
    from nxdi_gptoss_fp8.validate import directory

    (tiny_checkpoint / "loop").mkdir()
    (tiny_checkpoint / "loop" / "back").symlink_to(tiny_checkpoint, target_is_directory=True)
    deep = tiny_checkpoint.joinpath(*["d"] * (directory.NESTED_SEARCH_DEPTH + 2))
    deep.mkdir(parents=True)
    (deep / "model.safetensors").write_bytes(b"\x00" * 16)
    listed: list[str] = []
    real_scandir = os.scandir

    def counting(path: str) -> Any:
        listed.append(os.path.relpath(path, tiny_checkpoint))
        return real_scandir(path)

    monkeypatch.setattr(directory.os, "scandir", counting)
    report = preflight(tiny_checkpoint, allow_custom_model=True)
    assert not [f for f in report.findings if f.code == "filesystem.nested_weight_files"]  # too deep: not reached
    assert not any("back" in p.split(os.sep) for p in listed)  # the link is not entered
    assert max(len(p.split(os.sep)) for p in listed if p.startswith("d")) == directory.NESTED_SEARCH_DEPTH
    monkeypatch.setattr(directory, "NESTED_SEARCH_ENTRIES", 3)
    listed.clear()
    preflight(tiny_checkpoint, allow_custom_model=True)
    assert len([p for p in listed if p.startswith("d")]) <= 1  # the budget ends the walk
