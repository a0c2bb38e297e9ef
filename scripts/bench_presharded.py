"""What the pre-sharded weights manifest costs, next to what NxDI itself spends on the same files.

1. Load-time check (``sharded_manifest.check_presharded``, the default: sizes, header digests,
   sampled data blocks, settings, listing, and the fingerprint of the checkpoint the application
   names — a gpt-oss-120b index with 15 shard digests and its ``config.json``, the only files
   read of it) for a 64-rank set of full-size gpt-oss-120b rank files
   at tp=64 — sparse files: real headers with the per-rank shapes NxD's tp=64 sharding gives
   (below), data holes — next to safetensors ``load_file`` of the same files (what NxDI's
   ``load_weights`` does per rank). ``load_file`` of all 64 files reads every byte of them (their
   size, ``rank_set_bytes``, is the script's first figure), so by default it runs on
   ``--load-file-ranks`` files and the 64-rank figure is that per-rank time × 64 (say
   ``--load-file-ranks 64`` to run them all).
2. Manifest write (``write_manifest``: whole-file SHA-256 in parallel, plus headers and samples)
   on a scaled set of real-data rank files (``--real-ranks`` × ``--real-rank-mb``; holes would
   hash faster than data), next to the time safetensors ``save_file`` (NxD's shard step) takes to
   write the same bytes, and next to the machine's SHA-256 rate: one core measured on a buffer in
   memory, × the cores this process may use; and what the manifest of the 64 rank files of part 1
   (their size derived from the shapes, never typed) takes at that rate.

Targets: default check < 50 ms for 64 ranks and < 1 % of load_file's time; hashing ≥ 80 % of
single-core SHA-256 × cores.

Per-rank tensors at tp=64 without expert parallelism (E=128, H=I=2880, Nq=64, Nkv=8, D=64,
V=201088): q/k/v [64, 2880] (KV heads replicated to one per rank) and biases [64], o_proj
[2880, 64] and bias [2880], sinks [1], router [128, 2880] + weight_T + bias, expert gate_up
[128, 2880, 90] FP8 with scale [128, 1, 90] and bias [128, 90], down [128, 45, 2880] FP8 with
scale [128, 1, 2880] and bias [128, 2880], norms [2880], rank tensors [1]; embed_tokens
[201088, 45], lm_head [3142, 2880].

    python3 scripts/bench_presharded.py [--workdir DIR] [--load-file-ranks N] [--real-ranks N --real-rank-mb MB]
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import statistics
import sys
import tempfile
import time
from typing import Any

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from nxdi_gptoss_fp8 import format as fmt  # noqa: E402
from nxdi_gptoss_fp8.machine import usable_cpus  # noqa: E402
from nxdi_gptoss_fp8.units import format_bytes, format_duration, plural  # noqa: E402
from nxdi_gptoss_fp8.validate import presharded as sm  # noqa: E402
from nxdi_gptoss_fp8.validate import presharded_manifest as pm  # noqa: E402

TP = 64
DTYPE_BYTES = {"BF16": 2, "F32": 4, "F8_E4M3": 1, "I32": 4}


def rank_tensors(layers: int = 36, experts: int = 128, hidden: int = 2880, inter: int = 2880, heads: int = 64,
                 head_dim: int = 64, vocab: int = 201088, tp: int = TP) -> dict[str, tuple[str, list[int]]]:
    """name → (dtype, per-rank shape) of one gpt-oss-120b rank file at tp=64 (see the module docstring)."""
    per_rank_heads = heads // tp
    tensors: dict[str, tuple[str, list[int]]] = {
        "embed_tokens.weight": ("BF16", [vocab, hidden // tp]),
        "lm_head.weight": ("BF16", [-(-vocab // tp), hidden]),
        "norm.weight": ("BF16", [hidden]),
        "rank_util.rank": ("I32", [1]),
    }
    moe = "feed_forward.moe"
    mlp = f"{moe}.expert_mlps.mlp_op"
    for i in range(layers):
        p = f"layers.{i}"
        attn = f"{p}.self_attn"
        tensors.update({
            f"{p}.input_layernorm.weight": ("BF16", [hidden]),
            f"{p}.post_attention_layernorm.weight": ("BF16", [hidden]),
            f"{attn}.rank_util.rank": ("I32", [1]),
            f"{attn}.learned_sinks.sink": ("BF16", [per_rank_heads]),
            f"{attn}.o_proj.o_proj.weight": ("BF16", [hidden, per_rank_heads * head_dim]),
            f"{attn}.o_proj.o_proj.bias": ("BF16", [hidden]),
            f"{p}.{moe}.router.linear_router.weight": ("BF16", [experts, hidden]),
            f"{p}.{moe}.router.linear_router.bias": ("BF16", [experts]),
            f"{p}.{moe}.router.weight_T": ("BF16", [hidden, experts]),
            f"{p}.{mlp}.gate_up_proj.weight": ("F8_E4M3", [experts, hidden, 2 * inter // tp]),
            f"{p}.{mlp}.gate_up_proj.scale": ("F32", [experts, 1, 2 * inter // tp]),
            f"{p}.{mlp}.gate_up_proj.bias": ("BF16", [experts, 2 * inter // tp]),
            f"{p}.{mlp}.down_proj.weight": ("F8_E4M3", [experts, inter // tp, hidden]),
            f"{p}.{mlp}.down_proj.scale": ("F32", [experts, 1, hidden]),
            f"{p}.{mlp}.down_proj.bias": ("BF16", [experts, hidden]),
        })
        for proj in ("q", "k", "v"):
            tensors[f"{attn}.qkv_proj.{proj}_proj.weight"] = ("BF16", [per_rank_heads * head_dim, hidden])
            tensors[f"{attn}.qkv_proj.{proj}_proj.bias"] = ("BF16", [per_rank_heads * head_dim])
    return tensors


def rank_file_layout(tensors: dict[str, tuple[str, list[int]]]) -> tuple[bytes, int]:
    """(the header with its 8-byte length prefix, the data size) of one rank file holding ``tensors``."""
    header: dict[str, Any] = {}
    offset = 0
    for name in sorted(tensors):
        dtype, shape = tensors[name]
        size = DTYPE_BYTES[dtype]
        for dim in shape:
            size *= dim
        header[name] = {"dtype": dtype, "shape": shape, "data_offsets": [offset, offset + size]}
        offset += size
    raw = json.dumps(header, separators=(",", ":")).encode()
    raw += b" " * (-len(raw) % 8)
    return len(raw).to_bytes(8, "little") + raw, offset


def rank_set_bytes(tensors: dict[str, tuple[str, list[int]]] | None = None, tp: int = TP) -> int:
    """The bytes of the ``tp`` rank files part 1 writes (headers included): what ``load_file``
    reads and a compile's manifest hashes, derived from the per-rank shapes."""
    header, data = rank_file_layout(rank_tensors() if tensors is None else tensors)
    return tp * (len(header) + data)


def write_sparse_rank(path: str, tensors: dict[str, tuple[str, list[int]]]) -> int:
    """A safetensors file with a real header and a data hole; returns its size."""
    header, data = rank_file_layout(tensors)
    with open(path, "wb") as handle:
        handle.write(header)
        handle.truncate(len(header) + data)
    return len(header) + data


def sha256_rate(size: int = 256 << 20) -> float:
    """Single-core SHA-256 rate in bytes/s on an in-memory buffer (best of 3)."""
    buffer = os.urandom(size)
    best = min(_timed(lambda: hashlib.sha256(buffer).digest()) for _ in range(3))
    return size / best


def _timed(func: Any) -> float:
    started = time.perf_counter()
    func()
    return time.perf_counter() - started


def named_checkpoint(path: str, shards: int = 15) -> str:
    """The index (every tensor name, 15 shard digests) and config.json of a gpt-oss-120b checkpoint:
    what the load-time check fingerprints of the checkpoint the application names."""
    dims = fmt.PROFILES[fmt.PROFILE_120B]
    layout = fmt.Layout(dims, dims.hidden_size, dims.intermediate_size)
    names = sorted(fmt.expected_namespace(layout))
    files = [f"model-{i + 1:05d}-of-{shards:05d}.safetensors" for i in range(shards)]
    digests = {name: hashlib.sha256(name.encode()).hexdigest() for name in files}
    index = {"metadata": fmt.index_metadata(layout, fmt.PROFILE_120B, shard_sha256=digests),
             "weight_map": {name: files[i * shards // len(names)] for i, name in enumerate(names)}}
    os.makedirs(path)
    with open(os.path.join(path, fmt.INDEX_FILE), "w") as handle:
        json.dump(index, handle, indent=2)
    with open(os.path.join(path, fmt.CONFIG_FILE), "w") as handle:
        json.dump(fmt.hf_config(dims), handle, indent=2)
    return path


def bench_check(workdir: str, load_file_ranks: int) -> int:
    """Part 1; returns the bytes of the rank files it wrote."""
    from safetensors.torch import load_file

    compiled = os.path.join(workdir, "compiled-120b-tp64")
    weights = os.path.join(compiled, pm.WEIGHTS_DIR)
    os.makedirs(weights)
    tensors = rank_tensors()
    sizes = [write_sparse_rank(os.path.join(weights, pm.rank_file(r)), tensors) for r in range(TP)]
    config = {"tp_degree": TP, "world_size": TP, "torch_dtype": "bfloat16"}
    # the manifest a compile would write (hashing holes is pointless here: digests of the real files)
    entries = {}
    header_raw = None
    for rank in range(TP):
        read = pm.read_rank(os.path.join(weights, pm.rank_file(rank)), pm.SAMPLE_BLOCKS, pm.SAMPLE_BLOCK)
        header_raw = read.header
        entries[rank] = pm.RankEntry(rank, pm.rank_file(rank), sizes[rank], hashlib.sha256(read.header).hexdigest(),
                                     read.sample_sha256, "0" * 64)
    checkpoint = named_checkpoint(os.path.join(workdir, "gpt-oss-120b-fp8"))
    sources = [pm.ManifestSource(checkpoint, pm.checkpoint_identity(checkpoint))]
    manifest = pm.Manifest(TP, TP, entries, pm.shard_settings(config), sources, written_at="bench")
    with open(pm.manifest_path(compiled), "w") as handle:
        json.dump(manifest.to_dict(), handle)
    assert header_raw is not None
    total = sum(sizes)
    assert total == rank_set_bytes(tensors), (total, rank_set_bytes(tensors))
    print(f"rank files   {TP} × {format_bytes(sizes[0])} = {format_bytes(total)} apparent (sparse), "
          f"{len(tensors)} tensors, header {format_bytes(len(header_raw))} each; named checkpoint's index "
          f"{format_bytes(os.path.getsize(os.path.join(checkpoint, fmt.INDEX_FILE)))}")
    first = _timed(lambda: sm.check_presharded(compiled, ranks=range(TP), config=config, checkpoint=checkpoint))
    times = []
    for _ in range(15):
        started = time.perf_counter()
        check = sm.check_presharded(compiled, ranks=range(TP), config=config, checkpoint=checkpoint)
        times.append(time.perf_counter() - started)
        assert check.ok, check.render_text()
    median = statistics.median(times)
    per_rank = []
    for rank in range(load_file_ranks):
        path = os.path.join(weights, pm.rank_file(rank))
        per_rank.append(_timed(lambda path=path: load_file(path)))
    load_rank = statistics.median(per_rank)
    load_all = load_rank * TP if load_file_ranks < TP else sum(per_rank)
    scope = "measured" if load_file_ranks >= TP else f"{plural(load_file_ranks, 'rank')} measured × {TP // max(load_file_ranks, 1)}"
    print(f"check        default check, 64 ranks: {format_duration(median)} median of 15 (first run {format_duration(first)}); "
          f"target < 50 ms: {'met' if median < 0.05 else 'MISSED'}")
    print(f"load_file    safetensors load_file: {format_duration(load_rank)} per rank, {format_duration(load_all)} for 64 ranks "
          f"({scope}; holes read as zeros, page cache)")
    print(f"ratio        check / load_file = {100 * median / load_all:.3f} %; target < 1 %: "
          f"{'met' if median < 0.01 * load_all else 'MISSED'}")
    return total


def bench_write(workdir: str, ranks: int, rank_mb: int, set_bytes: int) -> None:
    """Part 2; ``set_bytes``: the 120b tp64 rank files of part 1, whose manifest time is stated."""
    import torch
    from safetensors.torch import save_file

    compiled = os.path.join(workdir, "compiled-real")
    weights = os.path.join(compiled, pm.WEIGHTS_DIR)
    os.makedirs(weights)
    elements = rank_mb * 1_000_000
    write_times = []
    for rank in range(ranks):
        shard = {"layers.0.feed_forward.moe.expert_mlps.mlp_op.gate_up_proj.weight":
                 torch.randint(0, 256, (elements,), dtype=torch.uint8, generator=torch.Generator().manual_seed(rank))}
        write_times.append(_timed(lambda shard=shard, rank=rank: save_file(shard, os.path.join(weights, pm.rank_file(rank)))))
        del shard
    total = sum(os.path.getsize(os.path.join(weights, pm.rank_file(r))) for r in range(ranks))
    cores = usable_cpus()  # the pool write_manifest starts by default
    single = sha256_rate()
    hashing = _timed(lambda: pm.write_manifest(compiled, ranks=range(ranks), config={"tp_degree": ranks}, sources=[],
                                               progress=False))
    rate = total / hashing
    target = 0.8 * single * cores
    print(f"real data    {plural(ranks, 'rank file')} × {format_bytes(total / ranks)} = {format_bytes(total)} (random bytes, page cache)")
    print(f"sha256       one core {single / 1e9:.2f} GB/s; × {cores} cores = {single * cores / 1e9:.2f} GB/s")
    print(f"write        safetensors save_file of the same bytes: {format_duration(sum(write_times))} "
          f"({total / sum(write_times) / 1e9:.2f} GB/s)")
    print(f"manifest     write_manifest: {format_duration(hashing)} ({rate / 1e9:.2f} GB/s, {100 * rate / (single * cores):.0f} % "
          f"of single-core × cores); target ≥ 80 %: {'met' if rate >= target else 'MISSED'}; "
          f"+{100 * hashing / sum(write_times):.0f} % on the write time")
    print(f"120b tp64    at this rate the manifest of the {TP} rank files above ({format_bytes(set_bytes)}) takes "
          f"≈ {format_duration(set_bytes / rate)}")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workdir", help="where to write (default: a temporary directory, removed afterwards)")
    parser.add_argument("--load-file-ranks", type=int, default=4, metavar="N", help="rank files load_file reads (default 4)")
    parser.add_argument("--real-ranks", type=int, default=8, metavar="N", help="real-data rank files (default 8)")
    parser.add_argument("--real-rank-mb", type=int, default=256, metavar="MB", help="MB per real-data rank file (default 256)")
    args = parser.parse_args()
    if args.real_ranks * args.real_rank_mb > 10_000:
        parser.error("keep the real-data set under 10 GB")
    workdir = args.workdir or tempfile.mkdtemp(prefix="bench-presharded-")
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")
    print(f"machine      load average {load:.2f} on {os.cpu_count()} CPUs (a shared machine hashes slower than its cores)")
    try:
        set_bytes = bench_check(workdir, max(1, min(args.load_file_ranks, TP)))
        bench_write(workdir, args.real_ranks, args.real_rank_mb, set_bytes)
    finally:
        if args.workdir is None:
            shutil.rmtree(workdir, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
