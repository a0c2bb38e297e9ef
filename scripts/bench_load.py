"""Loading speed and memory, ours against NxDI's own paths, side by side in one run.

For one model (gpt-oss-20b shapes: H = I = 2880, 32 experts, 64/8 heads, full vocabulary,
``--layers`` decoder layers, default 2) it writes the same weights three ways (HF MXFP4,
NxDI's legacy FP8 layout, our normalized FP8) and measures, each case in a fresh process with
the page cache warm:

  (a) nxdi-hf       NxDI's HF path (MXFP4 → BF16), real NxDI code      [needs NXDI_SRC or NxDI]
  (b) nxdi-legacy   NxDI's legacy path on an FP8 checkpoint (its FP8 route)  [same]
  (c) load_file     safetensors.torch.load_file of every normalized shard: the floor
  (d) ours          our normalized get_state_dict, preflight included (through NxDI's
                    checkpoint_loader_fn with the hook registered when NxDI is there)
  (e) ours-verify   (d) with NXDI_GPTOSS_FP8_VERIFY_AT_LOAD=1: shard_sha256 checked over the
                    mapped bytes at load
  (f) ours-private  (d) with NXDI_GPTOSS_FP8_LOAD_MODE=private: shards read into anonymous
                    memory instead of mapped

and prints wall time, peak RSS, growth of anonymous RSS, and the time to read every tensor once.
Then it loads the sparse full-size gpt-oss-120b checkpoint (real headers and scales, data
holes) the same way as (d). Targets: (d) ≥ 100× faster than (a), ≥ 10× faster than (b), anon
growth ≤ 1/10 of (b), (d) ≤ its preflight + 1.2 × (c), reading (d) as fast as (c); 120b state
dict < 2 s with peak RSS growth < 512 MB.

    NXDI_SRC=/path/to/neuronx-distributed-inference python3 scripts/bench_load.py [--workdir DIR]
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import shutil
import statistics
import subprocess
import sys
import time
from typing import Any

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
sys.path.insert(0, os.path.join(ROOT, "scripts"))
sys.path.insert(0, os.path.join(ROOT, "test", "support"))  # nxdi_standin

import torch  # noqa: E402

from nxdi_gptoss_fp8 import format as fmt  # noqa: E402

GIB = 1 << 30
REPEAT = 7  # loads under a second are timed this many times (median); memory is from the first
CASES = ("nxdi-hf", "nxdi-legacy", "load_file", "ours", "ours-verify", "ours-private")
NEEDS_NXDI = ("nxdi-hf", "nxdi-legacy")
FP8_CONFIG: dict[str, Any] = {
    "quantized": True, "quantization_type": fmt.QUANTIZATION_TYPE, "quantization_dtype": fmt.QUANTIZATION_DTYPE,
}


# --------------------------------------------------------------------------- measuring (child side)


def _status(field: str) -> int:
    with open("/proc/self/status") as handle:
        for line in handle:
            if line.startswith(field + ":"):
                return int(line.split()[1]) * 1024
    raise RuntimeError(f"no {field} in /proc/self/status")


_KEEP: list[Any] = []
_INT_VIEW = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}


def read_all(state_dict: dict[str, torch.Tensor]) -> None:
    """Touch every element of every tensor once (a max over its bits), in its own layout."""
    for tensor in state_dict.values():
        if tensor.numel():
            tensor.view(_INT_VIEW[tensor.element_size()]).max()


def _nxdi_modeling() -> Any:
    """NxDI's GPT-OSS module: installed, or from NXDI_SRC with the Neuron packages stubbed."""
    import importlib.util

    if importlib.util.find_spec("neuronx_distributed_inference") is None:
        from nxdi_standin import neuron_stubs

        stubs = neuron_stubs.installed(os.path.join(os.environ["NXDI_SRC"], "src"))
        stubs.__enter__()
        _KEEP.append(stubs)  # the child process exits with NxDI imported; nothing to undo
        os.environ.setdefault("NEURON_PLATFORM_TARGET_OVERRIDE", "trn2")
    import importlib

    return importlib.import_module("neuronx_distributed_inference.models.gpt_oss.modeling_gpt_oss")


def _nxdi_loader(path: str, neuron_kwargs: dict[str, Any]) -> Any:
    """A callable returning NxDI's ``get_state_dict(path, config)`` for a GPT-OSS config built
    the way NxDI's drivers build it (what ``checkpoint_loader_fn`` calls)."""
    modeling = _nxdi_modeling()
    neuron_config = modeling.GptOssNeuronConfig(**{"logical_nc_config": 1, **neuron_kwargs})

    def load_config(config: Any) -> None:
        with open(os.path.join(path, fmt.CONFIG_FILE)) as handle:
            values = json.load(handle)
        values.pop("torch_dtype", None)
        config.__dict__.update(values)
        config._name_or_path = path

    config = modeling.GptOssInferenceConfig(neuron_config, load_config=load_config)
    app_cls = modeling.NeuronGptOssForCausalLM
    return lambda: app_cls.get_state_dict(path, config)  # resolved at call time: hooked once registered


def _fp8_kwargs(path: str, layers: int, extra: dict[str, Any]) -> dict[str, Any]:
    excluded = ["lm_head", *(f"layers.{i}.self_attn" for i in range(layers))]
    return {**FP8_CONFIG, "quantized_checkpoints_path": path, "modules_to_not_convert": excluded, **extra}


def run_child(case: str, path: str, layers: int, extra: dict[str, Any], *, read: bool = True) -> dict[str, Any]:
    """Inside the fresh process: build the loader, then time loading and reading."""
    import warnings

    warnings.simplefilter("ignore")
    preflight_s = None
    via = ""
    if case == "nxdi-hf":
        os.environ["CHECKPOINT_FORMAT"] = "hf"
        load, via = _nxdi_loader(path, extra), "NxDI get_state_dict"
    elif case == "nxdi-legacy":
        os.environ["CHECKPOINT_FORMAT"] = "legacy"
        load, via = _nxdi_loader(path, _fp8_kwargs(path, layers, extra)), "NxDI get_state_dict"
    elif case == "load_file":
        from safetensors.torch import load_file

        shards = sorted(f for f in os.listdir(path) if f.endswith(".safetensors"))

        def load() -> dict[str, torch.Tensor]:
            out: dict[str, torch.Tensor] = {}
            for shard in shards:
                out.update(load_file(os.path.join(path, shard)))
            return out
        via = "safetensors"
    else:
        os.environ["CHECKPOINT_FORMAT"] = "normalized_fp8"
        os.environ[fmt.ALLOW_CUSTOM_ENV] = "1"
        if case == "ours-verify":
            os.environ[fmt.VERIFY_AT_LOAD_ENV] = "1"
        elif case == "ours-private":
            os.environ[fmt.LOAD_MODE_ENV] = fmt.LOAD_MODE_PRIVATE
        from nxdi_gptoss_fp8.nxdi import hook as nxdi_hook

        kwargs = _fp8_kwargs(path, layers, extra)
        timings: list[float] = []
        checked_preflight = nxdi_hook.checked_preflight

        def timed_preflight(*args: Any) -> Any:
            report = checked_preflight(*args)
            timings.append(report.elapsed_s)
            return report

        nxdi_hook.checked_preflight = timed_preflight  # type: ignore[assignment]
        if os.environ.get("NXDI_SRC") or _has_nxdi():
            load = _nxdi_loader(path, kwargs)
            nxdi_hook.register()
            via = "NxDI get_state_dict + hook"
        else:
            from nxdi_gptoss_fp8.loader import load_state_dict

            def load() -> dict[str, torch.Tensor]:
                report = timed_preflight(path, kwargs)
                return load_state_dict(path, kwargs, report=report)
            via = "loader (no NxDI here)"
    rss0, anon0 = _status("VmRSS"), _status("RssAnon")
    times: list[float] = []
    reads: list[float] = []
    anon1 = hwm = anon2 = 0
    while not times or (times[0] < 1.0 and len(times) < REPEAT):  # fast cases: the median of a few runs
        started = time.perf_counter()
        state_dict = load()
        times.append(time.perf_counter() - started)
        if len(times) == 1:
            anon1, hwm = _status("RssAnon"), _status("VmHWM")
        if read:
            started = time.perf_counter()
            read_all(state_dict)
            reads.append(time.perf_counter() - started)
        if len(times) == 1:
            anon2 = _status("RssAnon")
        tensors, tensor_bytes = len(state_dict), sum(t.numel() * t.element_size() for t in state_dict.values())
        del state_dict
    load_s = statistics.median(times)
    read_s = statistics.median(reads) if reads else float("nan")
    if case.startswith("ours"):
        preflight_s = statistics.median(timings) if timings else None
    return {
        "case": case, "via": via, "load_s": load_s, "runs": len(times), "read_s": read_s, "tensors": tensors,
        "tensor_bytes": tensor_bytes, "peak_rss": hwm, "peak_rss_growth": hwm - rss0, "anon_growth": anon1 - anon0,
        "anon_growth_after_read": anon2 - anon0, "preflight_s": preflight_s,
    }


def _has_nxdi() -> bool:
    import importlib.util

    return importlib.util.find_spec("neuronx_distributed_inference") is not None


# --------------------------------------------------------------------------- building (parent side)


def bench_dims(layers: int, vocab: int) -> fmt.ModelDims:
    return dataclasses.replace(fmt.PROFILES[fmt.PROFILE_20B], num_hidden_layers=layers, vocab_size=vocab)


def _chunks(numel: int, step: int = 1 << 26) -> list[tuple[int, int]]:
    return [(start, min(numel, start + step)) for start in range(0, numel, step)]


def build_normalized(out: str, dims: fmt.ModelDims, seed: int = 0) -> str:
    """Real (not sparse) values: FP8 bytes within ±240, BF16 normals, positive scales."""
    from nxdi_gptoss_fp8.writer import CheckpointWriter

    layout = fmt.Layout.unpadded(dims)
    g = torch.Generator().manual_seed(seed)
    with CheckpointWriter(out, layout, fmt.PROFILE_CUSTOM, fmt.hf_config(dims), record_sha256=True) as writer:
        for name, planned in writer.planned.items():
            spec = planned.spec
            for start, end in _chunks(spec.numel):
                n = end - start
                if spec.dtype == fmt.F8_E4M3:
                    data = torch.randint(0, 256, (n,), generator=g, dtype=torch.uint8) & 0xF7  # exponent never all ones
                elif spec.dtype == fmt.F32:
                    data = torch.rand(n, generator=g) * 0.01 + 1e-4
                else:
                    data = (0.02 * torch.randn(n, generator=g)).to(torch.bfloat16)
                writer.put(name, data, offset=start * fmt.DTYPE_BITS[spec.dtype] // 8)
        return writer.commit()


def _has_digests(path: str) -> bool:
    with open(os.path.join(path, fmt.INDEX_FILE)) as handle:
        return "shard_sha256" in json.load(handle).get("metadata", {})


def _warm(path: str) -> None:
    """Read every file once so each case starts from the same, warm page cache."""
    for name in sorted(os.listdir(path)):
        with open(os.path.join(path, name), "rb") as handle:
            while handle.read(1 << 24):
                pass


def _run(case: str, path: str, layers: int, extra: dict[str, Any], *, warm: bool = True, read: bool = True) -> dict[str, Any]:
    if warm:
        _warm(path)
    command = [sys.executable, os.path.abspath(__file__), "--child", case, path, "--layers", str(layers),
               "--extra", json.dumps(extra), *([] if read else ["--no-read"])]
    out = subprocess.run(command, capture_output=True, text=True, check=False)
    if out.returncode != 0:
        raise RuntimeError(f"case {case} failed:\n{out.stderr[-3000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def _fmt_row(r: dict[str, Any]) -> str:
    return (f"{r['label']:<34} {r['load_s']:>9.3f} {r['peak_rss'] / GIB:>9.2f} {r['peak_rss_growth'] / GIB:>9.2f} "
            f"{r['anon_growth'] / GIB:>9.3f} {r['read_s']:>9.3f} {r['tensors']:>7}  {r['via']}")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workdir", default=os.path.join(os.environ.get("TMPDIR", "/tmp"), "nxdi-gptoss-fp8-bench-load"))
    parser.add_argument("--layers", type=int, default=2, help="decoder layers of the gpt-oss-20b-shaped model (≥ 2)")
    parser.add_argument("--vocab-size", type=int, default=201088, help="vocabulary rows (default: the real 201088)")
    parser.add_argument("--skip-sparse", action="store_true", help="skip the sparse full-size gpt-oss-120b case")
    parser.add_argument("--child", nargs=2, metavar=("CASE", "PATH"), help=argparse.SUPPRESS)
    parser.add_argument("--extra", default="{}", help=argparse.SUPPRESS)
    parser.add_argument("--no-read", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        print(json.dumps(run_child(args.child[0], args.child[1], args.layers, json.loads(args.extra), read=not args.no_read)))
        return 0

    have_nxdi = bool(os.environ.get("NXDI_SRC")) or _has_nxdi()
    dims = bench_dims(args.layers, args.vocab_size)
    tag = f"20b-L{args.layers}-V{args.vocab_size}"
    paths = {kind: os.path.join(args.workdir, f"{kind}-{tag}") for kind in ("normalized", "legacy", "hf")}
    os.makedirs(args.workdir, exist_ok=True)
    started = time.perf_counter()
    if os.path.isdir(paths["normalized"]) and not _has_digests(paths["normalized"]):
        shutil.rmtree(paths["normalized"])  # built by an older version without shard_sha256: (e) needs them
    if not os.path.isdir(paths["normalized"]):
        build_normalized(paths["normalized"], dims)
    if have_nxdi:
        from nxdi_gptoss_fp8.synthetic.sources import (
            PER_LAYER,
            REALISTIC_SCALE_RANGE,
            SOURCE_MXFP4,
            source_config,
            source_tensors,
            write_legacy_fp8,
            write_source,
        )

        if not os.path.isdir(paths["legacy"]):
            write_legacy_fp8(paths["legacy"], paths["normalized"], shards=PER_LAYER)
        if not os.path.isdir(paths["hf"]):  # full 20b shapes: past make_source's tiny-size cap, so its parts
            write_source(paths["hf"], source_tensors(dims, SOURCE_MXFP4, scale_range=REALISTIC_SCALE_RANGE),
                         source_config(dims, SOURCE_MXFP4), shards=PER_LAYER, original=False)
    print(f"model: gpt-oss-20b shapes (H=I={dims.hidden_size}, E={dims.num_local_experts}, V={dims.vocab_size}), "
          f"{args.layers} layers; checkpoints in {args.workdir} (built/reused in {time.perf_counter() - started:.0f} s)")

    rows = []
    for case, path, label in (("nxdi-hf", paths["hf"], "(a) NxDI HF path (MXFP4→BF16)"),
                              ("nxdi-legacy", paths["legacy"], "(b) NxDI legacy path, FP8 ckpt"),
                              ("load_file", paths["normalized"], "(c) load_file of normalized shards"),
                              ("ours", paths["normalized"], "(d) ours: preflight + zero-copy"),
                              ("ours-verify", paths["normalized"], "(e) (d) + verify sha256 at load"),
                              ("ours-private", paths["normalized"], "(f) (d) in private memory")):
        if case in NEEDS_NXDI and not have_nxdi:
            print(f"{label}: skipped (set NXDI_SRC to an NxDI source checkout, or install NxDI)")
            continue
        rows.append({**_run(case, path, args.layers, {}), "label": label})
    print(f"\n{'case':<34} {'load s':>9} {'peak GiB':>9} {'peak+GiB':>9} {'anon+GiB':>9} {'read s':>9} {'tensors':>7}  via")
    for row in rows:
        print(_fmt_row(row))
    by = {r["case"]: r for r in rows}
    ours = by["ours"]
    print(f"\n(d) preflight: {ours['preflight_s']:.3f} s of the {ours['load_s']:.3f} s; anonymous growth after reading "
          f"every tensor: {ours['anon_growth_after_read'] / GIB:.3f} GiB")
    checks = []
    if "nxdi-hf" in by:
        checks.append(("(d) ≥ 100× faster than (a)", by["nxdi-hf"]["load_s"] / ours["load_s"], 100, "×"))
    if "nxdi-legacy" in by:
        checks.append(("(d) ≥ 10× faster than (b)", by["nxdi-legacy"]["load_s"] / ours["load_s"], 10, "×"))
        ratio = ours["anon_growth"] / max(by["nxdi-legacy"]["anon_growth"], 1)
        checks.append(("(d) anon growth ≤ 1/10 of (b)", ratio, None, " of (b)"))
    budget = (ours["preflight_s"] or 0.0) + 1.2 * by["load_file"]["load_s"]
    checks.append(("(d) ≤ preflight + 1.2 × (c)", ours["load_s"] / budget, None, " of budget"))
    checks.append(("reading (d) vs reading (c)", ours["read_s"] / by["load_file"]["read_s"], None, "× (c)'s time"))
    for case, label in (("ours-verify", "(e) verify at load"), ("ours-private", "(f) private memory")):
        row = by[case]
        print(f"  {label:<34} +{row['load_s'] - ours['load_s']:.3f} s over (d), anonymous growth "
              f"{row['anon_growth'] / GIB:.3f} GiB, peak RSS growth {row['peak_rss_growth'] / GIB:.3f} GiB")
    for label, value, floor, unit in checks:
        if floor is not None:
            verdict = "met" if value >= floor else "MISSED"
        elif "≤" in label:
            verdict = "met" if value <= (0.1 if "1/10" in label else 1.0) else "MISSED"
        else:
            verdict = "met" if value <= 1.1 else "MISSED"
        print(f"  {label:<34} {value:10.3f}{unit}  {verdict}")

    if not args.skip_sparse:
        from sparse_checkpoint import build_sparse_checkpoint

        sparse = os.path.join(args.workdir, "sparse-gpt-oss-120b")
        if not os.path.isdir(sparse):
            build_sparse_checkpoint(sparse, fmt.PROFILE_120B)
        layers = fmt.PROFILES[fmt.PROFILE_120B].num_hidden_layers
        print("\nsparse full-size gpt-oss-120b (real headers and scales, data holes), (d) as above:")
        print(f"{'config':<34} {'load s':>9} {'peak GiB':>9} {'peak+GiB':>9} {'anon+GiB':>9} {'(no read)':>9} {'tensors':>7}  via")
        for label, extra in (("tp 64, lnc 2", {"tp_degree": 64, "logical_nc_config": 2}),
                             ("tp 64, lnc 2, fused_qkv", {"tp_degree": 64, "logical_nc_config": 2, "fused_qkv": True})):
            _run("ours", sparse, layers, extra, warm=False, read=False)  # warms the headers and scales
            row = {**_run("ours", sparse, layers, extra, warm=False, read=False), "label": label}
            print(_fmt_row(row))
            ok = row["load_s"] < 2 and row["peak_rss_growth"] < 512 * (1 << 20)
            note = "" if ok or "fused" not in label else " (q/k/v not back to back in the shards: Wqkv was concatenated)"
            print(f"  < 2 s and peak RSS growth < 512 MB: {'met' if ok else 'MISSED'}{note}; preflight {row['preflight_s']:.3f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
