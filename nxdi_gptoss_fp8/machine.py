"""What this machine is, for this process: the CPUs it may use (its affinity, bounded by a cgroup
CPU quota), the memory it may still take (MemAvailable, or the memory cgroup's headroom when that
is smaller), the CPU's L2 cache size (and the read chunk sized to it), the umask, where an open
descriptor points and whether an address is file-mapped. Every module that sizes a pool, a chunk
or a file mode by the machine, or asks the kernel about its own descriptors and mappings, asks
here: this module is the one reader of Linux's /proc and /sys (nothing found elsewhere, as on
other systems: the answers fall back, never fail). Stdlib only, a leaf the validator imports.

The read chunk: the validator reads data into one reused buffer and checks it with a few passes
over it; while the chunk fits in L2, the passes after the kernel's copy read it from L2 instead
of L3 or memory. A chunk of half the L2 leaves room for the page-cache lines the copy streams
through (``scripts/bench_deep_scan.py`` sweeps the sizes: on a 1 MiB L2 the deep scan ran at
0.79-0.83x a plain read of the same bytes with 512 KiB chunks, 0.73-0.78x with 4 MiB ones).
"""

from __future__ import annotations

import functools
import math
import os

__all__ = ["CACHE_DIR", "FALLBACK_CHUNK_BYTES", "MAX_CHUNK_BYTES", "MIN_CHUNK_BYTES", "available_memory",
           "cache_chunk_bytes", "chunk_bytes_for", "current_umask", "file_mapped", "host_cpus", "l2_cache_bytes",
           "opened_path", "usable_cpus"]

_PROC = "/proc"
_CGROUP = "/sys/fs/cgroup"
_UNLIMITED = 1 << 60
CACHE_DIR = "/sys/devices/system/cpu/cpu0/cache"
FALLBACK_CHUNK_BYTES = 512 << 10  # where the L2 size cannot be read: half of a common 1 MiB L2
MIN_CHUNK_BYTES = 128 << 10  # below: the per-chunk calls cost more than the cache saves
MAX_CHUNK_BYTES = 4 << 20  # above: more than half of any common L2


def _read(path: str) -> str | None:
    """The text of one /proc or /sys file, or None where it cannot be read."""
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


def usable_cpus() -> int:
    """The CPUs this process may use (``host_cpus`` without the why): the default size of every
    hashing or scanning pool."""
    return host_cpus()[0]


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


def l2_cache_bytes(cache_dir: str = CACHE_DIR) -> int | None:
    """The size of the first CPU's level-2 data (or unified) cache from sysfs (``1024K``,
    ``2M``), or None where it cannot be read (not Linux, a container hiding sysfs, odd text)."""
    try:
        entries = sorted(os.listdir(cache_dir))
    except OSError:
        return None
    for entry in entries:
        if not entry.startswith("index"):
            continue
        texts = {name: _read(os.path.join(cache_dir, entry, name)) for name in ("level", "type", "size")}
        if None in texts.values():
            continue
        fields = {name: str(text).strip() for name, text in texts.items()}
        if fields["level"] != "2" or fields["type"] not in ("Data", "Unified"):
            continue
        text = fields["size"]
        scale = {"K": 1 << 10, "M": 1 << 20}.get(text[-1:].upper(), 1)
        digits = text[:-1] if scale > 1 else text
        if digits.isdigit() and int(digits) > 0:
            return int(digits) * scale
    return None


def chunk_bytes_for(l2_bytes: int | None) -> int:
    """The chunk for an L2 cache of ``l2_bytes``: half of it, within ``MIN_CHUNK_BYTES`` …
    ``MAX_CHUNK_BYTES``; ``FALLBACK_CHUNK_BYTES`` when the size is unknown."""
    if l2_bytes is None:
        return FALLBACK_CHUNK_BYTES
    return min(MAX_CHUNK_BYTES, max(MIN_CHUNK_BYTES, l2_bytes // 2))


@functools.cache
def cache_chunk_bytes() -> int:
    """The read chunk on this machine (``chunk_bytes_for`` this CPU's L2; sysfs read once)."""
    return chunk_bytes_for(l2_cache_bytes())


def current_umask() -> int:
    """The process's umask (read without changing it where Linux tells it)."""
    for line in (_read(os.path.join(_PROC, "self", "status")) or "").splitlines():
        if line.startswith("Umask:"):
            try:
                return int(line.split()[1], 8)
            except (IndexError, ValueError):
                break
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def opened_path(fd: int, path: str) -> str:
    """Where the open descriptor ``fd`` really points (Linux: /proc/self/fd); elsewhere, ``path``
    (the name it was opened by) as it resolves now."""
    try:
        return os.readlink(os.path.join(_PROC, "self", "fd", str(fd)))
    except OSError:
        return os.path.realpath(path)


def file_mapped(address: int) -> bool:
    """Whether ``address`` lies in a mapping of a file on a device (Linux: /proc/self/maps); False
    for anonymous memory and where the mappings cannot be read (not Linux)."""
    try:
        with open(os.path.join(_PROC, "self", "maps"), encoding="ascii", errors="replace") as handle:
            for line in handle:
                fields = line.split(maxsplit=5)
                low, _, high = (fields or [""])[0].partition("-")
                if int(low, 16) <= address < int(high, 16):
                    return len(fields) == 6 and fields[5].startswith("/") and fields[3] != "00:00"
    except (OSError, ValueError):
        return False
    return False
