"""The deep scan: out-of-range FP8 bytes, non-zero padding and all-zero experts, with counts
and first coordinates; every FP8 byte read exactly once; chunking never changes the result."""

from __future__ import annotations

import shutil
import struct
from pathlib import Path
from typing import Any

import pytest
from corpus import Ckpt, Tensor

from nxdi_gptoss_fp8 import format as fmt
from nxdi_gptoss_fp8.errors import MissingDependencyError
from nxdi_gptoss_fp8.machine import cache_chunk_bytes
from nxdi_gptoss_fp8.safeio.files import open_regular
from nxdi_gptoss_fp8.safeio.safetensors_header import read_header
from nxdi_gptoss_fp8.validate import deep_scan as ds
from nxdi_gptoss_fp8.validate.findings import PreflightReport, Severity
from nxdi_gptoss_fp8.validate.pipeline import preflight

GATE_UP_W = f"layers.1.{fmt.GATE_UP}.weight"
DOWN_W = f"layers.0.{fmt.DOWN}.weight"
GATE_UP_B = f"layers.0.{fmt.GATE_UP}.bias"
# conftest's padded template: H 64 → H' 96, I 64 → I' 128, 4 experts
E, H, HP, IM, IP = 4, 64, 96, 64, 128


@pytest.fixture
def padded(tiny_padded_template: Path, tmp_path: Path) -> Path:
    return Path(shutil.copytree(tiny_padded_template, tmp_path / "padded"))


def poke(ckpt: Path, key: str, coords: tuple[int, ...], value: bytes) -> None:
    """Write ``value`` at element ``coords`` of tensor ``key``."""
    header = read_header(ckpt / Ckpt(ckpt).shard_of(key))
    info = header.tensors[key]
    flat = 0
    for index, size in zip(coords, info.shape, strict=True):
        assert 0 <= index < size
        flat = flat * size + index
    Ckpt(ckpt).poke(key, flat * (fmt.DTYPE_BITS[info.dtype] // 8), value)


def deep(ckpt: Path, **kwargs: Any) -> PreflightReport:
    return preflight(ckpt, allow_custom_model=True, deep=True, **kwargs)


def codes(report: PreflightReport) -> dict[str, list[str]]:
    found: dict[str, list[str]] = {}
    for f in report.findings:
        found.setdefault(f.code, []).append(f.message)
    return found


@pytest.mark.parametrize("template", ["tiny_template", "tiny_padded_template"])
def test_valid_checkpoints_pass_the_deep_scan(request: pytest.FixtureRequest, template: str) -> None:
    report = deep(request.getfixturevalue(template))
    assert report.ok and not report.warnings, report.render_text()
    assert [f.code for f in report.findings] == ["values.deep_scan_done"]


def test_default_preflight_reads_no_fp8_byte(tiny_template: Path) -> None:
    """The default preflight reads no FP8 or BF16 byte; the deep scan reads each one once."""
    plain, scanned = preflight(tiny_template, allow_custom_model=True), deep(tiny_template)
    targets = ds.scan_targets(scanned.view)
    fp8 = sum(t.nbytes for t in targets if t.fp8)
    assert fp8 == sum(s.nbytes for s in fmt.expected_namespace(scanned.view.layout).values() if s.dtype == fmt.F8_E4M3)
    bf16 = sum(t.nbytes for t in targets if not t.fp8)
    assert bf16 == sum(s.nbytes for s in fmt.expected_namespace(scanned.view.layout).values() if s.dtype == fmt.BF16)
    assert scanned.bytes_read - plain.bytes_read == fp8 + bf16


@pytest.mark.parametrize("template", ["tiny_template", "tiny_padded_template"])
@pytest.mark.parametrize("chunk_bytes", [1, 200, cache_chunk_bytes()])
def test_each_byte_is_read_exactly_once(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch,
                                        template: str, chunk_bytes: int) -> None:
    ckpt = request.getfixturevalue(template)
    reads: list[tuple[str, int, int]] = []

    class Recorder:
        def __init__(self, handle: Any, path: str) -> None:
            self.handle, self.path = handle, path

        def __enter__(self) -> Recorder:
            return self

        def __exit__(self, *exc: object) -> None:
            self.handle.close()

        def seek(self, position: int) -> int:
            return self.handle.seek(position)

        def readinto(self, buffer: Any) -> int:
            start = self.handle.tell()
            got = self.handle.readinto(buffer)
            reads.append((self.path, start, start + got))
            return got

    def recording_open(path: str, **kwargs: Any) -> Recorder:
        return Recorder(open_regular(path, **kwargs), path)  # closed by Recorder.__exit__

    monkeypatch.setattr(ds, "open_regular", recording_open)
    report = preflight(ckpt, allow_custom_model=True)
    ds.deep_scan(report.view, report, chunk_bytes=chunk_bytes)
    expected = sorted(
        (t.path, t.offset, t.offset + t.nbytes) for t in ds.scan_targets(report.view)
    )
    merged: list[list[Any]] = []
    for path, start, end in sorted(reads):
        if merged and merged[-1][0] == path and merged[-1][2] == start:
            merged[-1][2] = end
        else:
            assert not merged or merged[-1][0] != path or merged[-1][2] < start, "a byte was read twice"
            merged.append([path, start, end])
    joined = []
    for path, start, end in expected:
        if joined and joined[-1][0] == path and joined[-1][2] == start:
            joined[-1][2] = end
        else:
            joined.append([path, start, end])
    assert merged == joined


@pytest.mark.parametrize("byte", range(256))
def test_every_fp8_byte_value(tiny_checkpoint: Path, byte: int) -> None:
    poke(tiny_checkpoint, GATE_UP_W, (2, 10, 20), bytes([byte]))
    report = deep(tiny_checkpoint)
    out_of_range = "values.fp8_out_of_range" in codes(report)
    assert out_of_range == ((byte & 0x78) == 0x78)
    assert report.ok == (not out_of_range)


def test_counts_and_first_coordinates(tiny_checkpoint: Path) -> None:
    for coords in ((3, 5, 1), (1, 60, 127), (1, 60, 128 - 2)):
        poke(tiny_checkpoint, GATE_UP_W, coords, b"\xfe")
    poke(tiny_checkpoint, DOWN_W, (0, 0, 0), b"\x7f")
    report = deep(tiny_checkpoint)
    messages = {f.key: f.message for f in report.errors}
    assert "has 3 FP8 values" in messages[GATE_UP_W] and "first at [1, 60, 126] = 0xFE" in messages[GATE_UP_W]
    assert "has 1 FP8 value with" in messages[DOWN_W] and "first at [0, 0, 0] = 0x7F" in messages[DOWN_W]


PADDING_CASES = [
    ("gate-column", GATE_UP_W, (0, 3, IM), b"\x01"),
    ("gate-last-column", GATE_UP_W, (3, 0, IP - 1), b"\x38"),
    ("up-column", GATE_UP_W, (2, 63, IP + IM), b"\x01"),
    ("up-last-column", GATE_UP_W, (1, 1, 2 * IP - 1), b"\x40"),
    ("gate-up-row", GATE_UP_W, (1, H, 5), b"\x30"),
    ("gate-up-last-row", GATE_UP_W, (3, HP - 1, 2 * IP - 1), b"\x30"),
    ("down-row", DOWN_W, (2, IM, 7), b"\x30"),
    ("down-column", DOWN_W, (0, 9, H), b"\x30"),
    ("embedding-column", "embed_tokens.weight", (7, HP - 1), struct.pack("<H", 0x3F80)),
    ("lm-head-column", "lm_head.weight", (0, H), struct.pack("<H", 0x0001)),
    ("norm-entry", "norm.weight", (H + 3,), struct.pack("<H", 0x3F80)),
    ("layernorm-entry", "layers.1.post_attention_layernorm.weight", (HP - 1,), struct.pack("<H", 0xBF80)),
    ("q-proj-column", "layers.0.self_attn.q_proj.weight", (0, H), struct.pack("<H", 0x3F80)),
    ("o-proj-row", "layers.1.self_attn.o_proj.weight", (H, 0), struct.pack("<H", 0x3F80)),
    ("o-proj-bias", "layers.0.self_attn.o_proj.bias", (HP - 1,), struct.pack("<H", 0x3F80)),
    ("router-column", "layers.0.feed_forward.moe.router.linear_router.weight", (3, H + 1), struct.pack("<H", 0x3F80)),
    ("gate-up-bias-gate", GATE_UP_B, (0, IM), struct.pack("<H", 0x3F80)),
    ("gate-up-bias-up", GATE_UP_B, (3, IP + IM + 5), struct.pack("<H", 0x3F80)),
    ("down-bias", f"layers.1.{fmt.DOWN}.bias", (2, HP - 2), struct.pack("<H", 0x3F80)),
]


@pytest.mark.parametrize(("case", "key", "coords", "value"), PADDING_CASES, ids=[c[0] for c in PADDING_CASES])
def test_nonzero_padding_is_found_with_its_coordinates(padded: Path, case: str, key: str, coords: tuple[int, ...], value: bytes) -> None:
    poke(padded, key, coords, value)
    report = deep(padded)
    found = [f for f in report.errors if f.code == "values.nonzero_padding"]
    assert [f.key for f in found] == [key], report.render_text()
    assert "has 1 non-zero value in its padding" in found[0].message
    assert f"first at {list(coords)}" in found[0].message


@pytest.mark.parametrize(("key", "coords"), [
    (GATE_UP_W, (0, H - 1, IM - 1)), (GATE_UP_W, (0, 0, IP)), (GATE_UP_W, (0, H - 1, IP + IM - 1)),
    (DOWN_W, (0, IM - 1, H - 1)), ("embed_tokens.weight", (0, H - 1)), ("layers.0.self_attn.o_proj.weight", (H - 1, 63)),
])
def test_values_next_to_the_padding_are_not_padding(padded: Path, key: str, coords: tuple[int, ...]) -> None:
    poke(padded, key, coords, b"\x38" if "mlp_op" in key else struct.pack("<H", 0x3F80))
    assert deep(padded).ok


def test_negative_zero_in_padding_is_zero(padded: Path) -> None:
    poke(padded, GATE_UP_W, (0, H, 0), b"\x80")
    poke(padded, "embed_tokens.weight", (0, H), struct.pack("<H", 0x8000))
    assert deep(padded).ok


def test_scale_padding_is_not_checked(padded: Path) -> None:
    report = deep(padded)
    assert not any(t.key.endswith(".scale") for t in ds.scan_targets(report.view))


def test_all_zero_expert_is_a_warning(tiny_checkpoint: Path) -> None:
    header = read_header(tiny_checkpoint / Ckpt(tiny_checkpoint).shard_of(DOWN_W))
    expert_bytes = header.tensors[DOWN_W].nbytes // E
    Ckpt(tiny_checkpoint).poke(DOWN_W, 2 * expert_bytes, bytes(expert_bytes))
    Ckpt(tiny_checkpoint).poke(DOWN_W, 3 * expert_bytes, b"\x80" * expert_bytes)  # all -0: zero too
    report = deep(tiny_checkpoint)
    assert report.ok
    (warning,) = [f for f in report.findings if f.code == "values.zero_expert"]
    assert warning.severity is Severity.WARNING and warning.key == DOWN_W
    assert "2 of 4 experts are all zero (experts 2, 3)" in warning.message


def _problems(report: PreflightReport) -> list[tuple[str, str | None, str]]:
    return sorted((f.code, f.key, f.message) for f in report.findings if f.code != "values.deep_scan_done")


@pytest.mark.parametrize("chunk_bytes", [1, 64, 1000, 5000])
def test_chunk_size_does_not_change_the_findings(padded: Path, chunk_bytes: int) -> None:
    poke(padded, GATE_UP_W, (2, H + 3, 9), b"\x7f")
    poke(padded, GATE_UP_W, (1, 4, IM + 2), b"\x11")
    poke(padded, DOWN_W, (3, 70, 70), b"\xf9")
    poke(padded, "embed_tokens.weight", (100, 95), struct.pack("<H", 0x3F80))
    reference = deep(padded)
    report = preflight(padded, allow_custom_model=True)
    ds.deep_scan(report.view, report, chunk_bytes=chunk_bytes)
    assert _problems(report) == _problems(reference)
    assert {f.code for f in reference.errors} == {"values.fp8_out_of_range", "values.nonzero_padding"}


def test_mis_shaped_tensors_are_skipped_not_scanned(tiny_checkpoint: Path) -> None:
    ck = Ckpt(tiny_checkpoint)
    ck.edit_shard(ck.shard_of(DOWN_W), lambda ts: ts.update({DOWN_W: Tensor("F8_E4M3", (4, 64, 32), bytes(4 * 64 * 32))}))
    report = deep(tiny_checkpoint)
    assert "dtype_shape.wrong_shape" in codes(report)
    assert DOWN_W not in {t.key for t in ds.scan_targets(report.view)}


def test_without_a_layout_the_scan_says_it_did_not_run(tiny_checkpoint: Path) -> None:
    ck = Ckpt(tiny_checkpoint)
    ck.edit_config(hidden_size="64")
    report = deep(tiny_checkpoint)
    assert "values.deep_scan_skipped" in codes(report)


def test_a_shard_truncated_after_the_preflight_is_a_finding(tiny_checkpoint: Path) -> None:
    report = preflight(tiny_checkpoint, allow_custom_model=True)
    shard = tiny_checkpoint / Ckpt(tiny_checkpoint).shard_of(GATE_UP_W)
    shard.write_bytes(shard.read_bytes()[:-1000])
    ds.deep_scan(report.view, report)
    assert "header.data_beyond_file" in codes(report)


def test_first_padding_coordinate_is_the_earliest_in_memory_order(padded: Path) -> None:
    poke(padded, GATE_UP_W, (0, 5, IM + 1), b"\x01")  # gate padding, row 5
    poke(padded, GATE_UP_W, (0, 2, IP + IM + 1), b"\x01")  # up padding, row 2: earlier
    poke(padded, GATE_UP_W, (0, H, 0), b"\x01")  # a padding row: later
    (finding,) = [f for f in deep(padded).errors if f.code == "values.nonzero_padding"]
    assert "has 3 non-zero values" in finding.message and f"first at [0, 2, {IP + IM + 1}]" in finding.message


def test_without_numpy_the_deep_scan_is_an_environment_error(tiny_template: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(ds, "np", None)
    with pytest.raises(MissingDependencyError, match="needs numpy, which is not installed"):
        deep(tiny_template)
    report = preflight(tiny_template, allow_custom_model=True)
    with pytest.raises(MissingDependencyError):
        ds.deep_scan(report.view, report)


def test_a_shard_swapped_for_a_fifo_before_the_scan_is_refused_not_blocked_on(tiny_checkpoint: Path) -> None:
    import os

    report = preflight(tiny_checkpoint, allow_custom_model=True)
    shard = report.view.weight_map[GATE_UP_W]
    (tiny_checkpoint / shard).unlink()
    os.mkfifo(tiny_checkpoint / shard)
    ds.deep_scan(report.view, report)
    assert "filesystem.not_a_file" in codes(report)


Q_PROJ = "layers.0.self_attn.q_proj.weight"


@pytest.mark.parametrize("value", [0x7F80, 0xFF80, 0x7FC0, 0xFFC0, 0x7F81, 0xFFFF, 0x7FFF])
@pytest.mark.parametrize("key", [Q_PROJ, "embed_tokens.weight", "norm.weight", "layers.1.self_attn.learned_sinks.sink",
                                 f"layers.1.{fmt.DOWN}.bias", "layers.0.feed_forward.moe.router.linear_router.weight"])
def test_non_finite_bf16_values_are_found(tiny_checkpoint: Path, key: str, value: int) -> None:
    rank = len(read_header(tiny_checkpoint / Ckpt(tiny_checkpoint).shard_of(key)).tensors[key].shape)
    poke(tiny_checkpoint, key, (0,) * rank, struct.pack("<H", value))
    report = deep(tiny_checkpoint)
    (finding,) = [f for f in report.errors if f.code == "values.non_finite"]
    assert finding.key == key and "has 1 non-finite BF16 value (±inf or NaN); first at [0" in finding.message
    assert f"= 0x{value:04X}" in finding.message


@pytest.mark.parametrize("value", [0x7F7F, 0xFF7F, 0x0001, 0x8001, 0x8000, 0x3F80, 0x7F00])
def test_finite_bf16_extremes_are_not_non_finite(tiny_checkpoint: Path, value: int) -> None:
    poke(tiny_checkpoint, Q_PROJ, (3, 5), struct.pack("<H", value))
    assert deep(tiny_checkpoint).ok


def test_non_finite_counts_and_first_coordinates(tiny_checkpoint: Path) -> None:
    for coords in ((5, 9), (2, 60), (2, 61)):
        poke(tiny_checkpoint, Q_PROJ, coords, struct.pack("<H", 0x7FC0))
    (finding,) = [f for f in deep(tiny_checkpoint).errors if f.code == "values.non_finite"]
    assert "has 3 non-finite BF16 values" in finding.message and "first at [2, 60] = 0x7FC0" in finding.message


@pytest.mark.parametrize("itemsize", [1, 2])
def test_flags_are_exact_for_every_value(itemsize: int) -> None:
    """Out of range and non-zero, from the two reductions, agree with the value-by-value test
    for every single value, beside any other value, and for random runs."""
    import numpy as np

    element, mask, bad = (np.uint8, 0x7F, 0x78) if itemsize == 1 else (np.uint16, 0x7FFF, 0x7F80)
    values = range(256) if itemsize == 1 else [*range(0, 0x10000, 0x3F), 0x7F7F, 0x7F80, 0xFF7F, 0xFF80, 0x8000, 0x8001, 0xFFFF]

    def expected(array: np.ndarray) -> tuple[bool, bool]:
        return bool(((array & mask) >= bad).any()), bool((array & mask).any())

    rng = np.random.default_rng(itemsize)
    arrays = [np.array([v], dtype=element) for v in values]
    arrays += [np.array([v, w], dtype=element) for v in values[::7] for w in values[::5]]
    arrays += [rng.integers(0, 256 ** itemsize, n, dtype=element) for n in (0, 1, 7, 8, 9, 1000)]
    for array in arrays:
        unsigned = np.frombuffer(array.tobytes(), dtype=element)
        assert ds._flags(unsigned, unsigned.view(np.int8 if itemsize == 1 else np.int16)) == expected(array), array


def test_the_findings_do_not_depend_on_the_thread_count(padded: Path) -> None:
    poke(padded, GATE_UP_W, (2, H + 3, 9), b"\x7f")
    poke(padded, DOWN_W, (3, 70, 70), b"\xf9")
    poke(padded, "embed_tokens.weight", (100, 95), struct.pack("<H", 0x7FC0))
    poke(padded, "layers.1.self_attn.k_proj.weight", (1, 1), struct.pack("<H", 0xFF80))
    reports = []
    for workers in (1, 2, 8):
        report = preflight(padded, allow_custom_model=True)
        stats = ds.deep_scan(report.view, report, workers=workers)
        assert stats.workers == min(workers, len(report.view.headers))
        reports.append([(f.code, f.file, f.key, f.message) for f in report.findings if f.code != "values.deep_scan_done"])
    assert reports[0] == reports[1] == reports[2] and len(reports[0]) >= 4


def test_a_set_cancel_flag_stops_the_scan_at_the_next_chunk(tiny_template: Path) -> None:
    import threading

    report = preflight(tiny_template, allow_custom_model=True)
    target = next(t for t in ds.scan_targets(report.view) if t.fp8)
    cancel = threading.Event()
    chunks: list[int] = []

    def progress(size: int) -> None:
        chunks.append(size)
        cancel.set()  # "Ctrl-C" after the first chunk

    with open_regular(target.path, buffering=0) as handle, pytest.raises(ds.Cancelled):
        ds.scan_tensor(target, handle, bytearray(64 * 1024), chunk_bytes=target.cols, progress=progress, cancel=cancel)
    assert len(chunks) == 1 and target.nbytes > 10 * chunks[0]


def test_ctrl_c_while_waiting_for_the_threads_stops_every_thread(tiny_template: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """KeyboardInterrupt in the waiting thread sets the cancel flag: the workers stop at their
    next chunk instead of finishing their shards, and the interrupt propagates."""
    report = preflight(tiny_template, allow_custom_model=True)
    total = sum(t.nbytes for t in ds.scan_targets(report.view))
    from nxdi_gptoss_fp8.safeio import hashing

    real_wait, done = hashing.wait, []

    def interrupted_wait(*args: Any, **kwargs: Any) -> Any:
        if done:
            raise KeyboardInterrupt
        done.append(1)
        return real_wait(*args, **{**kwargs, "timeout": 0.01})

    import time as time_module

    scanned: list[int] = []

    def slow_progress(size: int) -> None:  # a slow disk: each chunk takes 20 ms
        scanned.append(size)
        time_module.sleep(0.02)

    monkeypatch.setattr(hashing, "wait", interrupted_wait)
    monkeypatch.setattr(ds, "Progress", lambda *a, **k: type("P", (), {"update": staticmethod(slow_progress),
                                                                      "close": lambda self: None})())
    started = time_module.perf_counter()
    with pytest.raises(KeyboardInterrupt):
        ds.deep_scan(report.view, report, chunk_bytes=256, workers=2)
    assert time_module.perf_counter() - started < 1.0
    assert sum(scanned) < total / 4


@pytest.mark.parametrize("rows_per_chunk", [1, 2, 3])
def test_findings_across_a_chunk_boundary_are_found_whole(tiny_checkpoint: Path, rows_per_chunk: int) -> None:
    """Bad values on both sides of a chunk boundary are counted together with the first one's
    coordinates; an expert whose only non-zero byte is in its last chunk is not all zero."""
    report = preflight(tiny_checkpoint, allow_custom_model=True)
    down = next(t for t in ds.scan_targets(report.view) if t.key == DOWN_W)
    attention = next(t for t in ds.scan_targets(report.view) if t.key == Q_PROJ)
    boundary = rows_per_chunk  # the first row of the second chunk
    poke(tiny_checkpoint, DOWN_W, (1, boundary - 1, down.cols - 1), b"\x7f")  # last byte of a chunk
    poke(tiny_checkpoint, DOWN_W, (1, boundary, 0), b"\xf8")  # first byte of the next
    Ckpt(tiny_checkpoint).poke(DOWN_W, 2 * down.rows * down.cols, bytes(down.rows * down.cols))
    poke(tiny_checkpoint, DOWN_W, (2, down.rows - 1, down.cols - 1), b"\x01")  # expert 2: one byte, at its end
    poke(tiny_checkpoint, Q_PROJ, (boundary - 1, attention.cols - 1), struct.pack("<H", 0xFF80))
    poke(tiny_checkpoint, Q_PROJ, (boundary, 0), struct.pack("<H", 0x7FC0))
    report = preflight(tiny_checkpoint, allow_custom_model=True)
    ds.deep_scan(report.view, report, chunk_bytes=rows_per_chunk * down.cols)  # BF16: half as many (longer) rows
    found = codes(report)
    (fp8,) = found["values.fp8_out_of_range"]
    assert "has 2 FP8 values" in fp8 and f"first at [1, {boundary - 1}, {down.cols - 1}] = 0x7F" in fp8
    (bf16,) = found["values.non_finite"]
    assert "has 2 non-finite" in bf16 and f"first at [{boundary - 1}, {attention.cols - 1}] = 0xFF80" in bf16
    assert "values.zero_expert" not in found
    reference = deep(tiny_checkpoint)
    assert _problems(report) == _problems(reference)
