"""What this host offers a run: the CPUs it may use (its affinity, bounded by a cgroup CPU
quota) and the memory it may still take (MemAvailable, or the memory cgroup's headroom when
that is smaller). The converter's workers and check-forward's memory check size themselves by
these. Stdlib only; Linux's /proc and /sys/fs/cgroup, and nothing found elsewhere.
"""

from __future__ import annotations

import math
import os

__all__ = ["available_memory", "host_cpus"]

_PROC = "/proc"
_CGROUP = "/sys/fs/cgroup"
_UNLIMITED = 1 << 60


def _read(path: str) -> str | None:
    try:
        with open(path, encoding="ascii") as handle:
            return handle.read()
    except (OSError, UnicodeDecodeError):
        return None


def _cgroup_dirs(controller: str) -> list[str]:
    """Where this process's cgroup files for ``controller`` may be: the v2 unified hierarchy
    (at its own path, then the namespace root) and the v1 controller's directory."""
    dirs = []
    for line in (_read(os.path.join(_PROC, "self", "cgroup")) or "").splitlines():
        number, controllers, path = [*line.split(":", 2), "", ""][:3]
        if number == "0" and controllers == "":
            dirs.append(os.path.join(_CGROUP, path.lstrip("/")))
        elif controller in controllers.split(","):
            dirs += [os.path.join(_CGROUP, controllers, path.lstrip("/")), os.path.join(_CGROUP, controller)]
    return [*dirs, _CGROUP, os.path.join(_CGROUP, controller)]


def _cgroup_cpu_quota() -> int | None:
    """The CPUs the cgroup's CPU quota allows (rounded up), or None when there is none."""
    for directory in _cgroup_dirs("cpu"):
        text = _read(os.path.join(directory, "cpu.max"))
        if text is not None:
            quota, _, period = text.strip().partition(" ")
        else:
            quota = (_read(os.path.join(directory, "cpu.cfs_quota_us")) or "").strip()
            period = (_read(os.path.join(directory, "cpu.cfs_period_us")) or "").strip()
            if not quota:
                continue
        if quota in ("max", "-1") or not quota.lstrip("-").isdigit() or not period.isdigit() or int(period) <= 0:
            return None
        return max(1, math.ceil(int(quota) / int(period)))
    return None


def host_cpus() -> tuple[int, str]:
    """(CPUs this process may use, how that was found): its CPU affinity, bounded by a cgroup
    CPU quota."""
    cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    quota = _cgroup_cpu_quota()
    if quota is not None and quota < cpus:
        return quota, f"the cgroup CPU quota allows {quota} of {cpus} CPUs"
    return cpus, f"{cpus} CPUs offered"


def _meminfo_available() -> int | None:
    for line in (_read(os.path.join(_PROC, "meminfo")) or "").splitlines():
        if line.startswith("MemAvailable:"):
            return int(line.split()[1]) * 1024
    return None


def _cgroup_headroom() -> int | None:
    """Bytes the memory cgroup still allows (limit − usage, reclaimable file pages counted
    free), or None without a limit."""
    for directory in _cgroup_dirs("memory"):
        for limit_file, usage_file, inactive_key in (("memory.max", "memory.current", "inactive_file"),
                                                     ("memory.limit_in_bytes", "memory.usage_in_bytes",
                                                      "total_inactive_file")):
            limit, usage = _read(os.path.join(directory, limit_file)), _read(os.path.join(directory, usage_file))
            if limit is None or usage is None:
                continue
            limit, usage = limit.strip(), usage.strip()
            if not limit.isdigit() or int(limit) >= _UNLIMITED or not usage.isdigit():
                return None
            inactive = 0
            for line in (_read(os.path.join(directory, "memory.stat")) or "").splitlines():
                key, _, value = line.partition(" ")
                if key == inactive_key and value.strip().isdigit():
                    inactive = int(value)
            return max(0, int(limit) - max(0, int(usage) - inactive))
    return None


def available_memory() -> tuple[int | None, str]:
    """(bytes this run may still use, where the figure comes from): /proc/meminfo's
    MemAvailable, or the memory cgroup's headroom when that is smaller; None if neither is known."""
    system, cgroup = _meminfo_available(), _cgroup_headroom()
    if cgroup is not None and (system is None or cgroup < system):
        return cgroup, "under the memory cgroup's limit"
    return system, "MemAvailable"
