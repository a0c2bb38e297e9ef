"""verify-conversion: clean conversions pass; each known silent corruption is caught."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest
import torch

from nxdi_gptoss_fp8 import convert as conversion
from nxdi_gptoss_fp8 import format as fmt
from nxdi_gptoss_fp8.cli import main
from nxdi_gptoss_fp8.convert import kernels, layout, mxfp4, output
from nxdi_gptoss_fp8.convert.kinds import hf_mxfp4
from nxdi_gptoss_fp8.convert.verify import verify_conversion
from nxdi_gptoss_fp8.convert.verify_values import nonzero
from nxdi_gptoss_fp8.errors import ConversionError
from nxdi_gptoss_fp8.safeio.safetensors_header import read_header
from nxdi_gptoss_fp8.synthetic.sources import SOURCE_BF16, SOURCE_DIMS, SOURCE_MXFP4, make_source

conversion_place_gate_up = conversion.place_gate_up


@pytest.fixture(scope="module")
def sources(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("sources")
    return {
        SOURCE_MXFP4: make_source(root / "mxfp4", SOURCE_MXFP4),
        SOURCE_BF16: make_source(root / "bf16", SOURCE_BF16),
        "mxfp4-wide": make_source(root / "mxfp4-wide", SOURCE_MXFP4, scale_range=(90, 130), seed=2),
        "mxfp4-other": make_source(root / "mxfp4-other", SOURCE_MXFP4, seed=9),
    }


@pytest.mark.parametrize("kind", [SOURCE_MXFP4, SOURCE_BF16, "mxfp4-wide"])
@pytest.mark.parametrize("padded", [False, True])
def test_a_clean_conversion_verifies(sources: dict[str, Path], tmp_path: Path, kind: str, padded: bool) -> None:
    sizes = {"padded_hidden_size": 96, "padded_intermediate_size": 128} if padded else {}
    converted = conversion.convert(sources[kind], tmp_path / "out", progress=False, **sizes)
    report = verify_conversion(tmp_path / "out", sources[kind])
    assert report.ok, report.render_text()
    assert [row.layer for row in report.rows] == ["global", "0", "1"]
    assert all(row.tensors == 19 for row in report.rows[1:]) and report.rows[0].tensors == 3
    values = sum(row.values for row in report.rows)
    hp, ip = (96, 128) if padded else (64, 96)
    assert values == SOURCE_DIMS.num_hidden_layers * SOURCE_DIMS.num_local_experts * 3 * hp * ip
    inexact = sum(row.inexact for row in report.rows)
    if kind == SOURCE_MXFP4:
        assert inexact == 0
    elif kind == "mxfp4-wide":
        assert inexact == converted.inexact_values > 0
    else:
        assert inexact > 0 and max(row.max_rel_error for row in report.rows) > 0
    text = report.render_text()
    assert "OK: every value within its bound" in text and "2^-4" in text


def _swapped_gate_up(rows: torch.Tensor, out: torch.Tensor, first_row: int = 0) -> None:
    conversion_place_gate_up(rows.view(-1, 2, rows.shape[1]).flip(1).reshape(rows.shape), out, first_row)


def _untransposed_down(rows: torch.Tensor, out: torch.Tensor, first_row: int = 0) -> None:
    count, i = rows.shape
    out[:i, first_row:first_row + count].copy_(rows.reshape(i, count))  # the bytes of [n, I] read as [I, n]


def _break(monkeypatch: pytest.MonkeyPatch, corruption: str) -> None:
    if corruption == "gate_up_order_swapped":
        real_chunks = conversion.chunk_interleaved

        def swapped_chunks(values: torch.Tensor, padded: int, fill: float) -> torch.Tensor:
            return real_chunks(values.reshape(*values.shape[:-1], -1, 2).flip(-1).reshape(values.shape), padded, fill)

        monkeypatch.setattr(kernels, "AVAILABLE", False)  # the torch path's layout helpers
        monkeypatch.setattr(hf_mxfp4, "place_gate_up", _swapped_gate_up)
        monkeypatch.setattr(layout, "chunk_interleaved", swapped_chunks)
        monkeypatch.setattr(output, "chunk_interleaved", swapped_chunks)
    elif corruption == "missing_transpose":
        monkeypatch.setattr(kernels, "AVAILABLE", False)
        monkeypatch.setattr(hf_mxfp4, "place_down", _untransposed_down)
    elif corruption == "compiled_gate_up_halves_swapped":
        if not kernels.AVAILABLE:
            pytest.skip("the compiled encoders are not built here")
        real_destinations = kernels.gate_up_destinations

        def swapped(rows: int, padded_half: int, first: int = 0) -> torch.Tensor:
            return (real_destinations(rows, padded_half, first) + padded_half) % (2 * padded_half)

        monkeypatch.setattr(kernels, "gate_up_destinations", swapped)
    elif corruption == "nibble_order_swapped":
        monkeypatch.setattr(mxfp4, "_BYTE_TABLE", mxfp4.build_byte_table(low_nibble_first=False))
    elif corruption == "exponent_bias_off_by_one":
        real_scale = mxfp4.scale_values
        monkeypatch.setattr(mxfp4, "scale_values", lambda t: real_scale(t + 1))
    else:
        raise AssertionError(corruption)


@pytest.mark.parametrize("corruption", ["gate_up_order_swapped", "missing_transpose", "nibble_order_swapped",
                                        "exponent_bias_off_by_one", "compiled_gate_up_halves_swapped"])
def test_known_silent_corruptions_are_caught(sources: dict[str, Path], tmp_path: Path,
                                             monkeypatch: pytest.MonkeyPatch, corruption: str) -> None:
    with monkeypatch.context() as patch:
        _break(patch, corruption)
        conversion.convert(sources[SOURCE_MXFP4], tmp_path / "out", progress=False)
    report = verify_conversion(tmp_path / "out", sources[SOURCE_MXFP4])
    assert not report.ok
    assert sum(row.violations for row in report.rows) > 0
    assert any("violate" in message for message in report.problems)
    assert "FAILED" in report.render_text()


def _tensor_offset(out: Path, name: str) -> tuple[Path, int]:
    index = json.loads((out / fmt.INDEX_FILE).read_text())
    shard = out / index["weight_map"][name]
    header = read_header(shard)
    return shard, header.data_offset + header.tensors[name].begin


def _poke(out: Path, name: str, data: bytes, at: int = 0) -> None:
    shard, offset = _tensor_offset(out, name)
    with open(shard, "r+b") as handle:
        handle.seek(offset + at)
        handle.write(data)


@pytest.mark.parametrize("name, data, at, expect", [
    ("layers.1.self_attn.learned_sinks.sink", b"\x01", 0, "not bit-exact"),
    ("embed_tokens.weight", b"\x00\x3f", 2 * 64 * 39, "not bit-exact"),
    (f"layers.0.{fmt.GATE_UP}.bias", b"\x00\x3f", 2 * 150, "not bit-exact"),
    (f"layers.1.{fmt.DOWN}.weight", b"\x7e", 17, "violate"),  # 448: beyond Neuron's ±240
    (f"layers.1.{fmt.DOWN}.weight", b"\x7f", 18, "violate"),  # NaN
])
def test_corrupted_bytes_are_caught(sources: dict[str, Path], tmp_path: Path, name: str, data: bytes, at: int,
                                    expect: str) -> None:
    conversion.convert(sources[SOURCE_BF16], tmp_path / "out", padded_intermediate_size=128, progress=False)
    _poke(tmp_path / "out", name, data, at)
    report = verify_conversion(tmp_path / "out", sources[SOURCE_BF16])
    assert not report.ok
    assert any(expect in message for message in report.problems), report.problems


def test_a_different_source_does_not_verify(sources: dict[str, Path], tmp_path: Path) -> None:
    conversion.convert(sources[SOURCE_MXFP4], tmp_path / "out", progress=False)
    report = verify_conversion(tmp_path / "out", sources["mxfp4-other"])
    assert not report.ok and report.violations > 100


def test_an_invalid_output_is_reported_not_compared(sources: dict[str, Path], tmp_path: Path) -> None:
    conversion.convert(sources[SOURCE_MXFP4], tmp_path / "out", max_shard_size="40KB", progress=False)
    next((tmp_path / "out").glob("model-*.safetensors")).unlink()
    report = verify_conversion(tmp_path / "out", sources[SOURCE_MXFP4])
    assert not report.ok and report.problems[0].startswith("preflight:")


def test_a_tampered_exactness_record_is_caught(sources: dict[str, Path], tmp_path: Path) -> None:
    conversion.convert(sources["mxfp4-wide"], tmp_path / "out", progress=False)
    index_path = tmp_path / "out" / fmt.INDEX_FILE
    index = json.loads(index_path.read_text())
    index["metadata"]["source"]["exactness"]["inexact_values"] = 0
    index_path.write_text(json.dumps(index))
    report = verify_conversion(tmp_path / "out", sources["mxfp4-wide"])
    assert not report.ok and "the converter recorded inexact_values=0 in the index" in report.problems[-1]


def test_the_source_must_be_a_source(sources: dict[str, Path], tmp_path: Path) -> None:
    conversion.convert(sources[SOURCE_MXFP4], tmp_path / "out", progress=False)
    with pytest.raises(ConversionError):
        verify_conversion(tmp_path / "out", tmp_path / "out")


def test_cli_verify_conversion(sources: dict[str, Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                               capsys: pytest.CaptureFixture[str]) -> None:
    conversion.convert(sources[SOURCE_MXFP4], tmp_path / "good", progress=False)
    assert main(["verify-conversion", str(tmp_path / "good"), "--source", str(sources[SOURCE_MXFP4])]) == 0
    out = capsys.readouterr().out
    assert out.splitlines()[1].split() == ["layer", "tensors", "mismatch", "fp8", "values", "exact", "inexact",
                                           "flushed", "violations", "max", "rel", "err"]
    assert "OK: every value within its bound" in out
    with monkeypatch.context() as patch:
        _break(patch, "nibble_order_swapped")
        conversion.convert(sources[SOURCE_MXFP4], tmp_path / "bad", progress=False)
    assert main(["verify-conversion", str(tmp_path / "bad"), "--source", str(sources[SOURCE_MXFP4]), "--json"]) == 1
    document = json.loads(capsys.readouterr().out)
    assert document["ok"] is False and document["violations"] > 0
    assert main(["verify-conversion", str(tmp_path / "good"), "--source", str(tmp_path / "nowhere")]) == 2
    assert "nowhere does not exist" in capsys.readouterr().err


def test_byte_comparison_doubles_every_byte_within_240() -> None:
    """Stored byte doubled by integer ops == the E4M3 byte of twice its value, for every byte
    whose double E4M3 holds (up to ±224; the source is E4M3 too); a scale that is neither the source's nor twice it leaves the bytes uncompared."""
    from nxdi_gptoss_fp8.convert.fp8 import FP8_DTYPE
    from nxdi_gptoss_fp8.convert.verify_values import byte_mismatches

    codes = torch.arange(256, dtype=torch.int32).to(torch.uint8)
    codes = codes[(codes & 0x7F) <= 0x76].unsqueeze(0)
    doubled = (codes.view(FP8_DTYPE).float() * 2).to(FP8_DTYPE).view(torch.uint8)
    one = torch.ones(1)
    for stored_scale, source in ((2 * one, doubled), (one, codes)):
        rows, differ = byte_mismatches(codes, stored_scale, source, one)
        assert rows.numel() == 0 and not differ.any()
    rows, differ = byte_mismatches(codes, one, doubled, one)
    assert rows.tolist() == [0] and torch.equal(differ != 0, codes != doubled)
    assert byte_mismatches(codes, 3 * one, doubled, one) is None


@pytest.mark.parametrize("which", ["shard", "index", "config"])
def test_an_unreadable_file_of_out_is_an_io_error_naming_it(sources: dict[str, Path], tmp_path: Path,
                                                            capsys: pytest.CaptureFixture[str],
                                                            monkeypatch: pytest.MonkeyPatch, which: str) -> None:
    """A file of OUT that cannot be read (permissions; root reads anything, so ``os.open`` is
    made to refuse it) is an I/O error naming the file (exit 2), never "FAILED: 1 violations"."""
    out = tmp_path / "out"
    conversion.convert(sources[SOURCE_MXFP4], out, progress=False)
    target = {"shard": sorted(out.glob("model-*.safetensors"))[0], "index": out / fmt.INDEX_FILE,
              "config": out / fmt.CONFIG_FILE}[which]
    real_open = os.open

    def refusing(path: Any, flags: int, *args: Any, **kwargs: Any) -> int:
        if os.fspath(path) == str(target):
            raise PermissionError(13, "Permission denied", os.fspath(path))
        return real_open(path, flags, *args, **kwargs)

    monkeypatch.setattr(os, "open", refusing)
    code = main(["verify-conversion", str(out), "--source", str(sources[SOURCE_MXFP4]), "--json"])
    captured = capsys.readouterr()
    assert code == 2, captured.err
    assert captured.err == f"nxdi-gptoss-fp8 verify-conversion: cannot access {target}: Permission denied\n"
    assert json.loads(captured.out)["error"]["kind"] == "io" and "violations" not in captured.out
# --------------------------------------------------------------------------- the float32 screen


def _requantized_expert(case: str) -> tuple[object, torch.Tensor, torch.Tensor]:
    """(source rows, stored FP8 [in', out'], scales [out']) of one BF16 expert converted by the
    converter, then tampered with per ``case``."""
    from nxdi_gptoss_fp8.convert.fp8 import DenseEncoder
    from nxdi_gptoss_fp8.convert.kinds.base import ExpertRows
    from nxdi_gptoss_fp8.convert.kinds.hf_bf16 import _encode_expert

    h, i = 64, 48
    weight = 0.02 * torch.randn((h, 2 * i), generator=torch.Generator().manual_seed(5))
    if case == "zeros-and-wide":
        weight[weight.abs() < 0.005] = 0.0
        weight *= torch.logspace(-40, 20, 2 * i, base=2.0)
    if case == "tiny-scales":  # scales below 2^-100: the float64 judge alone
        weight *= 2.0**-110
    if case == "flushed":  # rows far below their column's largest value: stored as 0, counted apart
        weight[0] = 1.0
        weight[1:4] *= 1e-4
    weight = weight.to(torch.bfloat16)
    if case == "representable":  # every source value exactly an E4M3 value × its scale
        weight = (torch.randint(-0x77, 0x78, (h, 2 * i), generator=torch.Generator().manual_seed(6)).to(torch.uint8)
                  .view(torch.float8_e4m3fn).float().nan_to_num() * 2.0**-8).to(torch.bfloat16)
    lane = output.Lane(torch.zeros((h, 2 * i + 32), dtype=torch.uint8), DenseEncoder())
    _, scale = _encode_expert(lane, weight, fmt.GATE_UP, i + 16, "source", "expert")
    stored = lane.buffer
    if case in ("one-step-off", "representable"):
        stored[3, 5] += 1  # one E4M3 step off: a violation where y was representable, inexact-but-bounded or not
        stored[7, 40] ^= 0x80  # the sign flipped: far out of bound
    rows = weight.t()
    return ExpertRows(rows, tuple(rows.shape), torch.float32), stored, scale


@pytest.mark.parametrize("case", ["clean", "zeros-and-wide", "representable", "one-step-off", "tiny-scales", "flushed"])
def test_the_float32_screen_gives_the_float64_verdicts(case: str, monkeypatch: pytest.MonkeyPatch) -> None:
    from nxdi_gptoss_fp8.convert import verify_expert, verify_values

    want, stored, scale = _requantized_expert(case)
    screened = verify_expert.compare_expert(want, stored, scale, fmt.GATE_UP, 64, "expert")
    monkeypatch.setattr(verify_values.Screen, "__call__", verify_values.no_screen)  # the float64 judge alone
    judged = verify_expert.compare_expert(want, stored, scale, fmt.GATE_UP, 64, "expert")
    assert screened == judged
    assert (judged.violations > 0) == (case in ("one-step-off", "representable"))
    if case == "flushed":  # never shown as relative error 1, in either path
        assert judged.flushed > 0 and judged.max_rel_error < 1.0


@pytest.mark.parametrize(("rows", "cols", "density", "offset"), [
    (128, 2880, 0.004, 0), (128, 2880, 0.3, 0), (64, 2880, 0.0, 0), (64, 2880, 1.0, 0),
    (7, 9, 0.2, 0), (16, 24, 0.05, 3), (33, 40, 0.01, 8)])
def test_nonzero_lists_what_torch_lists_in_its_order(rows: int, cols: int, density: float, offset: int) -> None:
    generator = torch.Generator().manual_seed(rows * cols + offset)
    whole = torch.rand(rows * cols + offset, generator=generator) < density
    mask = whole[offset:].view(rows, cols)
    got, want = nonzero(mask), mask.nonzero(as_tuple=True)
    assert torch.equal(got[0], want[0]) and torch.equal(got[1], want[1])
