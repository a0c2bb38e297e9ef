"""Building the ``dequantized`` accuracy reference and goldens at gpt-oss-20b and -120b layer shapes.

For each shape, a sparse normalized checkpoint of the published dimensions cut to a few layers
(``sparse_checkpoint``: real headers, real scales, zero data) is written, then one fresh process
builds the reference as ``load_hf_model`` / ``goldens`` do (``hf_reference.build_reference``,
bfloat16) and generates a few tokens greedily as ``goldens`` does. Reported beside the baseline,
the reference model's own BF16 size (what any HF reference of those layers holds): the peak
resident memory of the process, the time per layer built, and the time per token generated.

    python scripts/bench_goldens.py [--layers-20b 2] [--layers-120b 1] [--tokens 4] [--dir /tmp]

Needs about 1.6 × the reference size of free memory for the largest shape (120b: ~9 GB a layer
with the embedding and head). Prints one table.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from nxdi_gptoss_fp8 import format as fmt
from nxdi_gptoss_fp8.units import format_bytes

__all__ = ["main", "measure", "write_checkpoint"]


def write_checkpoint(out: str, profile: str, layers: int) -> str:
    """A sparse normalized checkpoint of ``profile``'s shapes with ``layers`` decoder layers."""
    import numpy as np

    from nxdi_gptoss_fp8.writer import CheckpointWriter

    dims = dataclasses.replace(fmt.PROFILES[profile], num_hidden_layers=layers)
    layout = fmt.Layout(dims, dims.hidden_size, dims.intermediate_size)
    rng = np.random.default_rng(0)
    with CheckpointWriter(out, layout, fmt.PROFILE_CUSTOM, fmt.hf_config(dims), max_shard_size=5_000_000_000,
                          source={"generator": "goldens benchmark"}, record_sha256=False, sparse=True) as writer:
        for name, planned in writer.planned.items():
            if fmt.is_expert_scale(name):
                writer.put(name, rng.uniform(2.0**-12, 2.0**-6, size=planned.spec.numel).astype("<f4"))
            else:
                writer.put_zeros(name)
        writer.commit(show_progress=False)
    return out


def measure(ckpt: str, tokens: int) -> dict[str, object]:
    """In this (fresh) process: build the reference, generate ``tokens`` tokens; the figures."""
    import torch

    from nxdi_gptoss_fp8.convert.workers import peak_rss
    from nxdi_gptoss_fp8.forward.goldens import generate_expected
    from nxdi_gptoss_fp8.forward.hf_reference import build_reference

    start_rss = peak_rss()
    build = build_reference(ckpt, "dequantized", allow_custom_model=True)
    ids = torch.tensor([[1, 2, 3, 4, 5, 6, 7, 8]])
    started = time.perf_counter()
    generate_expected(build.model, ids, torch.ones_like(ids), tokens)
    generate_s = time.perf_counter() - started
    return {"model_bytes": build.model_bytes, "peak_rss": peak_rss(), "start_rss": start_rss, "layer_s": build.layer_s,
            "build_s": build.build_s, "generate_s": generate_s, "tokens": tokens, "memory": build.memory}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--layers-20b", type=int, default=2)
    parser.add_argument("--layers-120b", type=int, default=1)
    parser.add_argument("--tokens", type=int, default=4)
    parser.add_argument("--dir", default=None, help="where the sparse checkpoints go (default: a temporary directory)")
    parser.add_argument("--measure", metavar="CKPT", help=argparse.SUPPRESS)  # the child process
    args = parser.parse_args()
    if args.measure:
        print(json.dumps(measure(args.measure, args.tokens)))
        return 0
    rows = []
    work = tempfile.mkdtemp(prefix="bench-goldens-", dir=args.dir)
    try:
        for profile, layers in ((fmt.PROFILE_20B, args.layers_20b), (fmt.PROFILE_120B, args.layers_120b)):
            if layers < 1:
                continue
            ckpt = write_checkpoint(os.path.join(work, profile), profile, layers)
            done = subprocess.run([sys.executable, __file__, "--measure", ckpt, "--tokens", str(args.tokens)],
                                  capture_output=True, text=True, check=False)
            if done.returncode != 0:
                print(f"{profile}: failed: {done.stderr.strip().splitlines()[-1] if done.stderr.strip() else done.returncode}")
                continue
            rows.append((profile, layers, json.loads(done.stdout.strip().splitlines()[-1])))
            shutil.rmtree(ckpt)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    print(f"{'shape':<13} {'layers':>6} {'baseline: BF16 model':>21} {'peak RSS':>10} {'peak/model':>10} "
          f"{'s/layer':>8} {'build s':>8} {'s/token':>8}")
    for profile, layers, r in rows:
        per_layer = sum(r["layer_s"]) / len(r["layer_s"])
        print(f"{profile:<13} {layers:>6} {format_bytes(r['model_bytes']):>21} {format_bytes(r['peak_rss']):>10} "
              f"{r['peak_rss'] / r['model_bytes']:>10.2f} {per_layer:>8.2f} {r['build_s']:>8.1f} "
              f"{r['generate_s'] / r['tokens']:>8.2f}")
    print("baseline: the reference model's own bfloat16 parameters (embedding, head, the layers built); peak RSS is the "
          "whole process (interpreter, torch and transformers included)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
