"""This CPU's L2 size read from sysfs (or unknown), and the read chunk of half of it within bounds."""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from nxdi_gptoss_fp8 import cpu_cache as cc


@pytest.mark.parametrize(("files", "expected"), [
    ({"index0": ("1", "Data", "48K"), "index2": ("2", "Unified", "1024K"), "index3": ("3", "Unified", "32768K")}, 1 << 20),
    ({"index2": ("2", "Unified", "2M")}, 2 << 20),
    ({"index2": ("2", "Data", "524288")}, 512 << 10),
    ({"index1": ("1", "Instruction", "32K"), "index2": ("2", "Instruction", "1M")}, None),  # no L2 for data
    ({"index2": ("2", "Unified", "lots")}, None),
    ({"index2": ("2", "Unified", "0K")}, None),
    ({"index2": ("2", "Unified", "")}, None),
    ({}, None),
])
def test_the_l2_size_is_read_from_sysfs_or_is_unknown(tmp_path: Path, files: dict[str, tuple[str, str, str]],
                                                      expected: int | None) -> None:
    for entry, (level, kind, size) in files.items():
        (tmp_path / entry).mkdir()
        for name, text in (("level", level), ("type", kind), ("size", size)):
            (tmp_path / entry / name).write_text(text + "\n")
    assert cc.l2_cache_bytes(str(tmp_path)) == expected
    assert cc.l2_cache_bytes(str(tmp_path / "missing")) is None


@pytest.mark.parametrize(("l2", "chunk"), [
    (None, cc.FALLBACK_CHUNK_BYTES), (1 << 20, 512 << 10), (2 << 20, 1 << 20), (32 << 20, cc.MAX_CHUNK_BYTES),
    (64 << 10, cc.MIN_CHUNK_BYTES), (1, cc.MIN_CHUNK_BYTES),
])
def test_the_chunk_is_half_the_l2_within_bounds(l2: int | None, chunk: int) -> None:
    assert cc.chunk_bytes_for(l2) == chunk
    assert cc.MIN_CHUNK_BYTES <= cc.cache_chunk_bytes() <= cc.MAX_CHUNK_BYTES


@settings(max_examples=200, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(size=st.text(max_size=12), level=st.sampled_from(["1", "2", "3", "2x", ""]))
def test_any_sysfs_text_gives_a_positive_size_or_none(tmp_path: Path, size: str, level: str) -> None:
    entry = tmp_path / "index2"
    entry.mkdir(exist_ok=True)
    for name, text in (("level", level), ("type", "Unified"), ("size", size)):
        (entry / name).write_text(text, encoding="utf-8")
    found = cc.l2_cache_bytes(str(tmp_path))
    assert found is None or (found > 0 and level == "2")
    assert cc.MIN_CHUNK_BYTES <= cc.chunk_bytes_for(found) <= cc.MAX_CHUNK_BYTES


@given(kib=st.integers(1, 1 << 20))
def test_a_size_in_kib_reads_back(kib: int) -> None:
    import tempfile

    with tempfile.TemporaryDirectory() as directory:
        entry = Path(directory, "index2")
        entry.mkdir()
        for name, text in (("level", "2"), ("type", "Data"), ("size", f"{kib}K")):
            (entry / name).write_text(text + "\n")
        assert cc.l2_cache_bytes(directory) == kib << 10
