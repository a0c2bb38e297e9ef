"""Converter speed and memory on gpt-oss-120b-shaped layers, side by side with NxDI's dequant.

Builds a synthetic HF MXFP4 source with the real gpt-oss-120b layer shapes (H = I = 2880,
128 experts, 64 query / 8 KV heads of 64; every layer one shard, like the published repos)
with random FP4 codes and realistic block scales (each channel's exponents spread around
2^-7 with a standard deviation of 1.5 octaves). The vocabulary is shrunk (default 8192 rows
instead of 201088) to keep the embedding small; expert tensors are full size. Then, for 1, 2
and 4 layers, each in a fresh process with a warm page cache:

  ours   convert(): MXFP4 → normalized FP8 with exact power-of-two scales, written, hashed
         and renamed into place (everything the CLI does)
  nxdi   the baseline: the MXFP4 → BF16 dequant NxDI's HF conversion runs for the same
         layers, reimplemented its way: whole tensors loaded, FP4 value table indexed by
         int64 nibbles, ldexp, de-interleave/concatenate/transpose. NxDI keeps every layer's
         result in its state dict; here each layer's result is dropped after it is made, so
         its peak RSS is one layer's worth (a lower bound for NxDI). Its dequant runs in
         chunks of --nxdi-rows-per-chunk rows (default 2^20; NxDI's 32768*1024 would need
         ~15 GB for one gate_up tensor on this 24 GB machine)

and prints wall time, throughput (MB/s of FP8 written; for the baseline, of the same number
of values) and peak RSS. Targets: ours ≥ 300 MB/s on 2 cores, peak RSS < 1 GB and flat.

    python scripts/bench_convert.py [--layers 1 2 4] [--workdir DIR] [--keep]
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

import torch  # noqa: E402

from nxdi_gptoss_fp8 import format as fmt  # noqa: E402
from nxdi_gptoss_fp8.convert import SOURCE_MXFP4, source_specs  # noqa: E402
from nxdi_gptoss_fp8.writer import build_header  # noqa: E402

BENCH_VOCAB = 8192
FP4_VALUES = (0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0, -0.0, -0.5, -1.0, -1.5, -2.0, -3.0, -4.0, -6.0)


def bench_dims(layers: int, vocab: int) -> fmt.ModelDims:
    base = fmt.PROFILES[fmt.PROFILE_120B]
    return fmt.ModelDims(**{**base.as_dict(), "num_hidden_layers": layers, "vocab_size": vocab})


def _fill(spec: fmt.TensorSpec, generator: torch.Generator, write: callable) -> None:  # type: ignore[valid-type]
    """Stream random data for one source tensor, one expert (or the whole small tensor) at a time."""
    if spec.name.endswith("_blocks"):
        for _ in range(spec.shape[0]):
            write(torch.randint(0, 256, spec.shape[1:], dtype=torch.uint8, generator=generator))
    elif spec.name.endswith("_scales"):
        rows, blocks = spec.shape[1:]
        for _ in range(spec.shape[0]):
            centre = 120.0 + torch.randn((rows, 1), generator=generator)
            spread = 1.5 * torch.randn((rows, blocks), generator=generator)
            write((centre + spread).round().clamp(100, 140).to(torch.uint8))
    else:
        values = 0.02 * torch.randn(spec.shape, generator=generator)
        if spec.name.endswith("norm.weight"):
            values += 1.0
        write(values.to(torch.bfloat16))


def write_shard(path: str, specs: list[fmt.TensorSpec], generator: torch.Generator) -> None:
    header, offsets = build_header(specs)
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        os.pwrite(fd, header, 0)
        for spec in sorted(specs, key=lambda s: offsets[s.name]):
            position = offsets[spec.name]

            def write(tensor: torch.Tensor, _fd: int = fd) -> None:
                nonlocal position
                data = tensor.contiguous().view(torch.uint8).numpy().tobytes()
                os.pwrite(_fd, data, position)
                position += len(data)

            _fill(spec, generator, write)
    finally:
        os.close(fd)


def make_sources(workdir: str, layer_counts: list[int], vocab: int) -> dict[int, str]:
    """One set of layer shards, shared (hard links) by sources of each layer count."""
    most = max(layer_counts)
    dims = bench_dims(most, vocab)
    pool = os.path.join(workdir, "pool")
    os.makedirs(pool, exist_ok=True)
    specs = {name: fmt.TensorSpec(name, s.shape, "U8" if s.dtypes == ("U8",) else "BF16")
             for name, s in source_specs(dims, SOURCE_MXFP4).items()}
    generator = torch.Generator().manual_seed(0)
    groups = {"globals": [s for n, s in specs.items() if ".layers." not in n]}
    for layer in range(most):
        groups[f"layer{layer}"] = [s for n, s in specs.items() if f".layers.{layer}." in n]
    for group, members in groups.items():
        path = os.path.join(pool, f"{group}.safetensors")
        if not os.path.exists(path):
            started = time.perf_counter()
            write_shard(path + ".tmp", members, generator)
            os.rename(path + ".tmp", path)
            print(f"  wrote source shard {group} ({os.path.getsize(path) / 1e9:.2f} GB) in "
                  f"{time.perf_counter() - started:.1f} s", file=sys.stderr)
    sources = {}
    for count in layer_counts:
        root = os.path.join(workdir, f"src-{count}")
        shutil.rmtree(root, ignore_errors=True)
        os.makedirs(root)
        config = fmt.hf_config(bench_dims(count, vocab))
        config["quantization_config"] = {"quant_method": "mxfp4"}
        with open(os.path.join(root, fmt.CONFIG_FILE), "w") as handle:
            json.dump(config, handle)
        weight_map = {}
        for group in ["globals"] + [f"layer{i}" for i in range(count)]:
            file_name = f"{group}.safetensors"
            os.link(os.path.join(pool, file_name), os.path.join(root, file_name))
            weight_map.update(dict.fromkeys((s.name for s in groups[group]), file_name))
        with open(os.path.join(root, fmt.INDEX_FILE), "w") as handle:
            json.dump({"metadata": {}, "weight_map": weight_map}, handle)
        sources[count] = root
    return sources


def _peak_rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def _vm_hwm_mb() -> float:
    with open("/proc/self/status") as handle:
        for line in handle:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024
    return float("nan")


def child_ours(src: str, out: str) -> dict:
    from nxdi_gptoss_fp8.checks import preflight
    from nxdi_gptoss_fp8.convert import convert
    from nxdi_gptoss_fp8.writer import CheckpointWriter

    streaming_peak: list[float] = []
    commit = CheckpointWriter.commit

    def measured_commit(self, *args, **kwargs):  # type: ignore[no-untyped-def]
        streaming_peak.append(_vm_hwm_mb())  # the peak before the writer hashes the shards
        return commit(self, *args, **kwargs)

    CheckpointWriter.commit = measured_commit  # type: ignore[method-assign]
    started = time.perf_counter()
    report = convert(src, out, progress=False, overwrite=True)
    elapsed = time.perf_counter() - started
    valid = preflight(out, allow_custom_model=True).ok
    return {"seconds": elapsed, "fp8_bytes": report.fp8_bytes, "values": report.fp8_values,
            "inexact": report.inexact_values, "max_rel_error": report.max_rel_error,
            "peak_rss_mb": _peak_rss_mb(), "streaming_peak_rss_mb": streaming_peak[0], "valid": valid}


def _nxdi_dequant(blocks: torch.Tensor, scales: torch.Tensor, rows_per_chunk: int) -> torch.Tensor:
    """MXFP4 → BF16 the NxDI way: int64 nibble indices into a value table, then ldexp."""
    scales = scales.to(torch.int32) - 127
    lut = torch.tensor(FP4_VALUES, dtype=torch.bfloat16)
    *prefix, groups, width = blocks.shape
    rows_total = blocks.numel() // width
    blocks, scales = blocks.reshape(rows_total, width), scales.reshape(rows_total, 1)
    out = torch.empty(rows_total, width * 2, dtype=torch.bfloat16)
    for start in range(0, rows_total, rows_per_chunk):
        stop = min(start + rows_per_chunk, rows_total)
        chunk = blocks[start:stop]
        part = out[start:stop]
        part[:, 0::2] = lut[(chunk & 0x0F).to(torch.long)]
        part[:, 1::2] = lut[(chunk >> 4).to(torch.long)]
        torch.ldexp(part, scales[start:stop], out=part)
    return out.reshape(*prefix, groups * width * 2)


def child_nxdi(src: str, rows_per_chunk: int) -> dict:
    from safetensors import safe_open

    with open(os.path.join(src, fmt.INDEX_FILE)) as handle:
        weight_map = json.load(handle)["weight_map"]
    with open(os.path.join(src, fmt.CONFIG_FILE)) as handle:
        layers = json.load(handle)["num_hidden_layers"]
    started = time.perf_counter()
    values = 0
    for layer in range(layers):
        prefix = f"model.layers.{layer}.mlp.experts."
        with safe_open(os.path.join(src, weight_map[prefix + "gate_up_proj_blocks"]), "pt") as handle:
            for proj in ("gate_up_proj", "down_proj"):
                blocks = handle.get_tensor(prefix + proj + "_blocks")  # whole tensors, as NxDI loads them
                scales = handle.get_tensor(prefix + proj + "_scales")
                dense = _nxdi_dequant(blocks, scales, rows_per_chunk)
                del blocks, scales
                if proj == "gate_up_proj":
                    gate, up = dense[:, ::2, ...], dense[:, 1::2, ...]
                    result = torch.cat((gate, up), dim=1).transpose(1, 2)
                    del gate, up
                else:
                    result = dense.transpose(1, 2)
                values += result.numel()
                del dense, result
    return {"seconds": time.perf_counter() - started, "values": values, "peak_rss_mb": _peak_rss_mb()}


def _run_child(args: list[str]) -> dict:
    done = subprocess.run([sys.executable, os.path.abspath(__file__), "--child", *args], capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise SystemExit(f"child {args[0]} failed:\n{done.stderr}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def _warm(path: str) -> None:
    for entry in os.scandir(path):
        if entry.is_file():
            with open(entry.path, "rb") as handle:
                while handle.read(1 << 24):
                    pass


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--layers", type=int, nargs="+", default=[1, 2, 4])
    parser.add_argument("--vocab", type=int, default=BENCH_VOCAB, help=f"vocabulary rows (default {BENCH_VOCAB})")
    parser.add_argument("--workdir", help="where sources and outputs go (default: a temporary directory)")
    parser.add_argument("--keep", action="store_true", help="keep the work directory")
    parser.add_argument("--nxdi-rows-per-chunk", type=int, default=1 << 20,
                        help="rows of 16 bytes per dequant chunk in the baseline (NxDI's default 32768*1024 "
                             "needs ~15 GB for one 120b gate_up tensor; the chunk size does not change its speed much)")
    parser.add_argument("--child", nargs="+", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        kind, *rest = args.child
        result = child_ours(*rest) if kind == "ours" else child_nxdi(rest[0], int(rest[1]))
        print(json.dumps(result))
        return 0

    workdir = args.workdir or tempfile.mkdtemp(prefix="bench-convert-")
    os.makedirs(workdir, exist_ok=True)
    print(f"torch {torch.__version__}, {os.cpu_count()} CPUs, torch threads {torch.get_num_threads()}; "
          f"gpt-oss-120b layer shapes, vocab shrunk to {args.vocab}; work dir {workdir}")
    try:
        sources = make_sources(workdir, sorted(set(args.layers)), args.vocab)
        rows = []
        for count in sorted(set(args.layers)):
            _warm(sources[count])
            out = os.path.join(workdir, f"out-{count}")
            ours = _run_child(["ours", sources[count], out])
            shutil.rmtree(out, ignore_errors=True)
            _warm(sources[count])
            nxdi = _run_child(["nxdi", sources[count], str(args.nxdi_rows_per_chunk)])
            rows.append((count, ours, nxdi))
        print(f"\n{'layers':>6} | {'ours s':>7} {'MB/s FP8':>9} {'peak RSS':>9} {'(streaming)':>11} {'inexact':>9} "
              f"{'valid':>5} | {'NxDI dequant s':>14} {'MB/s (same values)':>18} {'peak RSS':>9} | speed-up")
        for count, ours, nxdi in rows:
            ours_rate = ours["fp8_bytes"] / ours["seconds"] / 1e6
            nxdi_rate = nxdi["values"] / nxdi["seconds"] / 1e6
            print(f"{count:>6} | {ours['seconds']:>7.1f} {ours_rate:>9.0f} {ours['peak_rss_mb']:>7.0f}MB "
                  f"{ours['streaming_peak_rss_mb']:>9.0f}MB {ours['inexact']:>9} {ours['valid']!s:>5} | "
                  f"{nxdi['seconds']:>14.1f} {nxdi_rate:>18.0f} {nxdi['peak_rss_mb']:>7.0f}MB | "
                  f"{nxdi['seconds'] / ours['seconds']:.1f}x")
        print("(streaming) = peak RSS before the writer hashes the shards at commit; MB/s FP8 counts the whole "
              "convert() call: encode, write, fsync, hash, rename")
        total_values = sum(o["values"] for _, o, _ in rows)
        print(f"\nexactness: {sum(o['inexact'] for _, o, _ in rows)} of {total_values} expert values inexact "
              f"(worst relative error {max(o['max_rel_error'] for _, o, _ in rows):.3g})")
    finally:
        if not args.keep and not args.workdir:
            shutil.rmtree(workdir, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
