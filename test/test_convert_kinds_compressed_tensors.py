"""compressed-tensors FP8 sources: exact conversion, the gate/up split variants, every refusal, verification."""

from __future__ import annotations

import json
import os
import shutil
from collections.abc import Callable
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from nxdi_gptoss_fp8 import format as fmt
from nxdi_gptoss_fp8.cli import main
from nxdi_gptoss_fp8.convert import SOURCE_COMPRESSED_TENSORS, SPLIT_HALVES, SPLIT_INTERLEAVED, convert, open_source
from nxdi_gptoss_fp8.convert.fp8 import FP8_DTYPE
from nxdi_gptoss_fp8.convert.verify import verify_conversion
from nxdi_gptoss_fp8.errors import ConversionError
from nxdi_gptoss_fp8.synthetic.sources import (
    SOURCE_DIMS,
    compressed_tensors_config,
    compressed_tensors_tensors,
    make_compressed_tensors_source,
    source_tensors,
    write_transformers_shards,
)
from nxdi_gptoss_fp8.validate.pipeline import preflight

HP, IP = 96, 128
EXPERT = "model.layers.{layer}.mlp.experts.{nest}{expert}.{proj}."


def load_all(root: Path) -> dict[str, torch.Tensor]:
    tensors: dict[str, torch.Tensor] = {}
    for shard in sorted(root.glob("*.safetensors")):
        tensors.update(load_file(str(shard)))
    return tensors


def expected_experts(source: dict[str, torch.Tensor], layer: int, split: str, nested: bool) -> dict[str, torch.Tensor]:
    """q × scale of the source in float64, laid out [E, H', 2I'] / [E, I', H'] the NxDI way."""
    e, h, i = SOURCE_DIMS.num_local_experts, SOURCE_DIMS.hidden_size, SOURCE_DIMS.intermediate_size
    gate_up = torch.zeros((e, HP, 2 * IP), dtype=torch.float64)
    down = torch.zeros((e, IP, HP), dtype=torch.float64)
    for expert in range(e):
        def value(proj: str, expert: int = expert) -> torch.Tensor:
            prefix = EXPERT.format(layer=layer, nest="experts." if nested else "", expert=expert, proj=proj)
            return source[prefix + "weight"].double() * source[prefix + "weight_scale"].double()  # [out, in]

        gate, up = value("gate_proj"), value("up_proj")
        if split == SPLIT_HALVES:  # the fused [2I, H] rows, interleaved
            fused = torch.cat((gate, up))
            gate, up = fused[0::2], fused[1::2]
        gate_up[expert, :h, :i] = gate.t()
        gate_up[expert, :h, IP:IP + i] = up.t()
        down[expert, :i, :h] = value("down_proj").t()
    return {fmt.GATE_UP: gate_up, fmt.DOWN: down}


def with_bottom_values(tensors: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Put values of E4M3's bottom binade in layer 0 expert 1's gate: odd ones round when halved."""
    name = EXPERT.format(layer=0, nest="", expert=1, proj="gate_proj") + "weight"
    q = tensors[name].view(torch.uint8).clone()
    q[0, :6] = torch.tensor([0x01, 0x81, 0x03, 0x02, 0x0F, 0x08], dtype=torch.uint8)  # 2^-9, -2^-9, 3·2^-9, …
    tensors[name] = q.view(FP8_DTYPE)
    return tensors


@pytest.fixture(scope="module")
def variants(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("ct")
    bf16 = source_tensors(SOURCE_DIMS, "hf-bf16", seed=3)
    made = {}
    for label, split, nested, version in (("A", SPLIT_INTERLEAVED, False, "4.57.1"),
                                          ("B", SPLIT_INTERLEAVED, True, "4.57.1"),
                                          ("C", SPLIT_HALVES, False, "5.0.0"),
                                          ("D", SPLIT_INTERLEAVED, False, "5.2.1")):
        tensors = compressed_tensors_tensors(bf16, SOURCE_DIMS, split=split, nested=nested)
        if label == "A":
            tensors = with_bottom_values(tensors)
        config = compressed_tensors_config(SOURCE_DIMS, transformers_version=version)
        made[label] = write_transformers_shards(root / label, tensors, config, shards=3)
    return made


@pytest.mark.parametrize("label, split, nested", [("A", SPLIT_INTERLEAVED, False), ("B", SPLIT_INTERLEAVED, True),
                                                  ("C", SPLIT_HALVES, False), ("D", SPLIT_INTERLEAVED, False)])
def test_conversion_is_exact_except_the_counted_values(variants: dict[str, Path], tmp_path: Path, label: str,
                                                       split: str, nested: bool) -> None:
    stated = split if label in "CD" else None
    report = convert(variants[label], tmp_path / "out", padded_hidden_size=HP, padded_intermediate_size=IP,
                     max_shard_size="60KB", gate_up_split=stated, progress=False)
    checked = preflight(tmp_path / "out", allow_custom_model=True, deep=True, verify_checksums=True)
    assert checked.ok, checked.render_text()
    assert report.source_format == SOURCE_COMPRESSED_TENSORS
    e, h, i = SOURCE_DIMS.num_local_experts, SOURCE_DIMS.hidden_size, SOURCE_DIMS.intermediate_size
    assert report.fp8_values == SOURCE_DIMS.num_hidden_layers * e * 3 * h * i
    out, source = load_all(tmp_path / "out"), load_all(variants[label])
    mismatches, flushed, worst = 0, 0, 0.0
    for layer in range(SOURCE_DIMS.num_hidden_layers):
        expected = expected_experts(source, layer, split, nested)
        for proj in (fmt.GATE_UP, fmt.DOWN):
            weight, scale = out[f"layers.{layer}.{proj}.weight"], out[f"layers.{layer}.{proj}.scale"]
            assert scale.dtype == torch.float32 and scale.shape == (e, 1, weight.shape[2])
            assert float(weight.float().abs().max()) <= 240.0
            got, want = weight.double() * scale.double(), expected[proj]
            wrong = got != want
            mismatches += int(wrong.sum())
            flushed += int((wrong & (got == 0)).sum())
            rounded = wrong & (got != 0)
            if bool(rounded.any()):  # a value flushed to zero is counted apart, not as relative error 1
                worst = max(worst, float(((got - want).abs()[rounded] / want.abs()[rounded]).max()))
            if bool(wrong.any()):
                assert bool((want.abs()[wrong] < 2.0**-5 * scale.double().expand_as(want)[wrong]).all()), \
                    "only values of the bottom binade may round"
    assert mismatches == report.inexact_values and flushed == report.flushed_to_zero
    assert report.max_rel_error == pytest.approx(worst) and report.max_rel_error < 1.0
    text = report.render_text()
    assert "relative error 1\n" not in text + "\n" and "relative error 1 " not in text
    verified = verify_conversion(tmp_path / "out", variants[label], gate_up_split=stated)
    assert verified.ok and sum(row.flushed for row in verified.rows) == report.flushed_to_zero
    assert max(row.max_rel_error for row in verified.rows) < 1.0
    if label == "A":
        # 2^-9 and -2^-9 flush to zero, 3·2^-9 and 15·2^-9 round (with the random source's own few)
        assert report.inexact_values >= 4 and report.flushed_to_zero >= 2
        assert f"{report.flushed_to_zero:,} flushed to zero" in text
        assert f"{report.inexact_values - report.flushed_to_zero:,} rounded (worst relative error" in text
    index = json.loads((tmp_path / "out" / fmt.INDEX_FILE).read_text())
    assert index["metadata"]["source"]["gate_up_split"] == split
    assert index["metadata"]["source"]["format"] == SOURCE_COMPRESSED_TENSORS
    config = json.loads((tmp_path / "out" / fmt.CONFIG_FILE).read_text())
    assert config["quantization_config"]["quant_method"] != "compressed-tensors"


def test_every_variant_gives_the_same_experts_as_the_bf16_origin(variants: dict[str, Path], tmp_path: Path) -> None:
    """B, C (halves, stated) and D hold the same quantized values as A: their outputs agree."""
    outputs = {}
    for label, stated in (("B", None), ("C", SPLIT_HALVES), ("D", SPLIT_INTERLEAVED)):
        convert(variants[label], tmp_path / label, gate_up_split=stated, progress=False)
        outputs[label] = load_all(tmp_path / label)
    for name, tensor in outputs["B"].items():
        if "expert_mlps" in name:
            assert torch.equal(tensor.view(torch.uint8) if tensor.dtype == FP8_DTYPE else tensor,
                               outputs["C"][name].view(torch.uint8) if tensor.dtype == FP8_DTYPE else outputs["C"][name])
            assert torch.equal(outputs["C"][name].float(), outputs["D"][name].float()), name


def test_the_wrong_split_gives_different_experts(variants: dict[str, Path], tmp_path: Path) -> None:
    right = convert(variants["C"], tmp_path / "right", gate_up_split=SPLIT_HALVES, progress=False)
    wrong = convert(variants["C"], tmp_path / "wrong", gate_up_split=SPLIT_INTERLEAVED, progress=False)
    assert right.fp8_values == wrong.fp8_values
    name = f"layers.0.{fmt.GATE_UP}.weight"
    assert not torch.equal(load_all(tmp_path / "right")[name].float(), load_all(tmp_path / "wrong")[name].float())


@pytest.mark.parametrize("label, stated", [("A", None), ("B", None), ("C", SPLIT_HALVES), ("D", SPLIT_INTERLEAVED)])
def test_conversions_verify(variants: dict[str, Path], tmp_path: Path, label: str, stated: str | None) -> None:
    converted = convert(variants[label], tmp_path / "out", padded_intermediate_size=IP, gate_up_split=stated,
                        progress=False)
    report = verify_conversion(tmp_path / "out", variants[label])  # the split recorded in OUT is used
    assert report.ok, report.render_text()
    assert sum(row.inexact for row in report.rows) == converted.inexact_values
    assert report.source_format == SOURCE_COMPRESSED_TENSORS


def test_verification_catches_a_wrong_scale(variants: dict[str, Path], tmp_path: Path) -> None:
    convert(variants["A"], tmp_path / "out", progress=False)
    index = json.loads((tmp_path / "out" / fmt.INDEX_FILE).read_text())
    name = f"layers.1.{fmt.DOWN}.scale"
    shard = tmp_path / "out" / index["weight_map"][name]
    tensors = load_file(str(shard))
    tensors[name] = tensors[name] * 2  # a scale doubled twice
    save_file(tensors, str(shard), metadata={"format": "pt"})
    index["metadata"].pop("shard_sha256", None)
    (tmp_path / "out" / fmt.INDEX_FILE).write_text(json.dumps(index))
    report = verify_conversion(tmp_path / "out", variants["A"])
    assert not report.ok and any("violate" in problem for problem in report.problems)


def _halved_table() -> tuple[torch.Tensor, torch.Tensor]:
    """uint8 [256]: the E4M3 byte of half of each byte's value (round to nearest even), and
    whether that half is exact: the reference the converter's integer halving is tested against."""
    values = torch.arange(256, dtype=torch.int32).to(torch.uint8).view(FP8_DTYPE).float()
    halves = (values * 0.5).to(FP8_DTYPE)
    exact = (halves.float() * 2 == values) | torch.isnan(values)
    return halves.view(torch.uint8), exact


HALVED, HALVED_EXACT = _halved_table()
# the bytes whose half E4M3 cannot hold: (byte & mask) == 1, magnitude below 0x10 with an odd mantissa
ODD_BOTTOM_MASK = 0x71


def test_halving_tables_agree_with_float_arithmetic() -> None:
    """Every E4M3 byte: the table halves like float arithmetic, the cheap odd-bottom mask flags
    exactly the bytes whose half is not exact, and the converter's relative error of each
    bottom-binade magnitude is the table's."""
    from nxdi_gptoss_fp8.convert.kinds import compressed_tensors as ct

    codes = torch.arange(256, dtype=torch.int32).to(torch.uint8)
    finite = (codes & 0x7F) != 0x7F
    values = codes.view(FP8_DTYPE).float()
    halves = HALVED.view(FP8_DTYPE).float()
    assert torch.equal(halves[finite], (values[finite] / 2).to(FP8_DTYPE).float())
    assert torch.equal(((codes & ODD_BOTTOM_MASK) == 1)[finite], ~HALVED_EXACT[finite])
    bottom = codes[1:16].view(FP8_DTYPE).double()
    expected = (HALVED[1:16].view(FP8_DTYPE).double() * 2 - bottom).abs() / bottom
    assert torch.equal(ct._ROUNDED_REL_ERROR[1:], expected) and float(ct._ROUNDED_REL_ERROR[0]) == 0.0


# --------------------------------------------------------------------------- refusals


def _quant(config: dict) -> dict:
    return config["quantization_config"]


def _weights(config: dict) -> dict:
    return _quant(config)["config_groups"]["group_0"]["weights"]


def _retype_expert_weights(tensors: dict[str, torch.Tensor], make: Callable[[torch.Tensor], torch.Tensor]) -> None:
    for name in [n for n in tensors if n.endswith("_proj.weight") and ".experts." in n]:
        tensors[name] = make(tensors[name])


def _int8(tensors: dict, config: dict) -> None:
    _retype_expert_weights(tensors, lambda q: q.float().clamp(-127, 127).to(torch.int8))
    _quant(config)["format"] = "int-quantized"
    _weights(config)["type"] = "int"


def _group(tensors: dict, config: dict) -> None:
    for name in [n for n in tensors if n.endswith("weight_scale")]:
        tensors[name] = tensors[name].repeat(1, 2)
    _weights(config).update(strategy="group", group_size=32)


def _block(tensors: dict, config: dict) -> None:
    _weights(config).update(strategy="block", block_structure=[128, 128])


def _tensor_strategy(tensors: dict, config: dict) -> None:
    for name in [n for n in tensors if n.endswith("weight_scale")]:
        tensors[name] = tensors[name][:1, 0].clone()
    _weights(config)["strategy"] = "tensor"


def _static_activations(tensors: dict, config: dict) -> None:
    for name in [n for n in tensors if n.endswith("weight_scale")]:
        tensors[name.replace("weight_scale", "input_scale")] = torch.ones(1, dtype=torch.bfloat16)
    _quant(config)["config_groups"]["group_0"]["input_activations"].update(dynamic=False, strategy="tensor")


def _static_scales_only(tensors: dict, config: dict) -> None:
    name = next(n for n in tensors if n.endswith("weight_scale"))
    tensors[name.replace("weight_scale", "input_scale")] = torch.ones(1, dtype=torch.bfloat16)


def _experts_ignored(tensors: dict, config: dict) -> None:
    _quant(config)["ignore"].append("re:.*mlp.experts.*down_proj$")


def _experts_unquantized(tensors: dict, config: dict) -> None:
    for name in [n for n in tensors if n.endswith(".experts.2.up_proj.weight")]:
        scale = tensors.pop(name + "_scale")
        tensors[name] = (tensors[name].float() * scale.float()).to(torch.bfloat16)


def _attention_quantized(tensors: dict, config: dict) -> None:
    tensors["model.layers.0.self_attn.q_proj.weight_scale"] = torch.ones((SOURCE_DIMS.num_attention_heads
                                                                          * SOURCE_DIMS.head_dim, 1))


REFUSALS: dict[str, tuple[Callable[[dict, dict], None], str]] = {
    "int8": (_int8, "format is 'int-quantized'"),
    "int8_tensors_only": (lambda t, c: _retype_expert_weights(t, lambda q: q.float().to(torch.int8)), "int8 expert"),
    "group_strategy": (_group, "strategy is 'group'"),
    "group_scales_only": (lambda t, c: _group(t, {"quantization_config": {"config_groups": {"group_0": {
        "weights": {}}}}}), "not per-channel [out, 1]"),
    "block_strategy": (_block, "strategy is 'block'"),
    "tensor_strategy": (_tensor_strategy, "strategy is 'tensor'"),
    "static_activations": (_static_activations, "are static (input_scale tensors)"),
    "input_scale_present": (_static_scales_only, "is a static activation scale"),
    "experts_ignored": (_experts_ignored, "leaves expert model.layers.0.mlp.experts.0.down_proj unquantized"),
    "experts_unquantized": (_experts_unquantized, "BF16 (unquantized expert)"),
    "attention_quantized": (_attention_quantized, "quantizes a non-expert layer"),
    "pack_quantized": (lambda t, c: _quant(c).update(format="pack-quantized"), "format is 'pack-quantized'"),
    "group_format": (lambda t, c: _quant(c)["config_groups"]["group_0"].update(format="naive-quantized"),
                     "group_0.format is 'naive-quantized'"),
    "asymmetric": (lambda t, c: _weights(c).update(symmetric=False), "symmetric is False"),
    "four_bits": (lambda t, c: _weights(c).update(num_bits=4), "num_bits is 4"),
    "dynamic_weights": (lambda t, c: _weights(c).update(dynamic=True), "dynamic is True"),
    "activation_order": (lambda t, c: _weights(c).update(actorder="group"), "actorder is 'group'"),
    "output_activations": (lambda t, c: _quant(c)["config_groups"]["group_0"].update(
        output_activations={"num_bits": 8}), "output_activations are quantized"),
    "transforms": (lambda t, c: _quant(c).update(transform_config={"config_groups": {"u": {}}}), "transform_config"),
    "kv_cache": (lambda t, c: _quant(c).update(kv_cache_scheme={"num_bits": 8}), "kv_cache_scheme"),
    "sparsity": (lambda t, c: _quant(c).update(sparsity_config={"format": "sparse-24-bitmask"}), "sparsity_config"),
    "frozen": (lambda t, c: _quant(c).update(quantization_status="frozen"), "were not saved compressed"),
    "no_groups": (lambda t, c: _quant(c).update(config_groups={}), "config_groups is missing or empty"),
    "other_method": (lambda t, c: _quant(c).update(quant_method="fp8"), "quant_method is 'fp8'"),
    "no_quantization_config": (lambda t, c: c.pop("quantization_config"), "quant_method is None"),
    "nan_byte": (lambda t, c: t["model.layers.1.mlp.experts.0.down_proj.weight"].view(torch.uint8).__setitem__(
        (3, 5), 0x7F), "row 3 holds a NaN byte"),
    "zero_scale": (lambda t, c: t["model.layers.1.mlp.experts.2.gate_proj.weight_scale"].__setitem__(
        (4, 0), 0.0), "row 4 has weight_scale 0.0"),
}


@pytest.mark.parametrize("case", sorted(REFUSALS))
def test_other_compressed_tensors_schemes_are_refused(case: str, tmp_path: Path) -> None:
    tensors = compressed_tensors_tensors(source_tensors(SOURCE_DIMS, "hf-bf16"), SOURCE_DIMS)
    config = compressed_tensors_config(SOURCE_DIMS)
    mutate, message = REFUSALS[case]
    mutate(tensors, config)
    src = write_transformers_shards(tmp_path / "src", tensors, config, shards=2)
    with pytest.raises(ConversionError, match=message.replace("(", r"\(").replace(")", r"\)").replace("[", r"\[")) as caught:
        convert(src, tmp_path / "out", progress=False)
    assert "\n" not in str(caught.value)
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("label, stated, message", [
    ("C", None, "cannot be told from its files"),
    ("D", "sideways", "use one of interleaved, halves"),
    ("A", SPLIT_HALVES, "contradicts the checkpoint: transformers_version 4.57.1"),
    ("B", SPLIT_HALVES, "contradicts the checkpoint: experts.experts.E names"),
])
def test_the_split_is_never_guessed(variants: dict[str, Path], label: str, stated: str | None, message: str) -> None:
    with pytest.raises(ConversionError, match=message) as caught:
        open_source(variants[label], gate_up_split=stated)
    if stated is None:
        assert "halves" in str(caught.value) and "0.12.0 to 0.13.0" in str(caught.value)


def test_a_single_file_source_converts(tmp_path: Path) -> None:
    src = make_compressed_tensors_source(tmp_path / "src", shards=1)
    assert sorted(os.listdir(src)) == ["config.json", "model.safetensors"]
    assert convert(src, tmp_path / "out", progress=False).source_format == SOURCE_COMPRESSED_TENSORS


def test_cli_split_option(variants: dict[str, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["convert", str(variants["C"]), str(tmp_path / "out")]) == 2
    error = capsys.readouterr().err
    assert "--ct-gate-up-split" in error and error.count("\n") == 1
    assert main(["convert", str(variants["C"]), str(tmp_path / "out"), "--ct-gate-up-split", "halves"]) == 0
    capsys.readouterr()
    assert main(["verify-conversion", str(tmp_path / "out"), "--source", str(variants["C"]),
                 "--ct-gate-up-split", "halves"]) == 0
    assert "OK: every value within its bound" in capsys.readouterr().out


# --------------------------------------------------------------------------- inputs that are not files


@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="needs FIFOs")
@pytest.mark.parametrize("which", ["config.json", "model.safetensors.index.json", "model-00001-of-00003.safetensors"])
def test_fifo_inputs_are_refused_without_blocking(variants: dict[str, Path], tmp_path: Path, which: str) -> None:
    src = Path(shutil.copytree(variants["A"], tmp_path / "src"))
    (src / which).unlink()
    os.mkfifo(src / which)
    with pytest.raises(ConversionError, match="FIFO"):
        convert(src, tmp_path / "out", progress=False)


def test_a_directory_named_like_a_shard_is_refused(variants: dict[str, Path], tmp_path: Path) -> None:
    src = Path(shutil.copytree(variants["A"], tmp_path / "src"))
    (src / "model-00002-of-00003.safetensors").unlink()
    (src / "model-00002-of-00003.safetensors").mkdir()
    with pytest.raises(ConversionError, match="is a directory, not a regular file"):
        convert(src, tmp_path / "out", progress=False)


def test_integer_halving_matches_the_table_for_every_byte() -> None:
    """The integer halving (exponent − 1, bottom binades m/2 rounded to even) gives the table's
    byte for every finite E4M3 byte, and counts exactly the bytes the table marks inexact."""
    from nxdi_gptoss_fp8.convert.kinds import compressed_tensors as ct

    codes = torch.tensor([c for c in range(256) if c & 0x7F != 0x7F], dtype=torch.uint8)
    rows = torch.stack([codes, codes.flip(0)])  # every row reaches 448: both are halved
    out, scale, exactness = ct._neuron_range(rows, torch.ones(2, 1, dtype=torch.bfloat16), "x")
    assert torch.equal(out, HALVED[rows.to(torch.int32)])
    assert torch.equal(scale, torch.full((2,), 2.0))
    assert exactness.inexact == 2 * int((~HALVED_EXACT[codes.to(torch.int32)]).sum())
    assert exactness.flushed_to_zero == 4  # +-2^-9 in each row: counted apart
    assert exactness.max_rel_error == pytest.approx(1 / 3)  # the worst non-zero rounding: 3·2^-9 halves to 1.5·2^-9, stored as 2·2^-9


@pytest.mark.parametrize("proj", [fmt.GATE_UP, fmt.DOWN])
def test_verification_names_a_changed_fp8_byte(variants: dict[str, Path], tmp_path: Path, proj: str) -> None:
    """The byte comparison hands a differing row to the float comparison, which names the value."""
    converted = convert(variants["A"], tmp_path / "out", progress=False)
    index = json.loads((tmp_path / "out" / fmt.INDEX_FILE).read_text())
    name = f"layers.0.{proj}.weight"
    shard = tmp_path / "out" / index["weight_map"][name]
    tensors = load_file(str(shard))
    raw = tensors[name].view(torch.uint8).clone()
    normal = ((raw[1] & 0x78) >= 0x08) & ((raw[1] & 0x78) <= 0x58)
    c, col = (int(i) for i in normal.nonzero()[-1])
    raw[1, c, col] += 0x10  # four times the value
    tensors[name] = raw.view(FP8_DTYPE)
    save_file(tensors, str(shard), metadata={"format": "pt"})
    index["metadata"].pop("shard_sha256", None)
    (tmp_path / "out" / fmt.INDEX_FILE).write_text(json.dumps(index))
    report = verify_conversion(tmp_path / "out", variants["A"])
    assert report.violations == 1, report.render_text()
    assert any(f"[{c}, {col}]" in problem for problem in report.problems), report.problems
    assert sum(row.inexact for row in report.rows) == converted.inexact_values
