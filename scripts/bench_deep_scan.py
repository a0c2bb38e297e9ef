"""Deep-scan throughput on page-cached data, beside the memory-bandwidth ceiling, in one run.

Writes a checkpoint with real (random, in-range) FP8 expert bytes, reads it once so it is in
the page cache, then times on one core:

- the deep scan of every FP8 expert byte (``deep_scan``, after a preflight);
- the ceiling: copying the same bytes from the page cache into the same reused buffer
  (``readinto`` in the scan's chunk size, no checks) — what any scanner that reads the file
  must at least do;
- a copy of the same number of bytes in memory (no file at all), chunk by chunk.

    python scripts/bench_deep_scan.py [--out DIR] [--experts 16] [--layers 2]
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
import tracemalloc

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from nxdi_gptoss_fp8 import format as fmt
from nxdi_gptoss_fp8.checks import preflight
from nxdi_gptoss_fp8.deep_scan import CHUNK_BYTES, deep_scan, scan_targets
from nxdi_gptoss_fp8.writer import CheckpointWriter

GB = 1e9


def build(out: str, layers: int, experts: int, seed: int = 0) -> str:
    """A custom-profile checkpoint with gpt-oss-sized experts (H = I = 2880) and random data."""
    dims = fmt.ModelDims(num_hidden_layers=layers, num_local_experts=experts, hidden_size=2880,
                         intermediate_size=2880, head_dim=64, num_attention_heads=8, num_key_value_heads=8,
                         vocab_size=1024, num_experts_per_tok=4, sliding_window=128)
    layout = fmt.Layout.unpadded(dims)
    rng = np.random.default_rng(seed)
    # FP8 bytes with an exponent below all-ones (|x| <= 240, never NaN): what a converter writes
    lookup = np.array([b for b in range(256) if b & 0x78 != 0x78], dtype=np.uint8)
    with CheckpointWriter(out, layout, fmt.PROFILE_CUSTOM, fmt.hf_config(dims), max_shard_size=2_000_000_000) as writer:
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


def read_ceiling(targets: list, chunk: int = CHUNK_BYTES, repeats: int = 3) -> tuple[float, int]:
    """Best of ``repeats``: every target's bytes copied from the page cache into one reused buffer."""
    buffer = bytearray(chunk)
    view = memoryview(buffer)
    best, count = float("inf"), 0
    for _ in range(repeats):
        started, count = time.perf_counter(), 0
        for target in targets:
            with open(target.path, "rb", buffering=0) as handle:
                handle.seek(target.offset)
                remaining = target.nbytes
                while remaining:
                    got = handle.readinto(view[:min(remaining, chunk)])
                    remaining -= got
                    count += got
        best = min(best, time.perf_counter() - started)
    return best, count


def memory_copy(total: int, chunk: int = CHUNK_BYTES, repeats: int = 3) -> float:
    """Best of ``repeats``: seconds to copy ``total`` bytes in memory, ``chunk`` bytes at a time."""
    source = bytearray(os.urandom(1 << 20)) * (chunk >> 20)
    target = bytearray(chunk)
    best = float("inf")
    for _ in range(repeats):
        started, remaining = time.perf_counter(), total
        while remaining > 0:
            memoryview(target)[:] = source
            remaining -= chunk
        best = min(best, time.perf_counter() - started)
    return best


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", help="checkpoint directory (default: a temporary directory, removed after)")
    parser.add_argument("--layers", type=int, default=2)
    parser.add_argument("--experts", type=int, default=16)
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
    targets = scan_targets(report.view)
    cached = warm(sorted(header.path for header in report.view.headers.values()))
    fp8 = sum(t.nbytes for t in targets)
    stats = deep_scan(report.view, report, show_progress=False)
    assert report.ok, report.render_text()
    tracemalloc.start()  # a second scan, for the memory it allocates (numpy and buffers are traced)
    deep_scan(report.view, report, show_progress=False)
    scan_peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    read_s, read_bytes = read_ceiling(targets)
    copy_s = memory_copy(read_bytes)
    rows = [
        ("deep scan (1 core)", stats.bytes_scanned, stats.elapsed_s),
        ("ceiling: read the same bytes", read_bytes, read_s),
        ("memory copy of as many bytes", read_bytes, copy_s),
    ]
    print(f"checkpoint: {len(report.view.headers)} shards, {cached / GB:.2f} GB page-cached, "
          f"{len(targets)} FP8 expert tensors, {fp8 / GB:.2f} GB of FP8 bytes; chunks of {CHUNK_BYTES / 1e6:.1f} MB")
    print(f"{'what':<32}{'bytes':>16}{'seconds':>10}{'GB/s':>8}")
    for what, count, seconds in rows:
        print(f"{what:<32}{count:>16,}{seconds:>10.3f}{count / seconds / GB:>8.2f}")
    print(f"deep scan: {100 * read_s / stats.elapsed_s:.0f}% of the read ceiling, "
          f"{100 * copy_s / stats.elapsed_s:.0f}% of the memory-copy rate; the scan allocates "
          f"{scan_peak / 1e6:.0f} MB at peak (each FP8 byte read once: {stats.bytes_scanned:,} bytes)")
    if workdir is not None:
        import shutil

        shutil.rmtree(workdir, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
