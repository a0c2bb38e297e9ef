"""Converter and verifier speed and memory on gpt-oss-120b-shaped layers, side by side with NxDI's dequant.

Builds two synthetic sources with the real gpt-oss-120b layer shapes (H = I = 2880, 128 experts,
64 query / 8 KV heads of 64; the vocabulary shrunk, default 8192 rows instead of 201088, to keep
the embedding small; expert tensors full size):

  hf-mxfp4                 the published HF layout: random FP4 codes, realistic block scales
                           (each channel's exponents spread around 2^-7, 1.5 octaves); every
                           layer one shard, like the published repos
  compressed-tensors-fp8   llm-compressor's FP8_DYNAMIC layout: per-expert gate/up/down linear
                           layers, OCP E4M3 weights quantized from Gaussian values with
                           amax/448 BF16 channel scales; every layer one shard, the scales in
                           another

Then, for each layer count (default 1 and 2), each in a fresh process with a warm page cache:

  convert   convert(): source → normalized FP8, written, hashed and renamed into place
            (everything the CLI does)
  verify    verify_conversion(): both checkpoints re-read, every value compared
  baseline  NxDI's MXFP4 → BF16 dequant for the same MXFP4 layers. With NXDI_SRC set (or NxDI
            installed) it runs NxDI's own code — ``convert_moe_packed_tensors`` and
            ``convert_gate_up_proj`` from its GPT-OSS module, whole tensors loaded the way its HF
            conversion loads them — with ``rows_per_chunk`` 2^20 (its default 32768*1024 needs
            ~15 GB for one 120b gate_up tensor). Without, a re-implementation of the same steps
            runs and is labelled so. Each layer's result is dropped after it is made (NxDI keeps
            all of them), so its peak RSS is a lower bound for NxDI's.

and prints wall time, throughput (MB/s of FP8 written; for the baseline, of the same number of
values) and peak RSS. Targets: compressed-tensors ≥ the MXFP4 path's throughput; peak RSS < 1 GB
and flat; verify at least as fast as convert.

With ``--workers 1 2`` it measures instead how conversion scales with ``convert(workers=N)`` on
the hf-mxfp4 source of the largest ``--layers`` count (2–4 layers: one or more per worker), each
case ``--repeat`` times in a fresh process:

  cpu-bound   output on tmpfs (``--tmpfs``, default /dev/shm): convert and verify-conversion
              with each N, and the largest N spread the other way (N < 4: N processes of one
              lane instead of N threads in this process; N ≥ 4: N threads in one process
              instead of processes); goal: 2 workers ≥ 1.7× one
  disk-bound  output on the work directory's disk, the largest N, against
              ``dd if=/dev/zero of=OUT/f bs=16M count=… conv=fsync`` writing as many bytes to
              the same directory; goal ≥ 90 % of dd's rate

with the load average before and after (the machine may be shared), and peak RSS of the main
process and of the busiest worker process.

With ``--baseline`` it measures instead each source kind (hf-bf16, hf-mxfp4, compressed-tensors)
against an independent baseline: by default ``scripts/numpy_convert.py``, a plain numpy converter
written from the format document alone, one thread, reading through memory maps, writing one
safetensors file, no hashing, no fsync (``--baseline SCRIPT`` names another converter with the
same command line; ``--baseline-dir DIR`` is ``--baseline DIR/ref_convert.py``, the shared
``bench/`` folder kept beside the repository, ``../shared/bench``). On ``--layers`` (default 2) layers of
gpt-oss-120b shapes (H = I = 2880) with ``--experts`` experts (default 16), the baseline's output
is first compared byte for byte with ours (every tensor it writes), then ``--repeat`` times
(default 3), interleaved, each in a fresh process: our ``convert()`` with the shards hashed at
commit (as always), the same without that hashing, the baseline, ``verify_conversion()``, and
the encoding alone (layer 0 in memory, one thread) by each, and ours written to the work
directory's disk beside ``dd conv=fsync`` of as many bytes; it prints the medians in GB of FP8
per CPU-second (user + system from the OS, every thread and worker process of the call; the
baseline's own ``cpu_s``), the ratios, our peak RSS, ours to disk against dd, every run's rate
with the load average when it ran, and verify-conversion / convert in CPU and wall time.

    NXDI_SRC=/path/to/neuronx-distributed-inference python scripts/bench_convert.py [--layers 1 2]
    python scripts/bench_convert.py --layers 2 --workers 1 2 [--repeat 3]
    python scripts/bench_convert.py --baseline [--layers 2] [--experts 16] [--repeat 3]
    python scripts/bench_convert.py --baseline-dir ../shared/bench
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
from collections.abc import Callable
from typing import Any

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
sys.path.insert(0, os.path.join(ROOT, "scripts"))
sys.path.insert(0, os.path.join(ROOT, "test", "support"))  # nxdi_standin

import torch  # noqa: E402

from nxdi_gptoss_fp8 import format as fmt  # noqa: E402
from nxdi_gptoss_fp8.convert import SOURCE_BF16, SOURCE_COMPRESSED_TENSORS, SOURCE_MXFP4, source_specs  # noqa: E402
from nxdi_gptoss_fp8.synthetic.sources import compressed_tensors_config, quantize_fp8_channel  # noqa: E402
from nxdi_gptoss_fp8.writer import build_header  # noqa: E402

BENCH_VOCAB = 8192
NXDI_ROWS_PER_CHUNK = 1 << 20
FP4_VALUES = (0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0, -0.0, -0.5, -1.0, -1.5, -2.0, -3.0, -4.0, -6.0)
DISTINCT_EXPERTS = 4  # compressed-tensors experts cycle through this many random ones (generation is slow)
KINDS = (SOURCE_MXFP4, SOURCE_COMPRESSED_TENSORS)
CT_OPTIONS = {"gate_up_split": "interleaved", "expert_names": "mlp.experts.E"}


def bench_dims(layers: int, vocab: int, experts: int | None = None) -> fmt.ModelDims:
    base = fmt.PROFILES[fmt.PROFILE_120B]
    fields = {**base.as_dict(), "num_hidden_layers": layers, "vocab_size": vocab}
    if experts is not None:
        fields.update(num_local_experts=experts, num_experts_per_tok=min(experts, base.num_experts_per_tok))
    return fmt.ModelDims(**fields)


# --------------------------------------------------------------------------- sources


class _Filler:
    """Random data for one source tensor at a time, streamed to ``write`` in pieces."""

    def __init__(self, dims: fmt.ModelDims) -> None:
        self.dims = dims
        self.generator = torch.Generator().manual_seed(0)
        self._experts: dict[tuple[int, int], list[tuple[torch.Tensor, torch.Tensor]]] = {}

    def _fp8_expert(self, shape: tuple[int, int], number: int) -> tuple[torch.Tensor, torch.Tensor]:
        pool = self._experts.setdefault(shape, [])
        if len(pool) < DISTINCT_EXPERTS:
            weight = (0.02 * torch.randn(shape, generator=self.generator)).to(torch.bfloat16)
            pool.append(quantize_fp8_channel(weight))
        return pool[number % DISTINCT_EXPERTS]

    def fill(self, spec: fmt.TensorSpec, write: Callable[[torch.Tensor], None]) -> None:
        name = spec.name
        if name.endswith("_blocks"):
            for _ in range(spec.shape[0]):
                write(torch.randint(0, 256, spec.shape[1:], dtype=torch.uint8, generator=self.generator))
        elif name.endswith("_scales"):
            rows, blocks = spec.shape[1:]
            for _ in range(spec.shape[0]):
                centre = 120.0 + torch.randn((rows, 1), generator=self.generator)
                spread = 1.5 * torch.randn((rows, blocks), generator=self.generator)
                write((centre + spread).round().clamp(100, 140).to(torch.uint8))
        elif name.endswith(("experts.gate_up_proj", "experts.down_proj")):  # hf-bf16 experts, one at a time
            pool = self._experts.setdefault(spec.shape[1:], [])
            for expert in range(spec.shape[0]):
                if len(pool) < DISTINCT_EXPERTS:
                    pool.append(((0.02 * torch.randn(spec.shape[1:], generator=self.generator)).to(torch.bfloat16), None))
                write(pool[expert % DISTINCT_EXPERTS][0])
        elif name.endswith((".weight", ".weight_scale")) and ".experts." in name and "_proj." in name:
            expert = int(name.split(".experts.")[1].split(".")[0])
            cols = self.dims.intermediate_size if ".down_proj." in name else self.dims.hidden_size
            q, scale = self._fp8_expert((spec.shape[0], cols), expert)
            write(q if name.endswith(".weight") else scale)
        else:
            values = 0.02 * torch.randn(spec.shape, generator=self.generator)
            if name.endswith("norm.weight"):
                values += 1.0
            write(values.to(torch.bfloat16))


def write_shard(path: str, specs: list[fmt.TensorSpec], filler: _Filler) -> None:
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

            filler.fill(spec, write)
    finally:
        os.close(fd)


def _dtype(dtypes: tuple[str, ...]) -> str:
    return dtypes[0] if dtypes[0] in ("U8", fmt.F8_E4M3) else "BF16"


def make_sources(workdir: str, kind: str, layer_counts: list[int], vocab: int,
                 experts: int | None = None) -> dict[int, str]:
    """One set of layer shards per kind, shared (hard links) by the sources of each layer count."""
    most = max(layer_counts)
    dims = bench_dims(most, vocab, experts)
    pool = os.path.join(workdir, f"pool-{kind}-{dims.num_local_experts}")
    os.makedirs(pool, exist_ok=True)
    specs = {name: fmt.TensorSpec(name, s.shape, _dtype(s.dtypes))
             for name, s in source_specs(dims, kind, CT_OPTIONS).items()}
    filler = _Filler(dims)
    groups = {"globals": [s for n, s in specs.items() if ".layers." not in n]}
    for layer in range(most):
        in_layer = [s for n, s in specs.items() if f".layers.{layer}." in n]
        groups[f"layer{layer}"] = [s for s in in_layer if not s.name.endswith("weight_scale")]
        if kind == SOURCE_COMPRESSED_TENSORS:  # scales in a shard of their own, as transformers may place them
            groups[f"scales{layer}"] = [s for s in in_layer if s.name.endswith("weight_scale")]
    for group, members in groups.items():
        path = os.path.join(pool, f"{group}.safetensors")
        if not os.path.exists(path):
            started = time.perf_counter()
            write_shard(path + ".tmp", members, filler)
            os.rename(path + ".tmp", path)
            print(f"  wrote {kind} source shard {group} ({os.path.getsize(path) / 1e9:.2f} GB) in "
                  f"{time.perf_counter() - started:.1f} s", file=sys.stderr)
    sources = {}
    for count in layer_counts:
        root = os.path.join(workdir, f"src-{kind}-{dims.num_local_experts}-{count}")
        shutil.rmtree(root, ignore_errors=True)
        os.makedirs(root)
        if kind == SOURCE_MXFP4:
            config = fmt.hf_config(bench_dims(count, vocab, experts))
            config["quantization_config"] = {"quant_method": "mxfp4"}
        elif kind == SOURCE_BF16:
            config = fmt.hf_config(bench_dims(count, vocab, experts))
            del config["quantization_config"]
        else:
            config = compressed_tensors_config(bench_dims(count, vocab, experts))
        with open(os.path.join(root, fmt.CONFIG_FILE), "w") as handle:
            json.dump(config, handle)
        weight_map = {}
        for group in groups:
            number = group.removeprefix("layer").removeprefix("scales")
            if group != "globals" and int(number) >= count:
                continue
            file_name = f"{group}.safetensors"
            os.link(os.path.join(pool, file_name), os.path.join(root, file_name))
            weight_map.update(dict.fromkeys((s.name for s in groups[group]), file_name))
        with open(os.path.join(root, fmt.INDEX_FILE), "w") as handle:
            json.dump({"metadata": {}, "weight_map": weight_map}, handle)
        sources[count] = root
    return sources


# --------------------------------------------------------------------------- children


def _peak_rss_mb() -> float:
    """This process's peak RSS since it started (VmHWM: ``ru_maxrss`` would carry over the peak
    of the process that forked it, here the one that generated the sources)."""
    return _vm_hwm_mb()


def _children_peak_rss_mb() -> float:
    """The largest peak RSS of any worker process this one waited for (0 without workers)."""
    return resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024


def _cpu_seconds() -> float:
    """User + system CPU time of this process and its workers."""
    own, children = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + children.ru_utime + children.ru_stime


def _vm_hwm_mb() -> float:
    with open("/proc/self/status") as handle:
        for line in handle:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024
    return float("nan")


def child_convert(src: str, out: str, workers: str = "", forced: str = "", hashing: str = "1") -> dict:
    from nxdi_gptoss_fp8.convert import convert, pipeline
    from nxdi_gptoss_fp8.convert.workers import WorkerPlan, process_bytes
    from nxdi_gptoss_fp8.validate.pipeline import preflight
    from nxdi_gptoss_fp8.writer import CheckpointWriter

    if forced:  # "PROCESSES,LANES": the alternative to the default plan for as many workers
        processes, lanes = (int(part) for part in forced.split(","))

        def forced_plan(requested: object, layout: fmt.Layout, kind: str, **_: object) -> WorkerPlan:
            return WorkerPlan(processes * lanes, processes, lanes, process_bytes(layout, kind, lanes))

        pipeline.plan_workers = forced_plan  # type: ignore[assignment]

    streaming_peak: list[float] = []
    streamed: list[float] = []
    commit = CheckpointWriter.commit

    def measured_commit(self, *args, **kwargs):  # type: ignore[no-untyped-def]
        streaming_peak.append(_vm_hwm_mb())  # the peak before the writer hashes the shards
        streamed.append(time.perf_counter() - started)
        return commit(self, *args, **kwargs)

    CheckpointWriter.commit = measured_commit  # type: ignore[method-assign]
    if hashing == "0":  # the shards not hashed at commit (no shard_sha256 recorded): the cost of the hashing
        init = CheckpointWriter.__init__

        def unhashed_init(self, *args, **kwargs):  # type: ignore[no-untyped-def]
            init(self, *args, **{**kwargs, "record_sha256": False})

        CheckpointWriter.__init__ = unhashed_init  # type: ignore[method-assign]
    started, cpu = time.perf_counter(), _cpu_seconds()
    report = convert(src, out, progress=False, overwrite=True, workers=int(workers) if workers else None)
    elapsed, call_cpu = time.perf_counter() - started, _cpu_seconds() - cpu
    valid = preflight(out, allow_custom_model=True).ok
    return {"seconds": elapsed, "fp8_bytes": report.fp8_bytes, "values": report.fp8_values,
            "bytes": report.bytes_written, "inexact": report.inexact_values, "max_rel_error": report.max_rel_error,
            "peak_rss_mb": _peak_rss_mb(), "streaming_peak_rss_mb": streaming_peak[0], "valid": valid,
            "worker_peak_rss_mb": _children_peak_rss_mb(), "cpu_seconds": _cpu_seconds(), "plan": report.workers,
            "call_cpu_seconds": call_cpu, "stream_seconds": streamed[0]}


def child_verify(src: str, out: str, workers: str = "") -> dict:
    from nxdi_gptoss_fp8.convert.verify import verify_conversion

    started, cpu = time.perf_counter(), _cpu_seconds()
    report = verify_conversion(out, src, workers=int(workers) if workers else None)
    return {"seconds": time.perf_counter() - started, "ok": report.ok, "peak_rss_mb": _peak_rss_mb(),
            "inexact": sum(row.inexact for row in report.rows), "worker_peak_rss_mb": _children_peak_rss_mb(),
            "cpu_seconds": _cpu_seconds(), "call_cpu_seconds": _cpu_seconds() - cpu}


def _reimplemented_dequant(blocks: torch.Tensor, scales: torch.Tensor, *, rows_per_chunk: int) -> torch.Tensor:
    """MXFP4 → BF16 NxDI's way (int64 nibble indices into a value table, then ldexp)."""
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


def _reimplemented_gate_up(tensor: torch.Tensor) -> torch.Tensor:
    gate, up = tensor[:, ::2, ...], tensor[:, 1::2, ...]
    return torch.cat((gate, up), dim=1).transpose(1, 2)


def _baseline_functions() -> tuple[Callable[..., torch.Tensor], Callable[[torch.Tensor], torch.Tensor], str]:
    """NxDI's own dequant and gate/up conversion when NxDI can be imported, else the
    re-implementation; and a truthful label."""
    import importlib.util

    if os.environ.get("NXDI_SRC") or importlib.util.find_spec("neuronx_distributed_inference") is not None:
        from bench_load import _nxdi_modeling

        modeling = _nxdi_modeling()
        return (modeling.convert_moe_packed_tensors, modeling.convert_gate_up_proj,
                "NxDI's own convert_moe_packed_tensors + convert_gate_up_proj")
    return (_reimplemented_dequant, _reimplemented_gate_up,
            "a re-implementation of NxDI's dequant (NXDI_SRC not set)")


def child_baseline(src: str, rows_per_chunk: int) -> dict:
    from safetensors import safe_open

    dequant, gate_up, label = _baseline_functions()
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
                dense = dequant(blocks, scales, rows_per_chunk=rows_per_chunk)
                del blocks, scales
                result = gate_up(dense) if proj == "gate_up_proj" else dense.transpose(1, 2)
                values += result.numel()
                del dense, result
    return {"seconds": time.perf_counter() - started, "values": values, "peak_rss_mb": _peak_rss_mb(),
            "label": label}


# --------------------------------------------------------------------------- the independent baseline (--baseline-dir)

BASELINE_KINDS = (SOURCE_BF16, SOURCE_MXFP4, SOURCE_COMPRESSED_TENSORS)
BASELINE_EXPERTS = 16
BASELINE_FILES = ("ref_convert.py", "ref_encode.py", "common.py")
NUMPY_BASELINE = os.path.join(ROOT, "scripts", "numpy_convert.py")
PROJECTIONS = ((fmt.GATE_UP, "gate_up"), (fmt.DOWN, "down"))


def checked_baseline_dir(path: str) -> str:
    """``--baseline-dir``: the shared folder's converter script, or a one-line exit saying what is missing."""
    folder = os.path.abspath(path)
    absent = [name for name in BASELINE_FILES if not os.path.isfile(os.path.join(folder, name))]
    if absent:
        raise SystemExit(f"--baseline-dir {path}: {', '.join(absent)} not there: pass the shared bench/ folder kept "
                         "beside the repository (../shared/bench), or use --baseline alone for the repository's own "
                         "scripts/numpy_convert.py")
    return os.path.join(folder, "ref_convert.py")


def _own_cpu_seconds() -> float:
    times = os.times()
    return times.user + times.system


def _expert_arrays(kind: str, files: Any, layer: int, short: str, expert: int) -> dict[str, Any]:
    """One expert's source arrays (``files(name)``: the array, numpy, BF16 as uint16 bits)."""
    fused = f"model.layers.{layer}.mlp.experts."
    if kind == SOURCE_BF16:
        return {"weight": files(f"{fused}{short}_proj")[expert]}
    if kind == SOURCE_MXFP4:
        return {"blocks": files(f"{fused}{short}_proj_blocks")[expert], "scales": files(f"{fused}{short}_proj_scales")[expert]}
    prefix = f"{fused}{expert}."
    parts = ("gate", "up") if short == "gate_up" else ("down",)
    arrays = {}
    for part in parts:
        arrays[part] = files(f"{prefix}{part}_proj.weight")
        arrays[f"{part}_scale"] = files(f"{prefix}{part}_proj.weight_scale")
    return arrays


def _baseline_modules(baseline: str) -> Any:
    """The baseline converter's module, imported from its script: ``.Source(src).array(name)`` and
    ``.enc`` with the per-expert encoders (``mxfp4_expert``, ``bf16_expert``, ``ct_into``)."""
    import importlib
    import types

    sys.path.insert(0, os.path.dirname(baseline))
    module = importlib.import_module(os.path.splitext(os.path.basename(baseline))[0])
    if hasattr(module, "enc"):  # the shared bench/ converter
        return module
    return types.SimpleNamespace(Source=module.Safetensors, enc=module)


def _expert_shapes(src: str) -> tuple[dict[str, tuple[int, int, int]], int]:
    """({projection: [E, rows, cols]} of the output's FP8 experts, I) of an unpadded conversion of ``src``."""
    with open(os.path.join(src, fmt.CONFIG_FILE)) as handle:
        config = json.load(handle)
    experts, hidden, inter = config["num_local_experts"], config["hidden_size"], config["intermediate_size"]
    return {fmt.GATE_UP: (experts, hidden, 2 * inter), fmt.DOWN: (experts, inter, hidden)}, inter


def child_encode(kind: str, src: str, side: str, baseline: str) -> dict:
    """Encode only: layer 0's experts, loaded into memory first, encoded one at a time in one
    thread, by our kind's encoder (``side`` "ours") or the baseline's; CPU seconds of the encoding."""
    import numpy as np

    torch.set_num_threads(1)
    reference = _baseline_modules(baseline)
    source = reference.Source(src).array  # loading only, not timed
    shapes, inter = _expert_shapes(src)
    loaded = [(proj, short, {key: np.array(value) for key, value in _expert_arrays(kind, source, 0, short, expert).items()})
              for proj, short in PROJECTIONS for expert in range(shapes[proj][0])]
    if side == "baseline":
        run = _baseline_encoder(reference.enc, kind, shapes, inter)
    else:
        run = _our_encoder(kind, shapes, inter)
        loaded = [(proj, short, {key: _as_torch(value) for key, value in arrays.items()}) for proj, short, arrays in loaded]
    cpu = _own_cpu_seconds()
    for proj, short, arrays in loaded:
        run(proj, short, arrays)
    cpu = _own_cpu_seconds() - cpu
    return {"cpu_seconds": cpu, "fp8_bytes": sum(shapes[proj][1] * shapes[proj][2] for proj, _, _ in loaded)}


def _baseline_encoder(enc: Any, kind: str, shapes: dict[str, tuple[int, int, int]], inter: int) -> Callable[..., None]:
    """The baseline's per-expert encoder, called as its converter calls it."""
    import numpy as np

    buffers = {proj: np.zeros(shapes[proj][1:], dtype=np.uint8) for proj, _ in PROJECTIONS}

    def run(proj: str, short: str, arrays: dict[str, Any]) -> None:
        out, gate_up = buffers[proj], proj == fmt.GATE_UP
        if kind == SOURCE_BF16:
            enc.bf16_expert(arrays["weight"], gate_up, out)
        elif kind == SOURCE_MXFP4:
            enc.mxfp4_expert(arrays["blocks"], arrays["scales"], gate_up, out)
        elif not gate_up:
            enc.ct_into(arrays["down"], arrays["down_scale"], out)
        else:
            np.concatenate((enc.ct_into(arrays["gate"], arrays["gate_scale"], out[:, :inter]),
                            enc.ct_into(arrays["up"], arrays["up_scale"], out[:, inter:])))

    return run


def _as_torch(array: Any) -> torch.Tensor:
    import numpy as np

    if array.dtype == np.uint16:  # BF16 bits
        return torch.from_numpy(array.view(np.int16)).view(torch.bfloat16)
    return torch.from_numpy(array)


def _our_encoder(kind: str, shapes: dict[str, tuple[int, int, int]], padded_i: int) -> Callable[..., None]:
    """Our kind's per-expert encoder, called the way the compute lanes call it."""
    from nxdi_gptoss_fp8.convert import mxfp4
    from nxdi_gptoss_fp8.convert.fp8 import DenseEncoder
    from nxdi_gptoss_fp8.convert.kinds import compressed_tensors, hf_bf16, hf_mxfp4
    from nxdi_gptoss_fp8.convert.output import Lane

    lanes: dict[str, Lane] = {}
    for proj, _ in PROJECTIONS:
        buffer = torch.zeros(shapes[proj][1:], dtype=torch.uint8)
        if kind == SOURCE_BF16:
            lanes[proj] = Lane(buffer, DenseEncoder())
        elif kind == SOURCE_MXFP4:
            lanes[proj] = Lane(buffer, None)
        else:
            lanes[proj] = Lane(buffer)

    def run(proj: str, short: str, arrays: dict[str, torch.Tensor]) -> None:
        lane = lanes[proj]
        if kind == SOURCE_BF16:
            hf_bf16._encode_expert(lane, arrays["weight"], proj, padded_i, "source", "expert")
        elif kind == SOURCE_MXFP4:
            if lane.tools is None:
                lane.tools = mxfp4.ExpertEncoder(hf_mxfp4.ENCODE_ROWS, arrays["blocks"].shape[1])
            hf_mxfp4._encode_expert(lane, arrays["blocks"], arrays["scales"], proj, padded_i, "expert")
        elif proj == fmt.DOWN:
            compressed_tensors._encode_down(lane, arrays["down"], arrays["down_scale"].view(torch.bfloat16), "expert")
        else:
            compressed_tensors._encode_gate_up(lane, arrays["gate"], arrays["gate_scale"].view(torch.bfloat16), arrays["up"],
                                               arrays["up_scale"].view(torch.bfloat16), "interleaved", padded_i, "expert")

    return run


def _median(runs: list[dict], key: str) -> float:
    values = sorted(run[key] for run in runs)
    return values[len(values) // 2]


def _rate(runs: list[dict]) -> float:
    """The median FP8 GB per CPU-second of ``runs`` (of the convert() call alone when measured: the
    interpreter's start and torch's import are not the conversion's)."""
    return sorted(run["fp8_bytes"] / run.get("call_cpu_seconds", run["cpu_seconds"]) / 1e9
                  for run in runs)[len(runs) // 2]


def _tensor_bytes(paths: list[str]) -> dict[str, bytes]:
    """Every tensor's bytes in the safetensors files ``paths`` (headers read by the package's reader)."""
    from nxdi_gptoss_fp8.safeio.safetensors_header import read_header

    tensors = {}
    for path in paths:
        header = read_header(path)
        with open(path, "rb") as handle:
            data = handle.read()
        for name, info in header.tensors.items():
            tensors[name] = data[header.data_offset + info.begin:header.data_offset + info.end]
    return tensors


def _identical(ours: str, reference: str, dims: fmt.ModelDims) -> int:
    """The number of tensors of the baseline's one-file output, each byte-identical to ours (else exit);
    it keeps the non-expert tensors under their HF names, which ``non_expert_names`` maps to ours."""
    from nxdi_gptoss_fp8.convert.source import non_expert_names

    renamed = non_expert_names(dims)
    shards = sorted(os.path.join(ours, name) for name in os.listdir(ours) if name.endswith(".safetensors"))
    mine, theirs = _tensor_bytes(shards), _tensor_bytes([reference])
    differ = sorted(name for name, data in theirs.items() if mine.get(renamed.get(name, name)) != data)
    if differ:
        raise SystemExit(f"the baseline's output differs from ours in {len(differ)} tensors (first: {differ[0]})")
    return len(theirs)


def _run_baseline(baseline: str, kind: str, src: str, target: str) -> dict[str, Any]:
    """One conversion by the baseline, in a fresh process; its JSON (cpu_s, wall_s, fp8_bytes, bytes)."""
    done = subprocess.run([sys.executable, baseline, src, target, "--kind", kind],
                          capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise SystemExit(f"the baseline failed on {kind}:\n{done.stderr}")
    result = json.loads(done.stdout.strip().splitlines()[-1])
    return {"seconds": result["wall_s"], "cpu_seconds": result["cpu_s"], "fp8_bytes": result["fp8_bytes"]}


def bench_baseline(workdir: str, layers: int, vocab: int, experts: int, repeat: int, baseline: str,
                   verify: bool = True) -> None:
    """Ours, with and without commit-time hashing, against the independent baseline, per source kind, in one run."""
    print(f"versus the independent baseline in {baseline}: {layers} layer(s) of gpt-oss-120b shapes (H = I = 2880) "
          f"with {experts} experts, {repeat} interleaved runs of each case, medians; {_load()}")
    sources = {kind: make_sources(workdir, kind, [layers], vocab, experts)[layers] for kind in BASELINE_KINDS}
    target = os.path.join(workdir, "baseline.safetensors")
    for kind in BASELINE_KINDS:
        src, out = sources[kind], os.path.join(workdir, f"out-{kind}")
        _run_child(["convert", src, out])
        _run_baseline(baseline, kind, src, target)
        print(f"  {kind}: the baseline's output is byte-identical to ours ({_identical(out, target, bench_dims(layers, vocab, experts))} tensors)")
        os.remove(target)
    rows: dict[str, dict[str, list[dict]]] = {}
    for _ in range(repeat):
        for kind in BASELINE_KINDS:
            src, out = sources[kind], os.path.join(workdir, f"out-{kind}")
            runs = rows.setdefault(kind, {})
            _warm(src)
            shutil.rmtree(out, ignore_errors=True)  # removed outside the timing, as the baseline's file is
            runs.setdefault("ours", []).append(_loaded(_run_child(["convert", src, out])))
            written = sum(entry.stat().st_size for entry in os.scandir(out) if entry.is_file())
            runs.setdefault("dd", []).append(_loaded({"seconds": _dd(workdir, written), "bytes": written}))
            _warm(src)
            shutil.rmtree(out, ignore_errors=True)
            runs.setdefault("ours, no hashing", []).append(_loaded(_run_child(["convert", src, out, "", "", "0"])))
            _warm(src)
            runs.setdefault("baseline", []).append(_loaded(_run_baseline(baseline, kind, src, target)))
            os.remove(target)
            if verify:
                _warm(src)
                _warm(out)
                runs.setdefault("verify", []).append(_run_child(["verify", src, out]))
            runs.setdefault("encode ours", []).append(_run_child(["encode", kind, src, "ours", baseline]))
            runs.setdefault("encode baseline", []).append(_run_child(["encode", kind, src, "baseline", baseline]))
    print("\nGB of FP8 per CPU-second (user + system of every thread and worker process, from the OS: other jobs' "
          "load mostly cancels); ours = the whole convert() call (read, encode, the non-expert tensors, write, fsync, "
          "hash the shards at commit, rename; 2 lanes); no hashing = the same without the commit's SHA-256; baseline "
          "= ref_convert.py (read through memory maps, encode, write one file; one thread; no hashing, no fsync); "
          "encode only = layer 0's experts in memory, one thread")
    print(f"{'source':<22} | {'ours':>6} {'no hash':>7} {'base':>6} | {'ratio':>6} {'no hash':>7} | "
          f"{'encode':>6} {'base':>6} {'ratio':>6} | {'verify/convert CPU':>18} {'wall':>6} | {'peak RSS':>8} | "
          f"{'vs dd':>5} | CPU s ours / no hash / base")
    for kind, runs in rows.items():
        ours, unhashed, base = _rate(runs["ours"]), _rate(runs["ours, no hashing"]), _rate(runs["baseline"])
        enc, enc_base = _rate(runs["encode ours"]), _rate(runs["encode baseline"])
        verify_cpu = verify_wall = float("nan")
        if "verify" in runs:
            verify_cpu = _median(runs["verify"], "call_cpu_seconds") / _median(runs["ours"], "call_cpu_seconds")
            verify_wall = _median(runs["verify"], "seconds") / _median(runs["ours"], "seconds")
        cpu = " / ".join(f"{_median(runs[case], 'call_cpu_seconds' if case != 'baseline' else 'cpu_seconds'):.2f}"
                         for case in ("ours", "ours, no hashing", "baseline"))
        to_disk = _median(runs["dd"], "seconds") / _median(runs["ours"], "seconds")
        print(f"{kind:<22} | {ours:>6.3f} {unhashed:>7.3f} {base:>6.3f} | {ours / base:>5.2f}x {unhashed / base:>6.2f}x | "
              f"{enc:>6.3f} {enc_base:>6.3f} {enc / enc_base:>5.2f}x | {verify_cpu:>17.2f}x {verify_wall:>5.2f}x | "
              f"{_median(runs['ours'], 'peak_rss_mb'):>6.0f}MB | {to_disk:>4.2f}x | {cpu}")
    print("vs dd: dd conv=fsync's wall time for as many bytes as ours wrote, in the same directory, over our "
          "convert()'s (read, encode, write, fsync, hash, rename): ours to disk as a fraction of dd's rate")
    print("runs (GB/s per CPU-second, in order; [1-minute load average after each run]; dd: wall seconds):")
    for kind, runs in rows.items():
        for case, measured in runs.items():
            if case == "verify":
                continue
            if case == "dd":
                rates = ", ".join(f"{run['seconds']:.2f} s [{run['load']:.1f}]" for run in measured)
                rates += " (ours: " + ", ".join(f"{run['seconds']:.2f} s" for run in runs["ours"]) + ")"
            else:
                rates = ", ".join(f"{run['fp8_bytes'] / run.get('call_cpu_seconds', run['cpu_seconds']) / 1e9:.3f}"
                                  + (f" [{run['load']:.1f}]" if "load" in run else "") for run in measured)
            print(f"  {kind:<22} {case:<18} {rates}")
    print(_load())


def _loaded(run: dict[str, Any]) -> dict[str, Any]:
    """``run`` with the 1-minute load average just after it (the machine may be shared)."""
    run["load"] = os.getloadavg()[0]
    return run


def _machine_busy_seconds() -> float:
    """CPU seconds every process of the machine has used (/proc/stat: all but idle and iowait)."""
    with open("/proc/stat") as handle:
        fields = [int(value) for value in handle.readline().split()[1:9]]
    return (sum(fields) - fields[3] - fields[4]) / os.sysconf("SC_CLK_TCK")


def _run_child(args: list[str]) -> dict[str, Any]:
    busy, started = _machine_busy_seconds(), time.perf_counter()
    done = subprocess.run([sys.executable, os.path.abspath(__file__), "--child", *args], capture_output=True,
                          text=True, check=False)
    busy, wall = _machine_busy_seconds() - busy, time.perf_counter() - started
    if done.returncode != 0:
        raise SystemExit(f"child {args[0]} failed:\n{done.stderr}")
    result = json.loads(done.stdout.strip().splitlines()[-1])
    if "cpu_seconds" in result:  # the CPUs other jobs kept busy meanwhile (the machine may be shared)
        result["others_cpus"] = max(0.0, busy - result["cpu_seconds"]) / wall
    return result


def _warm(path: str) -> None:
    for entry in os.scandir(path):
        if entry.is_file():
            with open(entry.path, "rb") as handle:
                while handle.read(1 << 24):
                    pass


def _dd(directory: str, size: int) -> float:
    """Seconds ``dd conv=fsync`` takes to write ``size`` bytes (rounded up to 16 MiB blocks) into ``directory``."""
    path = os.path.join(directory, "dd-baseline")
    count = -(-size // (16 << 20))
    started = time.perf_counter()
    subprocess.run(["dd", "if=/dev/zero", f"of={path}", "bs=16M", f"count={count}", "conv=fsync"],
                   check=True, capture_output=True)
    elapsed = time.perf_counter() - started
    os.remove(path)
    return elapsed * size / (count * (16 << 20))  # the time for exactly ``size`` bytes


def _load() -> str:
    return "load average " + " ".join(f"{value:.2f}" for value in os.getloadavg())


def _best(runs: list[dict]) -> dict:
    return min(runs, key=lambda run: run["seconds"])


def _times(runs: list[dict]) -> str:
    return "/".join(f"{run['seconds']:.1f}" for run in runs)


def bench_workers(src: str, workdir: str, tmpfs: str, counts: list[int], repeat: int) -> None:
    """The scaling section (see the module docstring): figures of the best of ``repeat`` runs."""
    fast_out = tempfile.mkdtemp(prefix="bench-convert-out-", dir=tmpfs)
    disk_out = os.path.join(workdir, "out-disk")
    print(f"workers: {counts}, {repeat} run(s) each, best shown (all runs in brackets); {_load()}")
    cases: list[tuple[str, list[str]]] = [(f"{n} worker{'s' if n > 1 else ''}", [str(n), ""]) for n in counts]
    most = max(counts)
    if most > 1:  # the other way to spread as many workers: one process per lane, or all lanes in one
        other = "1,{0}" if most >= 4 else "{0},1"
        processes, lanes = other.format(most).split(",")
        label = f"{processes} process{'es' if processes != '1' else ''} × {lanes} lane{'s' if lanes != '1' else ''}"
        cases.append((f"{most} workers as {label}", ["", other.format(most)]))
    try:
        out = os.path.join(fast_out, "out")
        converted: dict[str, list[dict]] = {}
        verified: dict[int, list[dict]] = {}
        for _ in range(repeat):
            for label, (workers, threads) in cases:
                _warm(src)
                converted.setdefault(label, []).append(_run_child(["convert", src, out, workers, threads]))
            for n in counts:
                _warm(src)
                _warm(out)
                verified.setdefault(n, []).append(_run_child(["verify", src, out, str(n)]))
        shutil.rmtree(out, ignore_errors=True)
        first = _best(converted[cases[0][0]])
        print(f"\ncpu-bound: output on tmpfs ({tmpfs}), hf-mxfp4 source page-cached; MB/s of FP8 written, whole "
              "convert() call (read, encode, write, fsync, hash, rename); (stream) the speed-up before the "
              "shards are hashed; CPU s of this run's processes; others: CPUs other jobs kept busy meanwhile")
        print(f"{'case':<32} | {'convert s':>9} {'MB/s FP8':>8} {'vs first':>8} {'(stream)':>8} {'CPU s':>6} "
              f"{'others':>6} {'main RSS':>8} {'worker RSS':>10} | runs")
        for label, _ in cases:
            best = _best(converted[label])
            print(f"{label:<32} | {best['seconds']:>9.1f} {best['fp8_bytes'] / best['seconds'] / 1e6:>8.0f} "
                  f"{first['seconds'] / best['seconds']:>7.2f}x {first['stream_seconds'] / best['stream_seconds']:>7.2f}x "
                  f"{best['cpu_seconds']:>6.1f} {best['others_cpus']:>6.2f} "
                  f"{best['peak_rss_mb']:>6.0f}MB {best['worker_peak_rss_mb']:>8.0f}MB | "
                  f"[{_times(converted[label])}] {best['plan']}")
        one = _best(verified[counts[0]])
        for n in counts:
            best = _best(verified[n])
            print(f"{'verify-conversion, ' + str(n) + ' workers':<32} | {best['seconds']:>9.1f} "
                  f"{first['fp8_bytes'] / best['seconds'] / 1e6:>8.0f} {one['seconds'] / best['seconds']:>7.2f}x {'':>8} "
                  f"{best['cpu_seconds']:>6.1f} {best['others_cpus']:>6.2f} {best['peak_rss_mb']:>6.0f}MB {best['worker_peak_rss_mb']:>8.0f}MB | "
                  f"[{_times(verified[n])}] ok={best['ok']}")
        on_disk: list[dict] = []
        dd: list[float] = []
        for _ in range(repeat):
            _warm(src)
            on_disk.append(_run_child(["convert", src, disk_out, str(most), ""]))
            shutil.rmtree(disk_out, ignore_errors=True)
            dd.append(_dd(workdir, on_disk[-1]["bytes"]))
        best, dd_best = _best(on_disk), min(dd)
        size = best["bytes"]
        print(f"\ndisk-bound: output on the disk of {workdir}, {size / 1e9:.2f} GB (the whole checkpoint)")
        print(f"{'convert, ' + str(most) + ' workers':<32} | {best['seconds']:>9.1f} {size / best['seconds'] / 1e6:>8.0f} "
              f"MB/s {size / best['seconds'] / (size / dd_best):>6.0%} of dd | [{_times(on_disk)}] "
              f"others {best['others_cpus']:.2f} CPUs")
        print(f"{'dd bs=16M conv=fsync':<32} | {dd_best:>9.1f} {size / dd_best / 1e6:>8.0f} MB/s "
              f"{'':>11} | [{'/'.join(f'{t:.1f}' for t in dd)}]")
        print(f"{_load()}")
    finally:
        shutil.rmtree(fast_out, ignore_errors=True)
        shutil.rmtree(disk_out, ignore_errors=True)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--layers", type=int, nargs="+", default=[1, 2])
    parser.add_argument("--vocab", type=int, default=BENCH_VOCAB, help=f"vocabulary rows (default {BENCH_VOCAB})")
    parser.add_argument("--workdir", help="where sources and outputs go (default: a temporary directory)")
    parser.add_argument("--keep", action="store_true", help="keep the work directory")
    parser.add_argument("--nxdi-rows-per-chunk", type=int, default=NXDI_ROWS_PER_CHUNK,
                        help="rows of 16 bytes per dequant chunk in the baseline (NxDI's default 32768*1024 "
                             "needs ~15 GB for one 120b gate_up tensor; the chunk size does not change its speed much)")
    parser.add_argument("--workers", type=int, nargs="+", metavar="N",
                        help="measure convert(workers=N) and verify-conversion for each N instead (see above)")
    parser.add_argument("--repeat", type=int, help="runs of each --workers case (default 1; the best is shown) or "
                                                   "--baseline case (default 3; the median is shown)")
    parser.add_argument("--tmpfs", default="/dev/shm", help="where the cpu-bound outputs go (default /dev/shm)")
    parser.add_argument("--baseline", nargs="?", const=NUMPY_BASELINE, metavar="SCRIPT",
                        help="measure instead each source kind against an independent converter (default "
                             "scripts/numpy_convert.py; see above)")
    parser.add_argument("--baseline-dir", metavar="DIR",
                        help="--baseline DIR/ref_convert.py: the shared bench/ folder beside the repository, e.g. "
                             "../shared/bench")
    parser.add_argument("--experts", type=int, default=BASELINE_EXPERTS,
                        help=f"experts per layer with --baseline (default {BASELINE_EXPERTS}: per-expert work is the measure)")
    parser.add_argument("--no-verify", action="store_true", help="with --baseline: leave out verify-conversion")
    parser.add_argument("--child", nargs="+", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        kind, *rest = args.child
        children = {"convert": lambda: child_convert(*rest), "verify": lambda: child_verify(*rest),
                    "baseline": lambda: child_baseline(rest[0], int(rest[1])),
                    "encode": lambda: child_encode(*rest)}
        print(json.dumps(children[kind]()))
        return 0

    baseline = checked_baseline_dir(args.baseline_dir) if args.baseline_dir else args.baseline
    workdir = args.workdir or tempfile.mkdtemp(prefix="bench-convert-")
    os.makedirs(workdir, exist_ok=True)
    counts = sorted(set(args.layers))
    print(f"torch {torch.__version__}, {os.cpu_count()} CPUs, torch threads {torch.get_num_threads()}; "
          f"gpt-oss-120b layer shapes, vocab shrunk to {args.vocab}; work dir {workdir}")
    try:
        if baseline:
            bench_baseline(workdir, max(counts), args.vocab, args.experts, args.repeat or 3, baseline,
                           verify=not args.no_verify)
            return 0
        if args.workers:
            source = make_sources(workdir, SOURCE_MXFP4, [max(counts)], args.vocab)[max(counts)]
            bench_workers(source, workdir, args.tmpfs, sorted(set(args.workers)), args.repeat or 1)
            return 0
        sources = {kind: make_sources(workdir, kind, counts, args.vocab) for kind in KINDS}
        rows: list[tuple[str, int, dict, dict]] = []
        baselines: dict[int, dict] = {}
        for count in counts:
            for kind in KINDS:
                src, out = sources[kind][count], os.path.join(workdir, f"out-{kind}-{count}")
                _warm(src)
                converted = _run_child(["convert", src, out])
                _warm(src)
                _warm(out)
                verified = _run_child(["verify", src, out])
                shutil.rmtree(out, ignore_errors=True)
                rows.append((kind, count, converted, verified))
            _warm(sources[SOURCE_MXFP4][count])
            baselines[count] = _run_child(["baseline", sources[SOURCE_MXFP4][count], str(args.nxdi_rows_per_chunk)])
        print(f"\n{'source':<22} {'layers':>6} | {'convert s':>9} {'MB/s FP8':>8} {'peak RSS':>8} {'(stream)':>8} "
              f"{'inexact':>8} {'valid':>5} | {'verify s':>8} {'peak RSS':>8} {'ok':>5} | {'verify/convert':>14}")
        for kind, count, converted, verified in rows:
            rate = converted["fp8_bytes"] / converted["seconds"] / 1e6
            print(f"{kind:<22} {count:>6} | {converted['seconds']:>9.1f} {rate:>8.0f} "
                  f"{converted['peak_rss_mb']:>6.0f}MB {converted['streaming_peak_rss_mb']:>6.0f}MB "
                  f"{converted['inexact']:>8} {converted['valid']!s:>5} | {verified['seconds']:>8.1f} "
                  f"{verified['peak_rss_mb']:>6.0f}MB {verified['ok']!s:>5} | "
                  f"{verified['seconds'] / converted['seconds']:>13.2f}x")
        label = next(iter(baselines.values()))["label"]
        print(f"\nbaseline: NxDI's MXFP4 → BF16 dequant of the same hf-mxfp4 layers, run as {label}, "
              f"rows_per_chunk {args.nxdi_rows_per_chunk}")
        for count, base in baselines.items():
            ours = next(c for kind, n, c, _ in rows if kind == SOURCE_MXFP4 and n == count)
            print(f"{'':<22} {count:>6} | {base['seconds']:>9.1f} {base['values'] / base['seconds'] / 1e6:>8.0f} "
                  f"{base['peak_rss_mb']:>6.0f}MB | ours (hf-mxfp4 convert) {base['seconds'] / ours['seconds']:.1f}x "
                  "faster")
        print("(stream) = peak RSS before the writer hashes the shards at commit; MB/s FP8 counts the whole "
              "convert() call: read, encode, write, fsync, hash, rename; the baseline's MB/s counts its BF16 values")
    finally:
        if not args.keep and not args.workdir:
            shutil.rmtree(workdir, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
