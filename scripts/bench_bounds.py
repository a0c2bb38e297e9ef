"""Adversarial inputs against the preflight's bounds (docs/format.md, Bounds and trust), each measured next to its limit.

Builds, in a work directory:

  phantom-500k     a tiny checkpoint whose index lists 500,000 phantom keys (~9 MB index)
  phantom-64mb     the same with as many phantom keys as fit in a 64 MB index
  tensors-64mb     a shard of one-byte tensors, all listed: header + index just under 64 MB
  claimed-padding  an index claiming I' = 2^27 and one sparse 1 GiB "scale" of that shape
  zero-scales-120b a full-size gpt-oss-120b, sparse, whose scales are all zero (a
                   preallocated download): every scale must be read and refused

and runs the preflight on each in a fresh process, printing wall time, peak RSS above the
process's baseline, bytes read by the preflight and the limit. Run it alone (it is heavy):

    flock /tmp/heavy.lock python scripts/bench_bounds.py [--workdir DIR]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import struct
import subprocess
import sys
import tempfile
import time
from typing import Any

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
sys.path.insert(0, os.path.join(ROOT, "scripts"))

MB = 1 << 20


def _status_kb(field: str) -> int:
    with open("/proc/self/status") as handle:
        return next(int(line.split()[1]) for line in handle if line.startswith(field + ":"))


def _child(path: str) -> dict[str, Any]:
    """Runs in the child: one preflight, measured."""
    from nxdi_gptoss_fp8 import preflight

    base = _status_kb("VmRSS")
    started = time.perf_counter()
    report = preflight(path, allow_custom_model=True)
    elapsed = time.perf_counter() - started
    summary = report.summary()
    return {
        "elapsed_s": elapsed, "peak_mib": (_status_kb("VmHWM") - base) / 1024, "bytes_read": report.bytes_read,
        "errors": summary["errors"], "stored": len(report.findings),
        "codes": sorted({f.code for f in report.errors}),
    }


def _metadata_bytes(path: str) -> int:
    from nxdi_gptoss_fp8.safeio.safetensors_header import read_header

    total = sum(os.path.getsize(os.path.join(path, name)) for name in ("config.json", "model.safetensors.index.json"))
    for name in os.listdir(path):
        if name.endswith(".safetensors"):
            try:
                total += read_header(os.path.join(path, name)).bytes_read
            except (OSError, ValueError):  # a broken shard adds no metadata
                continue
    return total


def _tiny(path: str) -> str:
    from nxdi_gptoss_fp8.synthetic.tiny import make_tiny

    return make_tiny(path)


def _phantom(path: str, count: int) -> None:
    _tiny(path)
    index_path = os.path.join(path, "model.safetensors.index.json")
    with open(index_path) as handle:
        index = json.load(handle)
    index["weight_map"].update(dict.fromkeys((f"{i:x}" for i in range(count)), "a.safetensors"))
    index["metadata"].pop("shard_sha256", None)
    with open(index_path, "w") as handle:
        json.dump(index, handle, separators=(",", ":"))
    with open(os.path.join(path, "a.safetensors"), "wb") as handle:
        handle.write(struct.pack("<Q", 2) + b"{}")


def _phantom_64mb(path: str) -> None:
    # each entry "<hex>":"a.safetensors", is about 26 bytes: fill up to just under 64 MB
    _phantom(path, (64_000_000 - 200_000) // 27)
    size = os.path.getsize(os.path.join(path, "model.safetensors.index.json"))
    assert size <= 64_000_000, size


def _tiny_tensors(path: str) -> None:
    """As many one-byte tensors as fit, listed in the index: header + index just under 64 MB."""
    _tiny(path)
    count = (64_000_000 - 200_000) // 98  # ~70 header bytes + ~28 index bytes per tensor
    names = [f"t{i}" for i in range(count)]
    text = ("{" + ",".join(f'"{n}":{{"dtype":"U8","shape":[1],"data_offsets":[{i},{i + 1}]}}' for i, n in enumerate(names)) + "}").encode()
    with open(os.path.join(path, "extra.safetensors"), "wb") as handle:
        handle.write(struct.pack("<Q", len(text)) + text + bytes(count))
    index_path = os.path.join(path, "model.safetensors.index.json")
    with open(index_path) as handle:
        index = json.load(handle)
    index["weight_map"].update(dict.fromkeys(names, "extra.safetensors"))
    index["metadata"].pop("shard_sha256", None)
    with open(index_path, "w") as handle:
        json.dump(index, handle, separators=(",", ":"))


def _claimed_padding(path: str) -> None:
    from nxdi_gptoss_fp8 import format as fmt

    _tiny(path)
    index_path = os.path.join(path, "model.safetensors.index.json")
    with open(index_path) as handle:
        index = json.load(handle)
    padded = 64 + 32 * 2**22
    index["metadata"]["padded_intermediate_size"] = padded
    key = f"layers.0.{fmt.GATE_UP}.scale"
    shard = index["weight_map"][key]
    with open(index_path, "w") as handle:
        json.dump(index, handle)
    shard_path = os.path.join(path, shard)
    with open(shard_path, "rb") as handle:
        blob = handle.read()
    (length,) = struct.unpack("<Q", blob[:8])
    header = json.loads(blob[8:8 + length])
    data = blob[8 + length:]
    begin, end = header[key]["data_offsets"]
    data = data[:begin] + data[end:]
    for entry in header.values():
        if isinstance(entry, dict) and "data_offsets" in entry and entry["data_offsets"][0] >= end:
            entry["data_offsets"] = [o - (end - begin) for o in entry["data_offsets"]]
    size = 4 * 4 * 2 * padded  # 1 GiB
    header[key] = {"dtype": "F32", "shape": [4, 1, 2 * padded], "data_offsets": [len(data), len(data) + size]}
    text = json.dumps(header).encode()
    with open(shard_path, "wb") as handle:
        handle.write(struct.pack("<Q", len(text)) + text + data)
        handle.truncate(8 + len(text) + len(data) + size)


def _zero_scales_120b(path: str) -> None:
    from nxdi_gptoss_fp8 import format as fmt
    from nxdi_gptoss_fp8.writer import CheckpointWriter

    dims = fmt.PROFILES[fmt.PROFILE_120B]
    layout = fmt.Layout.unpadded(dims)
    with CheckpointWriter(path, layout, fmt.PROFILE_120B, fmt.hf_config(dims), max_shard_size=5_000_000_000,
                          source={"generator": "bounds benchmark"}, record_sha256=False, sparse=True) as writer:
        for name in writer.planned:
            writer.put_zeros(name)  # the scales too: a preallocated, never-written download
        writer.commit()


CASES = (
    # name, builder, time limit (s), memory limit (MiB), what
    ("phantom-500k", lambda p: _phantom(p, 500_000), 10.0, 1024.0, "500,000 phantom keys"),
    ("phantom-64mb", _phantom_64mb, 10.0, 1024.0, "a 64 MB index of phantom keys"),
    ("tensors-64mb", _tiny_tensors, 10.0, 1024.0, "one-byte tensors: header + index of 64 MB"),
    ("claimed-padding", _claimed_padding, 10.0, 1024.0, "I'=2^27 claimed, one sparse 1 GiB scale"),
    ("zero-scales-120b", _zero_scales_120b, 1.0, 1024.0, "full-size 120b, all scales zero"),
)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workdir", help="where to build the inputs (default: a temporary directory)")
    parser.add_argument("--only", nargs="*", help="case names to run")
    parser.add_argument("--child", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        print(json.dumps(_child(args.child)))
        return 0
    workdir = args.workdir or tempfile.mkdtemp(prefix="bench-bounds-")
    failed = 0
    try:
        print(f"{'case':<18}{'metadata MB':>12}{'wall s':>9}{'limit':>7}{'peak MiB':>10}{'limit':>7}"
              f"{'bytes read':>15}{'errors':>10}{'stored':>8}  verdict codes")
        for name, build, time_limit, memory_limit, _ in CASES:
            if args.only and name not in args.only:
                continue
            path = os.path.join(workdir, name)
            if not os.path.exists(path):
                build(path)
            done = subprocess.run([sys.executable, __file__, "--child", path], capture_output=True, text=True, check=True)
            m = json.loads(done.stdout.strip().splitlines()[-1])
            within = m["elapsed_s"] <= time_limit and m["peak_mib"] <= memory_limit
            failed += not within
            codes = ", ".join(m["codes"][:4]) + (" …" if len(m["codes"]) > 4 else "")
            print(f"{name:<18}{_metadata_bytes(path) / 1e6:>12.1f}{m['elapsed_s']:>9.2f}{time_limit:>7.0f}"
                  f"{m['peak_mib']:>10.1f}{memory_limit:>7.0f}{m['bytes_read']:>15,}{m['errors']:>10,}{m['stored']:>8,}"
                  f"  {'ok ' if within else 'OVER'} {codes}")
        for name, _, _, _, what in CASES:
            print(f"# {name}: {what}")
    finally:
        if not args.workdir:
            shutil.rmtree(workdir, ignore_errors=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
