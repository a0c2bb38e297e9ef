"""What this machine is (``machine``): the CPUs a cgroup quota allows, and the memory left under
MemAvailable or the memory cgroup, read from a made-up /proc and /sys/fs/cgroup; this CPU's L2
size read from sysfs (or unknown), and the read chunk of half of it within bounds; the umask; where
an open descriptor points and whether an address is file-mapped (a made-up /proc/self/maps, and
this process's own), each falling back where there is no /proc."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from nxdi_gptoss_fp8 import machine


def _fake_host(monkeypatch: pytest.MonkeyPatch, tmp_path: Path, files: dict[str, str]) -> None:
    for name, text in files.items():
        path = tmp_path / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    monkeypatch.setattr(machine, "_PROC", str(tmp_path / "proc"))
    monkeypatch.setattr(machine, "_CGROUP", str(tmp_path / "cgroup"))


@pytest.mark.parametrize("files, expected", [
    ({"proc/self/cgroup": "0::/job\n", "cgroup/job/cpu.max": "150000 100000\n"}, 2),  # v2: 1.5 CPUs, rounded up
    ({"proc/self/cgroup": "0::/\n", "cgroup/cpu.max": "max 100000\n"}, None),
    ({"proc/self/cgroup": "4:cpu,cpuacct:/box\n", "cgroup/cpu,cpuacct/box/cpu.cfs_quota_us": "100000\n",
      "cgroup/cpu,cpuacct/box/cpu.cfs_period_us": "100000\n"}, 1),  # v1
    ({"proc/self/cgroup": "4:cpu:/\n", "cgroup/cpu/cpu.cfs_quota_us": "-1\n",
      "cgroup/cpu/cpu.cfs_period_us": "100000\n"}, None),
    ({}, None),
])
def test_the_cgroup_cpu_quota_bounds_the_cpus(monkeypatch: pytest.MonkeyPatch, tmp_path: Path,
                                              files: dict[str, str], expected: int | None) -> None:
    _fake_host(monkeypatch, tmp_path, files)
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {0, 1, 2, 3})
    cpus, why = machine.host_cpus()
    assert cpus == (expected or 4)
    assert ("quota" in why) == (expected is not None)


@pytest.mark.parametrize("files, expected, where", [
    ({"proc/meminfo": "MemTotal: 100 kB\nMemAvailable:    2048 kB\n"}, 2 << 20, "MemAvailable"),
    ({"proc/meminfo": "MemAvailable: 4096 kB\n", "proc/self/cgroup": "0::/job\n",
      "cgroup/job/memory.max": str(3 << 20), "cgroup/job/memory.current": str(2 << 20),
      "cgroup/job/memory.stat": f"anon 5\ninactive_file {1 << 20}\n"}, 2 << 20, "cgroup"),  # reclaimable counted free
    ({"proc/meminfo": "MemAvailable: 4096 kB\n", "proc/self/cgroup": "0::/\n", "cgroup/memory.max": "max\n",
      "cgroup/memory.current": "5\n"}, 4 << 20, "MemAvailable"),
    ({"proc/meminfo": "MemAvailable: 4096 kB\n", "proc/self/cgroup": "5:memory:/box\n",
      "cgroup/memory/box/memory.limit_in_bytes": str(1 << 20), "cgroup/memory/box/memory.usage_in_bytes": "0"},
     1 << 20, "cgroup"),  # v1
    ({}, None, "MemAvailable"),
])
def test_available_memory_is_the_smaller_of_meminfo_and_the_cgroup(monkeypatch: pytest.MonkeyPatch, tmp_path: Path,
                                                                  files: dict[str, str], expected: int | None,
                                                                  where: str) -> None:
    _fake_host(monkeypatch, tmp_path, files)
    available, why = machine.available_memory()
    assert available == expected and where in why


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
    assert machine.l2_cache_bytes(str(tmp_path)) == expected
    assert machine.l2_cache_bytes(str(tmp_path / "missing")) is None


@pytest.mark.parametrize(("l2", "chunk"), [
    (None, machine.FALLBACK_CHUNK_BYTES), (1 << 20, 512 << 10), (2 << 20, 1 << 20), (32 << 20, machine.MAX_CHUNK_BYTES),
    (64 << 10, machine.MIN_CHUNK_BYTES), (1, machine.MIN_CHUNK_BYTES),
])
def test_the_chunk_is_half_the_l2_within_bounds(l2: int | None, chunk: int) -> None:
    assert machine.chunk_bytes_for(l2) == chunk
    assert machine.MIN_CHUNK_BYTES <= machine.cache_chunk_bytes() <= machine.MAX_CHUNK_BYTES


@settings(max_examples=200, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(size=st.text(max_size=12), level=st.sampled_from(["1", "2", "3", "2x", ""]))
def test_any_sysfs_text_gives_a_positive_size_or_none(tmp_path: Path, size: str, level: str) -> None:
    entry = tmp_path / "index2"
    entry.mkdir(exist_ok=True)
    for name, text in (("level", level), ("type", "Unified"), ("size", size)):
        (entry / name).write_text(text, encoding="utf-8")
    found = machine.l2_cache_bytes(str(tmp_path))
    assert found is None or (found > 0 and level == "2")
    assert machine.MIN_CHUNK_BYTES <= machine.chunk_bytes_for(found) <= machine.MAX_CHUNK_BYTES


@given(kib=st.integers(1, 1 << 20))
def test_a_size_in_kib_reads_back(kib: int) -> None:
    import tempfile

    with tempfile.TemporaryDirectory() as directory:
        entry = Path(directory, "index2")
        entry.mkdir()
        for name, text in (("level", "2"), ("type", "Data"), ("size", f"{kib}K")):
            (entry / name).write_text(text + "\n")
        assert machine.l2_cache_bytes(directory) == kib << 10


@pytest.mark.parametrize("mask", [0o022, 0o077, 0o002])
def test_the_umask_is_read_without_changing_it(monkeypatch: pytest.MonkeyPatch, tmp_path: Path, mask: int) -> None:
    previous = os.umask(mask)
    try:
        assert machine.current_umask() == mask
        _fake_host(monkeypatch, tmp_path, {})  # no /proc: the umask is set and set back
        assert machine.current_umask() == mask
        assert os.umask(mask) == mask
    finally:
        os.umask(previous)


def test_an_open_descriptor_names_the_file_it_points_to_even_after_a_rename(monkeypatch: pytest.MonkeyPatch,
                                                                            tmp_path: Path) -> None:
    (tmp_path / "a").write_bytes(b"x")
    fd = os.open(tmp_path / "a", os.O_RDONLY)
    try:
        os.rename(tmp_path / "a", tmp_path / "b")
        if os.path.isdir("/proc/self/fd"):  # Linux: the descriptor, not the name, decides
            assert machine.opened_path(fd, str(tmp_path / "a")) == str((tmp_path / "b").resolve())
        _fake_host(monkeypatch, tmp_path / "elsewhere", {})  # no /proc: the name as it resolves now
        assert machine.opened_path(fd, str(tmp_path / "a")) == os.path.realpath(tmp_path / "a")
    finally:
        os.close(fd)


MAPS = ("00400000-00452000 r-xp 00000000 08:02 173521 /usr/bin/app\n"
        "00651000-00652000 rw-p 00000000 00:00 0 \n"
        "7f0000000000-7f0000100000 r--p 00000000 00:2a 12 /dev/shm/blob\n"
        "7f0000100000-7f0000200000 r--p 00000000 00:00 0 [heap]\n"
        "7f0000200000-7f0000300000 r--p 00001000 fd:01 99 /data/weights (deleted)\n")


@pytest.mark.parametrize("address, expected", [
    (0x00400000, True), (0x00451FFF, True), (0x00452000, False),  # a file's mapping, its end excluded
    (0x00651000, False),  # anonymous
    (0x7F0000000010, True),  # a file on a numbered device (tmpfs)
    (0x7F0000100000, False),  # named but not a file
    (0x7F00002FFFFF, True),  # deleted since: still a file's pages
    (0x10, False),  # in no mapping
])
def test_an_address_is_file_mapped_only_inside_a_files_mapping(monkeypatch: pytest.MonkeyPatch, tmp_path: Path,
                                                              address: int, expected: bool) -> None:
    _fake_host(monkeypatch, tmp_path, {"proc/self/maps": MAPS})
    assert machine.file_mapped(address) is expected


@settings(max_examples=50, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(text=st.text(alphabet=st.sampled_from("0123456789abcdef-: /[]\n\x00é"), max_size=200),
       address=st.integers(0, 1 << 48))
def test_any_maps_text_gives_an_answer(monkeypatch: pytest.MonkeyPatch, tmp_path: Path, text: str,
                                       address: int) -> None:
    _fake_host(monkeypatch, tmp_path, {"proc/self/maps": text})
    assert machine.file_mapped(address) in (True, False)


def test_this_processs_own_mappings(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    import ctypes
    import mmap

    (tmp_path / "blob").write_bytes(b"\0" * mmap.PAGESIZE)
    with open(tmp_path / "blob", "rb") as handle:
        mapping = mmap.mmap(handle.fileno(), 0, access=mmap.ACCESS_COPY)
    anonymous = mmap.mmap(-1, mmap.PAGESIZE, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)  # shared: /dev/zero
    try:
        file_address = ctypes.addressof(ctypes.c_char.from_buffer(mapping))
        anonymous_address = ctypes.addressof(ctypes.c_char.from_buffer(anonymous))
        assert machine.file_mapped(anonymous_address) is False
        assert machine.file_mapped(file_address) is os.path.exists("/proc/self/maps")
        _fake_host(monkeypatch, tmp_path / "elsewhere", {})  # no /proc (not Linux): never file-mapped
        assert machine.file_mapped(file_address) is False
    finally:
        import gc

        gc.collect()
        mapping.close()
        anonymous.close()
