"""The compiled one-pass encoders against the torch path, their oracle: the same bytes, scales
and exactness for every source kind, on random experts (hypothesis) and on whole conversions
(shards and index byte-identical); and the torch path whenever the extension is absent."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from nxdi_gptoss_fp8 import format as fmt
from nxdi_gptoss_fp8.convert import SOURCE_BF16, SOURCE_COMPRESSED_TENSORS, SOURCE_MXFP4, convert, kernels, mxfp4
from nxdi_gptoss_fp8.convert.fp8 import FP8_DTYPE, DenseEncoder
from nxdi_gptoss_fp8.convert.kinds import compressed_tensors, hf_bf16, hf_mxfp4
from nxdi_gptoss_fp8.convert.output import Lane
from nxdi_gptoss_fp8.synthetic.sources import REALISTIC_SCALE_RANGE, make_compressed_tensors_source, make_source

ROOT = Path(__file__).resolve().parent.parent
compiled = pytest.mark.skipif(not kernels.AVAILABLE, reason="the compiled encoders are not built here "
                                                           "(python setup.py build_ext --inplace)")


def both_paths(monkeypatch: pytest.MonkeyPatch, run):  # type: ignore[no-untyped-def]
    """``run()`` through the compiled encoders, then through the torch path: both results."""
    results = []
    for available in (True, False):
        with monkeypatch.context() as patch:
            patch.setattr(kernels, "AVAILABLE", available)
            results.append(run())
    return results


def _same(compiled_result, torch_result) -> None:  # type: ignore[no-untyped-def]
    (buffer, (exactness, scale)), (buffer_t, (exactness_t, scale_t)) = compiled_result, torch_result
    assert torch.equal(buffer, buffer_t)
    assert torch.equal(scale, scale_t)
    assert (exactness.values, exactness.inexact, exactness.flushed_to_zero, exactness.max_rel_error) == (
        exactness_t.values, exactness_t.inexact, exactness_t.flushed_to_zero, exactness_t.max_rel_error)


# --------------------------------------------------------------------------- MXFP4


@compiled
@settings(max_examples=60, deadline=None)
@given(st.integers(0, 2**31), st.integers(1, 40), st.integers(1, 5), st.sampled_from([fmt.GATE_UP, fmt.DOWN]),
       st.integers(0, 32), st.sampled_from(["narrow", "wide", "any", "zeros"]))
def test_mxfp4_expert_matches_the_torch_path(seed: int, channels: int, groups: int, proj: str, pad: int,
                                             scales_kind: str) -> None:
    g = torch.Generator().manual_seed(seed)
    rows = 2 * channels if proj == fmt.GATE_UP else channels
    blocks = torch.randint(0, 256, (rows, groups, 16), dtype=torch.uint8, generator=g)
    low, high = {"narrow": (118, 124), "wide": (100, 140), "any": (0, 252), "zeros": (0, 252)}[scales_kind]
    scales = torch.randint(low, high + 1, (rows, groups), dtype=torch.uint8, generator=g)
    if scales_kind == "zeros":  # whole zero channels and blocks of only ±0
        blocks[::3] = 0
        blocks[1::4, 0] = 0x88
    k = groups * 32
    shape = (k + pad, 2 * (channels + pad)) if proj == fmt.GATE_UP else (k + pad, channels + pad)
    padded_i = channels + pad

    def run():  # type: ignore[no-untyped-def]
        lane = Lane(torch.zeros(shape, dtype=torch.uint8), mxfp4.ExpertEncoder(hf_mxfp4.ENCODE_ROWS, groups))
        return lane.buffer, hf_mxfp4._encode_expert(lane, blocks, scales, proj, padded_i, "where")

    with pytest.MonkeyPatch.context() as monkeypatch:
        _same(*both_paths(monkeypatch, run))


@compiled
def test_the_exactness_table_agrees_with_exactness_at_every_offset() -> None:
    codes, rel = mxfp4.exactness_table()
    for d in (-30, -17, -9, -8, 5, 6, 8, 9):
        blocks = torch.arange(256, dtype=torch.int32).to(torch.uint8).reshape(16, 1, 16)
        scales = torch.full((16, 1), 127 + d, dtype=torch.uint8)
        judged = mxfp4.exactness(blocks, scales, torch.zeros(16, dtype=torch.int32))
        row = d - mxfp4.STAT_OFFSET_MIN
        assert int((codes[row] & 3).sum()) == judged.inexact
        assert int((codes[row] >> 2).sum()) == judged.flushed_to_zero
        assert float(rel[row].max()) == judged.max_rel_error


# --------------------------------------------------------------------------- compressed-tensors


@compiled
@settings(max_examples=60, deadline=None)
@given(st.integers(0, 2**31), st.integers(1, 40), st.integers(1, 70), st.sampled_from(["interleaved", "halves"]),
       st.integers(0, 16), st.floats(0.0, 1.0))
def test_compressed_tensors_matches_the_torch_path(seed: int, channels: int, cols: int, split: str, pad: int,
                                                   halved: float) -> None:
    g = torch.Generator().manual_seed(seed)

    def weight(rows: int, width: int) -> tuple[torch.Tensor, torch.Tensor]:
        q = torch.randint(0, 256, (rows, width), dtype=torch.uint8, generator=g)
        q = torch.where((q & 0x7F) == 0x7F, q ^ 0x01, q)  # no NaN bytes
        keep = torch.rand(rows, generator=g) >= halved  # rows within ±240 stay as they are
        q[keep] = torch.where((q[keep] & 0x7F) > 0x77, q[keep] & 0x8F, q[keep])
        return q.view(FP8_DTYPE), (torch.rand((rows, 1), generator=g) + 0.01).to(torch.bfloat16)

    (gate, gate_s), (up, up_s), (down, down_s) = weight(channels, cols), weight(channels, cols), weight(cols, channels)
    padded_i = channels + pad

    def run_gate_up():  # type: ignore[no-untyped-def]
        lane = Lane(torch.zeros((cols + pad, 2 * padded_i), dtype=torch.uint8))
        return lane.buffer, compressed_tensors._encode_gate_up(lane, gate, gate_s, up, up_s, split, padded_i, "w")

    def run_down():  # type: ignore[no-untyped-def]
        lane = Lane(torch.zeros((padded_i, cols + pad), dtype=torch.uint8))
        return lane.buffer, compressed_tensors._encode_down(lane, down, down_s, "w")

    with pytest.MonkeyPatch.context() as monkeypatch:
        _same(*both_paths(monkeypatch, run_gate_up))
        _same(*both_paths(monkeypatch, run_down))


@compiled
@pytest.mark.parametrize("sign", [0x00, 0x80])
def test_every_byte_is_halved_as_the_torch_path_halves_it(sign: int, monkeypatch: pytest.MonkeyPatch) -> None:
    every = torch.arange(256, dtype=torch.int32).to(torch.uint8)
    row = every[(every & 0x7F) != 0x7F] | sign  # every magnitude but NaN's, in a row beyond ±240
    q = row.reshape(1, -1).repeat(3, 1).view(FP8_DTYPE)

    def run():  # type: ignore[no-untyped-def]
        lane = Lane(torch.zeros((q.shape[1], 3), dtype=torch.uint8))
        return lane.buffer, compressed_tensors._encode_down(lane, q, torch.ones((3, 1)), "w")

    _same(*both_paths(monkeypatch, run))


@compiled
def test_a_buffer_the_loops_would_overrun_is_refused() -> None:
    blocks, scales = torch.zeros((4, 1, 16), dtype=torch.uint8), torch.full((4, 1), 127, dtype=torch.uint8)
    with pytest.raises(ValueError, match="cannot take"):
        kernels.mxfp4_expert(blocks, scales, torch.zeros((4, 32), dtype=torch.uint8), torch.arange(4))
    with pytest.raises(ValueError, match="cannot take"):
        kernels.mxfp4_expert(blocks, scales, torch.zeros((32, 4), dtype=torch.uint8), torch.arange(4) + 1)


# --------------------------------------------------------------------------- BF16


@compiled
@settings(max_examples=60, deadline=None)
@given(st.integers(0, 2**31), st.integers(1, 60), st.integers(1, 40), st.sampled_from([fmt.GATE_UP, fmt.DOWN]),
       st.integers(0, 16), st.sampled_from(["gaussian", "edges"]))
def test_bf16_expert_matches_the_torch_path(seed: int, rows: int, channels: int, proj: str, pad: int,
                                            values: str) -> None:
    g = torch.Generator().manual_seed(seed)
    cols = 2 * channels if proj == fmt.GATE_UP else channels
    weight = (0.02 * torch.randn((rows, cols), generator=g)).to(torch.bfloat16)
    if values == "edges":  # zero and subnormal channels, a huge value, random bit patterns elsewhere
        bits = torch.randint(0, 1 << 16, (rows, cols), dtype=torch.int32, generator=g).to(torch.int16)
        bits = torch.where((bits & 0x7F80) == 0x7F80, bits & 0x00FF, bits)  # no inf/NaN
        weight = bits.view(torch.bfloat16).clone()
        weight[:, 0] = 0
        weight[:, -1] = weight[:, -1] * 1e-38
    padded_i = channels + pad
    shape = (rows + pad, 2 * padded_i) if proj == fmt.GATE_UP else (rows + pad, cols + pad)

    def run():  # type: ignore[no-untyped-def]
        lane = Lane(torch.zeros(shape, dtype=torch.uint8), DenseEncoder())
        return lane.buffer, hf_bf16._encode_expert(lane, weight, proj, padded_i, "path", "where")

    with pytest.MonkeyPatch.context() as monkeypatch:
        (compiled_result, torch_result) = both_paths(monkeypatch, run)
    _same(compiled_result, torch_result)
    (exactness, _), (exactness_t, _) = compiled_result[1], torch_result[1]
    assert exactness.nonzero == exactness_t.nonzero
    # the sum of relative errors is summed in another order: the last digits of the mean may differ
    assert exactness.rel_sum == pytest.approx(exactness_t.rel_sum, rel=1e-12, abs=1e-300)


@compiled
def test_the_e4m3_table_is_torchs_rounding() -> None:
    rounded, _ = kernels._e4m3_tables()
    g = torch.Generator().manual_seed(1)
    bits = torch.randint(-(1 << 31), 1 << 31, (1 << 20,), dtype=torch.int64, generator=g).to(torch.int32)
    values = bits.view(torch.float32)
    values = values[torch.isfinite(values)].clamp(-240, 240)
    raw = values.view(torch.int32).to(torch.int64) & 0xFFFFFFFF
    keys = (raw >> 16) | ((raw & 0xFFFF) != 0).to(torch.int64) << 16
    assert torch.equal(rounded[keys], values.to(FP8_DTYPE).view(torch.uint8))


# --------------------------------------------------------------------------- whole conversions


@compiled
@pytest.mark.parametrize("kind", [SOURCE_MXFP4, SOURCE_BF16, SOURCE_COMPRESSED_TENSORS, "compressed-tensors-halves"])
def test_both_paths_write_the_same_files(kind: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    if kind == "compressed-tensors-halves":
        src = make_compressed_tensors_source(tmp_path / "src", split="halves", transformers_version="5.0.0")
        options = {"gate_up_split": "halves"}
    else:
        src = make_source(tmp_path / "src", kind, scale_range=REALISTIC_SCALE_RANGE)
        options = {}
    outputs = []
    for run, available in enumerate((True, False, True)):  # compiled, torch, compiled again
        monkeypatch.setattr(kernels, "AVAILABLE", available)
        out = tmp_path / f"out-{run}"
        report = convert(src, out, progress=False, padded_hidden_size=96, padded_intermediate_size=128, **options)
        outputs.append((out, report))
    (ours, report) = outputs[0]
    names = sorted(path.name for path in ours.iterdir())
    for theirs, report_t in outputs[1:]:
        assert names == sorted(path.name for path in theirs.iterdir())
        for name in names:
            assert (ours / name).read_bytes() == (theirs / name).read_bytes(), name
        assert report.exactness_summary() == report_t.exactness_summary()
    assert report.to_dict()["experts"] == outputs[2][1].to_dict()["experts"]  # the means too, run to run
    assert json.loads((ours / fmt.INDEX_FILE).read_text())["metadata"]["shard_sha256"]


def test_the_torch_path_runs_when_told_to(tmp_path: Path) -> None:
    code = "from nxdi_gptoss_fp8.convert import kernels; print(kernels.AVAILABLE)"
    env = {**os.environ, kernels.ENV: "torch", "PYTHONPATH": str(ROOT)}
    done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True)
    assert done.stdout.strip() == "False"


def test_the_extension_build_tolerates_no_compiler(tmp_path: Path) -> None:
    """``CC=false``: the optional extension fails to build, the build itself succeeds."""
    env = {**os.environ, "CC": "false"}
    done = subprocess.run([sys.executable, "setup.py", "-q", "build_ext", "--build-lib", str(tmp_path / "lib"),
                           "--build-temp", str(tmp_path / "temp")], cwd=ROOT, env=env, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    assert "failed" in done.stderr and not list((tmp_path / "lib").rglob("_kernels*"))
