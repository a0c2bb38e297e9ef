"""Time and peak memory of ``check-forward`` on gpt-oss-20b-shaped layers, K = 1 and K = 2.

It writes a synthetic HF MXFP4 source with gpt-oss-20b's layer shapes (H = I = 2880, 32 experts,
top 4, 64 query / 8 KV heads of 64, sliding window 128) and ``--layers`` decoder layers
(default 3), converts it to normalized FP8, then runs ``check_forward`` on it for K = 1 and 2,
each in a fresh process, and prints wall time by phase, peak RSS and the result. The checkpoint's
size is printed beside them: peak memory follows K, not the checkpoint.

The vocabulary is shrunk (default 4096 instead of 201088): the published one adds 2 × 1.16 GB
of BF16 embedding and head to the checkpoint, and 2 × 2.3 GB of float32 to each of the two
models, the same for every K; it does not change what is measured per layer.

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
import json, sys, time
started = time.perf_counter()
from nxdi_gptoss_fp8.forward.check import check_forward
report = check_forward(sys.argv[1], sys.argv[2], layers=int(sys.argv[3]), allow_custom_model=True)
with open("/proc/self/status") as handle:
    peak = next(int(line.split()[1]) * 1024 for line in handle if line.startswith("VmHWM:"))
result = report.to_dict()
print(json.dumps({"ok": result["ok"], "summary": result["summary"], "bound": result["bound"],
                  "timings": result["timings_s"], "wall_s": time.perf_counter() - started, "peak_rss": peak}))
"""


def child_env() -> dict[str, str]:
    """This tree first; with NXDI_SRC/NXD_SRC, the test-only Neuron stand-ins too."""
    paths = [ROOT]
    if os.environ.get("NXDI_SRC") and os.environ.get("NXD_SRC"):
        paths.insert(0, os.path.join(ROOT, "test", "support", "nxdi_standin", "cpu_site"))
    return dict(os.environ, PYTHONPATH=os.pathsep.join(paths), NXD_LOG_LEVEL="warning")


def nxdi_reachable() -> bool:
    probe = "import importlib.util, sys; sys.exit(importlib.util.find_spec('neuronx_distributed_inference') is None)"
    return subprocess.run([sys.executable, "-c", probe], env=child_env(), check=False).returncode == 0


def du(path: str) -> int:
    return sum(os.path.getsize(os.path.join(d, f)) for d, _, files in os.walk(path) for f in files)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--workdir", help="where to write the checkpoints (default: a temporary directory)")
    parser.add_argument("--layers", type=int, default=3, help="decoder layers in the checkpoint (default 3)")
    parser.add_argument("--vocab", type=int, default=4096, help="vocabulary size (default 4096; published 201088)")
    args = parser.parse_args()
    if not nxdi_reachable():
        print("bench_check_forward: needs NxDI (installed, or NXDI_SRC and NXD_SRC for the test stand-ins)", file=sys.stderr)
        return 2

    from nxdi_gptoss_fp8.convert import convert
    from nxdi_gptoss_fp8.synthetic.sources import SOURCE_MXFP4, make_source

    dims = fmt.ModelDims(num_hidden_layers=args.layers, num_local_experts=32, hidden_size=2880, intermediate_size=2880,
                         head_dim=64, num_attention_heads=64, num_key_value_heads=8, vocab_size=args.vocab,
                         num_experts_per_tok=4, sliding_window=128)
    work = args.workdir or tempfile.mkdtemp(prefix="bench-check-forward-")
    try:
        source, ckpt = os.path.join(work, "hf"), os.path.join(work, "fp8")
        started = time.perf_counter()
        make_source(source, SOURCE_MXFP4, dims=dims, original=False, shards="per-layer")
        convert(source, ckpt, max_shard_size="1GB", progress=False)
        expert_layer = 32 * 2880 * 5760 + 32 * 2880 * 2880
        print(f"checkpoint: gpt-oss-20b layer shapes, {args.layers} layers, vocab {args.vocab} (shrunk from 201088), "
              f"{du(ckpt) / GIB:.2f} GiB ({expert_layer / GIB:.2f} GiB of FP8 experts per layer); "
              f"written in {time.perf_counter() - started:.0f} s")
        print(f"{'K':>2}  {'wall s':>7}  {'preflight':>9}  {'window':>7}  {'nxdi':>6}  {'reference':>9}  "
              f"{'peak RSS GiB':>12}  {'max |Δlogit|':>12}  {'bound':>9}  verdict")
        for k in (1, 2):
            done = subprocess.run([sys.executable, "-c", CHILD, ckpt, source, str(k)], capture_output=True, text=True,
                                  env=child_env(), check=False)
            if done.returncode != 0:
                print(f"{k:>2}  failed: {done.stderr.strip().splitlines()[-1:]}")
                continue
            r = json.loads(done.stdout.strip().splitlines()[-1])
            t = r["timings"]
            print(f"{k:>2}  {r['wall_s']:>7.1f}  {t.get('preflight', 0):>9.2f}  {t.get('window', 0):>7.1f}  "
                  f"{t.get('nxdi', 0):>6.1f}  {t.get('reference', 0):>9.1f}  {r['peak_rss'] / GIB:>12.2f}  "
                  f"{r['summary']['max_abs_diff']:>12.3e}  {r['bound']['max_abs_diff']:>9.2e}  {'PASS' if r['ok'] else 'FAIL'}")
    finally:
        if not args.workdir:
            shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
