"""What the host offers (``machine``): the CPUs a cgroup quota allows, and the memory left under
MemAvailable or the memory cgroup, read from a made-up /proc and /sys/fs/cgroup."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

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
