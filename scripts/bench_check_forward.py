"""Time and peak memory of ``check-forward`` on gpt-oss-20b-shaped layers, K = 1, 2, 3.

It writes a synthetic HF MXFP4 source with gpt-oss-20b's layer shapes (H = I = 2880, 32 experts,
top 4, 64 query / 8 KV heads of 64, sliding window 128) and ``--layers`` decoder layers
(default 3), converts it to normalized FP8, then runs ``check_forward`` on it for each K in
``--ks``, each in a fresh process, and prints wall time by phase, peak RSS (``VmHWM``), peak
anonymous memory (``RssAnon``, sampled every 20 ms), the estimate the command states up front,
and the result. Beside them, the baseline: one layer's checkpoint bytes, and with
``--baseline-tree DIR`` (a checkout of an earlier release, e.g. ``git worktree add DIR 0.3.0``)
the same child run from that tree, for each K in ``--baseline-ks``.

The vocabulary is shrunk (default 4096 instead of 201088): the published one adds 2 × 1.16 GB
of BF16 embedding and head to the checkpoint, and 2 × 2.3 GB of float32 to each of the two
models, the same for every K; it does not change what is measured per layer. ``--experts 128
--ks 1`` gives one gpt-oss-120b-shaped layer.

    NXDI_SRC=/path/nxdi NXD_SRC=/path/nxd flock /tmp/heavy.lock python scripts/bench_check_forward.py

Without NxDI importable (or NXDI_SRC/NXD_SRC for the test stand-ins) it says so and exits 2.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from nxdi_gptoss_fp8 import format as fmt  # noqa: E402

GIB = 1 << 30
CHILD = """
import json, sys, threading, time
started = time.perf_counter()
peak_anon = [0]
def sample():
    while True:
        with open("/proc/self/status") as handle:
            anon = next(int(line.split()[1]) * 1024 for line in handle if line.startswith("RssAnon:"))
        peak_anon[0] = max(peak_anon[0], anon)
        time.sleep(0.02)
threading.Thread(target=sample, daemon=True).start()
from nxdi_gptoss_fp8.forward.check import check_forward
report = check_forward(sys.argv[1], sys.argv[2], layers=int(sys.argv[3]), allow_custom_model=True)
with open("/proc/self/status") as handle:
    peak = next(int(line.split()[1]) * 1024 for line in handle if line.startswith("VmHWM:"))
result = report.to_dict()
print(json.dumps({"ok": result["ok"], "summary": result["summary"], "bound": result["bound"],
                  "timings": result["timings_s"], "wall_s": time.perf_counter() - started, "peak_rss": peak,
                  "peak_anon": peak_anon[0], "estimate": (result.get("memory_estimate") or {}).get("total")}))
"""


def child_env(tree: str = ROOT) -> dict[str, str]:
    """``tree`` first (this one, or the baseline's); with NXDI_SRC/NXD_SRC, the test-only Neuron stand-ins too."""
    paths = [tree]
    if os.environ.get("NXDI_SRC") and os.environ.get("NXD_SRC"):
        paths.insert(0, os.path.join(ROOT, "test", "support", "nxdi_standin", "cpu_site"))
    return dict(os.environ, PYTHONPATH=os.pathsep.join(paths), NXD_LOG_LEVEL="warning")


def nxdi_reachable() -> bool:
    probe = "import importlib.util, sys; sys.exit(importlib.util.find_spec('neuronx_distributed_inference') is None)"
    return subprocess.run([sys.executable, "-c", probe], env=child_env(), check=False).returncode == 0


def du(path: str) -> int:
    return sum(os.path.getsize(os.path.join(d, f)) for d, _, files in os.walk(path) for f in files)


def run(tree: str, ckpt: str, source: str, k: int, label: str) -> None:
    # run from the tree: ``python -c`` puts the working directory first on sys.path
    done = subprocess.run([sys.executable, "-c", CHILD, ckpt, source, str(k)], capture_output=True, text=True,
                          env=child_env(tree), cwd=tree, check=False)
    if done.returncode != 0:
        print(f"{label:<8} {k:>2}  failed: {done.stderr.strip().splitlines()[-1:]}")
        return
    r = json.loads(done.stdout.strip().splitlines()[-1])
    t = r["timings"]
    estimate = f"{r['estimate'] / GIB:.2f}" if r.get("estimate") else "-"
    print(f"{label:<8} {k:>2}  {r['wall_s']:>7.1f}  {t.get('window', 0):>7.1f}  {t.get('nxdi', 0):>6.1f}  "
          f"{t.get('reference', 0):>9.1f}  {r['peak_rss'] / GIB:>8.2f}  {r['peak_anon'] / GIB:>9.2f}  {estimate:>8}  "
          f"{r['summary']['max_abs_diff']:>12.3e}  {r['bound']['max_abs_diff']:>9.2e}  {'PASS' if r['ok'] else 'FAIL'}",
          flush=True)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--workdir", help="where to write the checkpoints (default: a temporary directory)")
    parser.add_argument("--layers", type=int, default=3, help="decoder layers in the checkpoint (default 3)")
    parser.add_argument("--experts", type=int, default=32, help="experts per layer (default 32, gpt-oss-20b; 128: 120b)")
    parser.add_argument("--vocab", type=int, default=4096, help="vocabulary size (default 4096; published 201088)")
    parser.add_argument("--ks", type=int, nargs="*", default=[1, 2, 3], help="layer counts to check (default 1 2 3)")
    parser.add_argument("--baseline-tree", help="a checkout of an earlier release to run the same child from")
    parser.add_argument("--baseline-ks", type=int, nargs="*", default=[1], help="layer counts for the baseline tree")
    args = parser.parse_args()
    if not nxdi_reachable():
        print("bench_check_forward: needs NxDI (installed, or NXDI_SRC and NXD_SRC for the test stand-ins)", file=sys.stderr)
        return 2

    from nxdi_gptoss_fp8.convert import convert
    from nxdi_gptoss_fp8.synthetic.sources import SOURCE_MXFP4, source_config, source_tensors, write_source

    dims = fmt.ModelDims(num_hidden_layers=args.layers, num_local_experts=args.experts, hidden_size=2880,
                         intermediate_size=2880, head_dim=64, num_attention_heads=64, num_key_value_heads=8,
                         vocab_size=args.vocab, num_experts_per_tok=4, sliding_window=128)
    work = args.workdir or tempfile.mkdtemp(prefix="bench-check-forward-")
    try:
        source, ckpt = os.path.join(work, "hf"), os.path.join(work, "fp8")
        started = time.perf_counter()
        if not os.path.exists(ckpt):
            # make_source's tiny-size cap does not apply here: its parts write the full-shape source
            write_source(source, source_tensors(dims, SOURCE_MXFP4), source_config(dims, SOURCE_MXFP4),
                         shards="per-layer", original=False)
            convert(source, ckpt, max_shard_size="1GB", progress=False)
        expert_layer = args.experts * 2880 * 5760 + args.experts * 2880 * 2880
        print(f"checkpoint: {args.experts} experts of gpt-oss layer shapes, {args.layers} layers, vocab {args.vocab} "
              f"(shrunk from 201088), {du(ckpt) / GIB:.2f} GiB; baseline: one layer's checkpoint bytes "
              f"{expert_layer / GIB:.2f} GiB of FP8 experts; written in {time.perf_counter() - started:.0f} s")
        print(f"{'run':<8} {'K':>2}  {'wall s':>7}  {'window':>7}  {'nxdi':>6}  {'reference':>9}  {'peak RSS':>8}  "
              f"{'peak anon':>9}  {'estimate':>8}  {'max |Δlogit|':>12}  {'bound':>9}  verdict   (GiB)")
        for k in args.ks:
            run(ROOT, ckpt, source, k, "ours")
        if args.baseline_tree:
            for k in args.baseline_ks:
                run(os.path.abspath(args.baseline_tree), ckpt, source, k, "baseline")
    finally:
        if not args.workdir:
            shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
