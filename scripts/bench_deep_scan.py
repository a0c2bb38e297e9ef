"""Deep-scan and checksum throughput on page-cached data, beside their ceilings, in one run.

Writes a checkpoint with real (random, in-range) FP8 expert bytes and random finite BF16
tensors in several shards, reads it once so it is in the page cache, then times (median of
--repeat runs, interleaved so that load from other processes hits every case alike):

- the deep scan of every FP8 and BF16 byte (``deep_scan``) with 1 and with 2 worker threads,
  in the chunk it picks on this machine (half the L2 cache read from sysfs, ``cache_chunk_bytes``);
- the read ceiling: ``readinto`` of the same bytes into one reused buffer in the scan's chunk
  size, no checks — what any scanner that reads the file must at least do — on 1 thread and
  on 2 (one shard per thread, as the scan);
- a chunk sweep, 64 KiB … 4 MiB: the 1-worker scan and the plain read of the same bytes at
  each size, side by side, with the median of the per-run ratios (scan time over read time of
  the same round, so that a load spike hits both);
- ``--verify-checksums`` (``integrity.check_digests``) with 1 and 2 threads, beside hashlib's
  SHA-256 rate on one core over bytes already in memory, × the cores used.

Goals: the scan ≥ 0.8× the plain read of the same bytes on one core (the read at its best
chunk size in the sweep), and ≥ 1.7× with 2 workers on 2 cores; checksums near the
single-core SHA-256 rate × cores.

    python scripts/bench_deep_scan.py [--out DIR] [--experts 16] [--layers 2] [--repeat 5]
"""

from __future__ import annotations

import argparse
import hashlib
import os
import statistics
import sys
import tempfile
import time
import tracemalloc
from collections.abc import Callable
from concurrent.futures import ProcessPoolExecutor, ThreadPoolExecutor

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from nxdi_gptoss_fp8 import format as fmt
from nxdi_gptoss_fp8.machine import cache_chunk_bytes, l2_cache_bytes
from nxdi_gptoss_fp8.validate.deep_scan import deep_scan, scan_targets
from nxdi_gptoss_fp8.validate.findings import PreflightReport
from nxdi_gptoss_fp8.validate.integrity import check_digests
from nxdi_gptoss_fp8.validate.pipeline import preflight
from nxdi_gptoss_fp8.writer import CheckpointWriter

GB = 1e9
SWEEP = tuple(1 << shift for shift in range(16, 23))  # 64 KiB … 4 MiB


def build(out: str, layers: int, experts: int, seed: int = 0) -> str:
    """A custom-profile checkpoint with gpt-oss-sized experts (H = I = 2880) and random data."""
    dims = fmt.ModelDims(num_hidden_layers=layers, num_local_experts=experts, hidden_size=2880,
                         intermediate_size=2880, head_dim=64, num_attention_heads=8, num_key_value_heads=8,
                         vocab_size=1024, num_experts_per_tok=4, sliding_window=128)
    layout = fmt.Layout.unpadded(dims)
    rng = np.random.default_rng(seed)
    # FP8 bytes with an exponent below all-ones (|x| <= 240, never NaN): what a converter writes
    lookup = np.array([b for b in range(256) if b & 0x78 != 0x78], dtype=np.uint8)
    with CheckpointWriter(out, layout, fmt.PROFILE_CUSTOM, fmt.hf_config(dims), max_shard_size=200_000_000) as writer:
        for name, planned in writer.planned.items():
            spec = planned.spec
            if spec.dtype == fmt.F8_E4M3:
                per_expert = spec.nbytes // spec.shape[0]
                for expert in range(spec.shape[0]):
                    writer.put(name, lookup[rng.integers(0, len(lookup), per_expert, dtype=np.uint8)],
                               offset=expert * per_expert)
            elif spec.dtype == fmt.F32:
                writer.put(name, rng.uniform(2.0**-12, 2.0**-6, spec.numel).astype("<f4"))
            else:
                writer.put(name, (rng.standard_normal(spec.numel, dtype=np.float32) * 0.02).astype("<f4").view("<u2")[1::2].copy())
        return writer.commit()


def warm(paths: list[str]) -> int:
    """Read every file once so the timed runs hit the page cache."""
    total = 0
    buffer = bytearray(64 << 20)
    for path in paths:
        with open(path, "rb", buffering=0) as handle:
            while got := handle.readinto(buffer):
                total += got
    return total


def read_targets(targets: list, chunk: int) -> int:
    """Every target's bytes copied from the page cache into one reused buffer, ``chunk`` at a time."""
    buffer = bytearray(chunk)
    view = memoryview(buffer)
    count = 0
    for target in targets:
        with open(target.path, "rb", buffering=0) as handle:
            handle.seek(target.offset)
            remaining = target.nbytes
            while remaining:
                got = handle.readinto(view[:min(remaining, chunk)])
                remaining -= got
                count += got
    return count


def read_ceiling(targets: list, threads: int, chunk: int) -> int:
    """``read_targets`` with one shard per thread (as the scan spreads them)."""
    by_shard: dict[str, list] = {}
    for target in targets:
        by_shard.setdefault(target.shard, []).append(target)
    if threads == 1:
        return read_targets(targets, chunk)
    with ThreadPoolExecutor(threads) as pool:
        return sum(pool.map(read_targets, by_shard.values(), [chunk] * len(by_shard)))


def sha256_rate(size: int = 256 << 20) -> float:
    """hashlib's SHA-256 on one core over bytes already in memory, in bytes per second."""
    data = os.urandom(1 << 20) * (size >> 20)
    started = time.perf_counter()
    hashlib.sha256(data).digest()
    return size / (time.perf_counter() - started)


def _hash_job(size: int) -> float:
    return sha256_rate(size)


def cpu_scaling(size: int = 128 << 20) -> float:
    """What 2 processes hashing in memory get done now, relative to 1: the cores this shared
    machine gives us at the moment (2.0 on an idle 2-core machine)."""
    with ProcessPoolExecutor(2) as pool:
        list(pool.map(_hash_job, [size >> 4] * 2))  # start the workers
        started = time.perf_counter()
        list(pool.map(_hash_job, [size]))
        one = time.perf_counter() - started
        started = time.perf_counter()
        list(pool.map(_hash_job, [size] * 2))
        two = time.perf_counter() - started
    return 2 * one / two


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", help="checkpoint directory (default: a temporary directory, removed after)")
    parser.add_argument("--layers", type=int, default=2)
    parser.add_argument("--experts", type=int, default=16)
    parser.add_argument("--repeat", type=int, default=5, help="timed runs per case (median reported)")
    args = parser.parse_args()
    workdir = None
    out = args.out
    if out is None:
        workdir = tempfile.mkdtemp(prefix="bench-deep-scan-")
        out = os.path.join(workdir, "ckpt")
    if not os.path.exists(os.path.join(out, fmt.INDEX_FILE)):
        started = time.perf_counter()
        build(out, args.layers, args.experts)
        print(f"built {out} in {time.perf_counter() - started:.1f} s")
    report = preflight(out, allow_custom_model=True)
    assert report.ok, report.render_text()
    view = report.view
    targets = scan_targets(view)
    shard_bytes = sum(header.identity.size for header in view.headers.values())
    cached = warm(sorted(header.path for header in view.headers.values()))
    fp8 = sum(t.nbytes for t in targets if t.fp8)
    scanned = sum(t.nbytes for t in targets)

    chunk = cache_chunk_bytes()

    def scan(workers: int, chunk_bytes: int | None = None) -> int:
        scratch = PreflightReport(path=out)
        stats = deep_scan(view, scratch, chunk_bytes=chunk_bytes, show_progress=False, workers=workers)
        assert scratch.ok and stats.workers == workers, scratch.render_text()
        return stats.bytes_scanned

    def hash_all(workers: int) -> int:
        scratch = PreflightReport(path=out)
        stats = check_digests(view, scratch, verify=True, workers=workers)
        assert stats is not None and scratch.ok and stats.workers == workers, scratch.render_text()
        return stats.bytes_hashed

    cases: dict[str, Callable[[], int]] = {
        "deep scan, 1 worker": lambda: scan(1),
        "read ceiling, 1 thread": lambda: read_ceiling(targets, 1, chunk),
        "deep scan, 2 workers": lambda: scan(2),
        "read ceiling, 2 threads": lambda: read_ceiling(targets, 2, chunk),
        "checksums, 1 thread": lambda: hash_all(1),
        "checksums, 2 threads": lambda: hash_all(2),
    }
    for size in SWEEP:  # default arguments bind this size
        cases[f"sweep scan {size}"] = lambda size=size: scan(1, size)
        cases[f"sweep read {size}"] = lambda size=size: read_ceiling(targets, 1, size)
    times: dict[str, list[float]] = {name: [] for name in cases}
    cpu: dict[str, list[float]] = {name: [] for name in cases}  # this thread's CPU time (1-thread cases)
    counts: dict[str, int] = {}
    sha_rates = []
    for _ in range(args.repeat):
        for name, run in cases.items():
            started, started_cpu = time.perf_counter(), time.thread_time()
            counts[name] = run()
            times[name].append(time.perf_counter() - started)
            cpu[name].append(time.thread_time() - started_cpu)
        sha_rates.append(sha256_rate())
    scaling = cpu_scaling()
    tracemalloc.start()  # one more scan, for the memory it allocates (numpy and buffers are traced)
    scan(2)
    scan_peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    seconds = {name: statistics.median(values) for name, values in times.items()}
    rate = {name: counts[name] / seconds[name] / GB for name in cases}
    sha = statistics.median(sha_rates) / GB
    l2 = l2_cache_bytes()
    print(f"checkpoint: {len(view.headers)} shards, {cached / GB:.2f} GB page-cached; the scan reads {len(targets)} "
          f"tensors, {scanned / GB:.2f} GB ({fp8 / GB:.2f} GB FP8); L2 {'unknown' if l2 is None else f'{l2 >> 10} KiB'}, "
          f"chunks of {chunk >> 10} KiB; "
          f"{os.cpu_count()} CPUs, load {os.getloadavg()[0]:.1f}; median of {args.repeat}; 2 processes hashing in memory "
          f"get {scaling:.2f}x one done now (2.00 on an idle 2-core machine)")
    print(f"{'what':<28}{'bytes':>16}{'seconds':>10}{'GB/s':>8}")
    for name in cases:
        if not name.startswith("sweep"):
            print(f"{name:<28}{counts[name]:>16,}{seconds[name]:>10.3f}{rate[name]:>8.2f}")
    print(f"{'sha256, 1 core, in memory':<28}{'':>16}{'':>10}{sha:>8.2f}")
    paired = {size: statistics.median(r / s for r, s in zip(times[f"sweep read {size}"], times[f"sweep scan {size}"],
                                                             strict=True)) for size in SWEEP}
    paired_cpu = {size: statistics.median(r / s for r, s in zip(cpu[f"sweep read {size}"], cpu[f"sweep scan {size}"],
                                                                 strict=True)) for size in SWEEP}
    best_read = max(rate[f"sweep read {size}"] for size in SWEEP)
    cpu_rate = {name: counts[name] / statistics.median(values) / GB for name, values in cpu.items() if name.startswith("sweep")}
    best_cpu_read = max(cpu_rate[f"sweep read {size}"] for size in SWEEP)
    print("chunk sweep, 1 thread: wall-clock rates, then per CPU-second of this thread (user + system: the kernel's "
          "copy included), per-run = median over rounds of read time / scan time")
    print(f"{'chunk':>10}{'scan GB/s':>11}{'read GB/s':>11}{'scan/read':>11}{'per-run':>9}{'/best read':>12}"
          f"{'scan CPU':>10}{'read CPU':>10}{'per-run':>9}{'/best read':>12}")
    for size in SWEEP:
        scan_rate, read_rate = rate[f"sweep scan {size}"], rate[f"sweep read {size}"]
        scan_cpu, read_cpu = cpu_rate[f"sweep scan {size}"], cpu_rate[f"sweep read {size}"]
        mark = "  <- chosen (half the L2)" if size == chunk else ""
        print(f"{size >> 10:>7} KiB{scan_rate:>11.2f}{read_rate:>11.2f}{scan_rate / read_rate:>10.2f}x{paired[size]:>8.2f}x"
              f"{scan_rate / best_read:>11.2f}x{scan_cpu:>10.2f}{read_cpu:>10.2f}{paired_cpu[size]:>8.2f}x"
              f"{scan_cpu / best_cpu_read:>11.2f}x{mark}")
    print(f"deep scan, 1 worker, {chunk >> 10} KiB chunks: {rate['deep scan, 1 worker'] / rate['read ceiling, 1 thread']:.2f}x "
          f"the plain read of the same bytes in the same chunks, {rate['deep scan, 1 worker'] / best_read:.2f}x the best plain "
          f"read of the sweep (goal >= 0.8x); 2 workers {rate['deep scan, 2 workers'] / rate['deep scan, 1 worker']:.2f}x 1 worker "
          f"(goal >= 1.7x; the read ceiling itself scales {rate['read ceiling, 2 threads'] / rate['read ceiling, 1 thread']:.2f}x); "
          f"{scan_peak / 1e6:.0f} MB allocated at peak")
    print(f"checksums: 1 thread {100 * rate['checksums, 1 thread'] / sha:.0f}% of the 1-core SHA-256 rate, "
          f"2 threads {100 * rate['checksums, 2 threads'] / (2 * sha):.0f}% of 2 x that rate "
          f"({rate['checksums, 2 threads'] / rate['checksums, 1 thread']:.2f}x 1 thread; {shard_bytes / GB:.2f} GB hashed)")
    if workdir is not None:
        import shutil

        shutil.rmtree(workdir, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
