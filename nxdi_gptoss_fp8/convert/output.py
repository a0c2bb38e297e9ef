"""The output side shared by every source kind: the background writer, compute lanes, the
non-expert copy, HF-style biases, and the conversion report.

Tensors are written at their final offsets through ``CheckpointWriter``; experts are encoded
``Workspace.LANES`` at a time in plain threads, each into a reused buffer (so memory does not
grow with the model), which that thread then writes while it is still in its cache.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from typing import Any

import torch

from .. import format as fmt
from ..errors import ConversionError
from ..units import format_bytes, plural
from ..writer import CheckpointWriter
from .fp8 import FP8_DTYPE, MIN_NORMAL_SCALE
from .layout import chunk_interleaved, pad_to
from .mxfp4 import Exactness
from .source import SourceReader, expert_source_name

__all__ = [
    "CHUNK_BYTES", "DROPPED_CONFIG_KEYS", "ConversionReport", "EncodeResult", "ExpertStats", "Lane", "Output", "Workspace",
    "copy_padded", "hf_biases", "output_config", "put_biases", "require_finite", "require_normal_scales", "single_threaded_torch",
    "stream_experts",
]

CHUNK_BYTES = 32 << 20


# --------------------------------------------------------------------------- report


@dataclass
class ExpertStats:
    """Exactness of one converted expert projection (all experts of one layer)."""

    name: str
    values: int = 0
    inexact: int = 0
    flushed_to_zero: int = 0
    max_rel_error: float = 0.0
    mean_rel_error: float | None = None  # requantized (BF16) sources: over the non-zero source values

    @classmethod
    def from_exactness(cls, name: str, exactness: Exactness) -> ExpertStats:
        return cls(name, exactness.values, exactness.inexact, exactness.flushed_to_zero, exactness.max_rel_error)


def _inexact_text(stats: ExpertStats) -> str:
    rounded = stats.inexact - stats.flushed_to_zero
    parts = [f"{rounded} rounded (worst relative error {stats.max_rel_error:.3g})"] if rounded else []
    parts += [f"{stats.flushed_to_zero} flushed to zero"] if stats.flushed_to_zero else []
    return ", ".join(parts)


@dataclass
class ConversionReport:
    """What ``convert`` did: source, output, bytes, time and per-tensor exactness."""

    source: str
    source_format: str
    out: str
    profile: str
    padded_hidden_size: int
    padded_intermediate_size: int
    layers: int
    tensors: int
    bytes_written: int
    fp8_bytes: int
    elapsed_s: float
    experts: list[ExpertStats] = field(default_factory=list)
    workers: str = ""  # how the layers were spread (``workers.WorkerPlan.describe``)
    peak_rss_per_process: int = 0  # the largest peak RSS of any process that converted layers
    files: int = 0  # files the output holds (shards, config, index, card, companions)
    files_bytes: int = 0  # their bytes: what the plan's "write" total bounds
    target: str | None = None  # the named conversion target (format.TARGETS), if any

    @property
    def ok(self) -> bool:
        """Always: a report exists only for a conversion that finished (a failed one raises)."""
        return True

    @property
    def fp8_values(self) -> int:
        return sum(s.values for s in self.experts)

    @property
    def inexact_values(self) -> int:
        return sum(s.inexact for s in self.experts)

    @property
    def max_rel_error(self) -> float:
        return max((s.max_rel_error for s in self.experts), default=0.0)

    @property
    def exact(self) -> bool:
        return self.inexact_values == 0

    @property
    def requantized(self) -> bool:
        """True when the experts were quantized afresh (amax/240) rather than re-encoded."""
        return any(s.mean_rel_error is not None for s in self.experts)

    @property
    def flushed_to_zero(self) -> int:
        return sum(s.flushed_to_zero for s in self.experts)

    def exactness_text(self) -> str:
        """The exactness in words: exact, rounded (with the worst relative error among them) and
        flushed to zero, counted apart (a flushed value's relative error is 1 by definition)."""
        flushed = self.flushed_to_zero
        if self.requantized:
            text = (f"quantized afresh from BF16 with per-channel amax/240 scales: worst relative error "
                    f"{self.max_rel_error:.3g} over {plural(self.fp8_values, 'expert value')}")
            return text + (f"; {plural(flushed, 'small value')} flushed to zero" if flushed else "")
        rounded = self.inexact_values - flushed
        text = f"{self.fp8_values - self.inexact_values:,} of {plural(self.fp8_values, 'expert value')} exact"
        if rounded:
            text += f"; {rounded:,} rounded (worst relative error {self.max_rel_error:.3g})"
        if flushed:
            text += f"; {flushed:,} flushed to zero"
        return text

    def exactness_summary(self) -> dict[str, Any]:
        return {"fp8_values": self.fp8_values, "inexact_values": self.inexact_values,
                "flushed_to_zero": self.flushed_to_zero,
                "max_rel_error": self.max_rel_error}

    def to_dict(self) -> dict[str, Any]:
        document = asdict(self)
        document.update(self.exactness_summary())
        return document

    def render_text(self, *, limit: int = 10) -> str:
        rate = self.fp8_bytes / self.elapsed_s / 1e6 if self.elapsed_s > 0 else 0.0
        lines = [
            f"converted {self.source} ({self.source_format}) → {self.out}",
            f"  profile {self.profile}, {plural(self.layers, 'layer')}, H'={self.padded_hidden_size}, "
            f"I'={self.padded_intermediate_size}, {plural(self.tensors, 'tensor')}"
            + (f", target {self.target}" if self.target else ""),
            f"  {plural(self.files, 'file')}, {format_bytes(self.files_bytes)} ({plural(self.files_bytes, 'byte')}) written: "
            f"{format_bytes(self.bytes_written)} of tensor data ({format_bytes(self.fp8_bytes)} FP8), in "
            f"{self.elapsed_s:.1f} s ({rate:.0f} MB/s FP8)",
        ]
        if self.workers:
            lines.append(f"  {self.workers}; measured peak RSS per process {format_bytes(self.peak_rss_per_process)}")
        if not self.requantized:
            lines.append(f"  exactness: {self.exactness_text()}")
            worst = sorted((s for s in self.experts if s.inexact), key=lambda s: -s.inexact)[:limit]
            lines += [f"    {s.name}: {_inexact_text(s)}" for s in worst]
        else:
            lines.append(f"  amax/240 scaling: worst relative error {self.max_rel_error:.3g} over "
                         f"{plural(self.fp8_values, 'expert value')} (per tensor below)")
            lines += [f"    {s.name}: max {s.max_rel_error:.3g}, mean {s.mean_rel_error or 0.0:.3g}"
                      + (f", {s.flushed_to_zero} flushed to zero" if s.flushed_to_zero else "")
                      for s in self.experts[:limit]]
            if len(self.experts) > limit:
                lines.append(f"    … {len(self.experts) - limit} more (see to_dict())")
        return "\n".join(lines)


# --------------------------------------------------------------------------- value checks


def require_finite(values: torch.Tensor, where: str, name: str, first_row: int = 0) -> None:
    """Refuse a source tensor (or a row block of it, starting at ``first_row``) holding NaN or ±inf:
    the converter never copies or quantizes one (``where`` names the file)."""
    if not values.is_floating_point() or not values.numel():
        return
    low, high = torch.aminmax(values)  # NaN and ±inf propagate; ~15 times faster than isfinite on BF16
    if bool(torch.isfinite(low) & torch.isfinite(high)):
        return
    finite = torch.isfinite(values)
    index = [int(i) for i in (~finite).nonzero()[0]]
    value = float(values[tuple(index)])
    if values.dim() and first_row:
        index[0] += first_row
    raise ConversionError(f"{where}: {name}{index} is {value}: the source holds a non-finite value, which no "
                          "conversion can carry; nothing was written (re-download the source, or fix the "
                          "model that produced it)")


def require_normal_scales(scales: torch.Tensor, name: str) -> None:
    """The last guard before a scale is written: every one a normal, finite float32 > 0."""
    good = torch.isfinite(scales) & (scales >= MIN_NORMAL_SCALE)
    if not bool(good.all()):
        index = [int(i) for i in (~good).nonzero()[0]]
        raise ConversionError(f"{name}{index} would be {float(scales[tuple(index)])}, not a normal, finite, positive "
                              "float32 scale: refusing to write it (corrupt or degenerate source values)")


# --------------------------------------------------------------------------- writing


class Output:
    """The writer and the progress bar. Every byte goes through ``write`` (from the calling
    thread: a compute lane writes the buffer it has just filled, while it is still in its
    core's cache) or ``put_async`` (queued on the background writing thread)."""

    def __init__(self, writer: CheckpointWriter, bar: Any, pool: ThreadPoolExecutor) -> None:
        self.writer, self.bar, self.pool = writer, bar, pool
        self.bytes = self.fp8_bytes = 0
        self._lock = threading.Lock()  # one write at a time: the writers' counts are plain dicts

    def shape(self, name: str) -> tuple[int, ...]:
        """The planned (padded) shape of output tensor ``name``."""
        return self.writer.planned[name].spec.shape

    def write(self, name: str, data: torch.Tensor, offset: int = 0) -> None:
        """Write ``data`` as bytes ``[offset, …)`` of tensor ``name`` now, from this thread."""
        size = data.numel() * data.element_size()
        with self._lock:
            self.writer.put(name, data, offset=offset)
            self.bytes += size
            if data.dtype in (FP8_DTYPE, torch.uint8):
                self.fp8_bytes += size
        self.bar.update(size)

    def put_async(self, name: str, data: torch.Tensor, *, offset: int = 0) -> Future[None]:
        """Queue a write; ``data`` must not change until the future is done."""
        return self.pool.submit(self.write, name, data, offset)

    def put(self, name: str, data: torch.Tensor, *, offset: int = 0) -> None:
        self.put_async(name, data, offset=offset).result()


# --------------------------------------------------------------------------- compute lanes


@dataclass
class Lane:
    """One expert in flight: an output buffer (and a kind's own reusable tools), reused for
    every expert it takes; the thread that fills it writes it."""

    buffer: torch.Tensor
    tools: Any = None


class Workspace:
    """Output buffers (and per-kind tools), allocated once per shape; a pool of compute threads.

    ``LANES`` experts are encoded at once in plain threads (torch releases the GIL in its ops)
    with torch's own intra-op threading off: on a small shared machine that beats one expert
    at a time on OpenMP threads, which spin while they wait. Padding regions of the buffers
    are zeroed once and never written again.
    """

    LANES = 2

    def __init__(self, pool: ThreadPoolExecutor, *, lanes: int | None = None) -> None:
        self.pool = pool
        self.LANES = lanes or self.LANES  # one worker's lanes (``workers.WorkerPlan``)
        self._tools: dict[Any, list[Any]] = {}
        self._lanes: dict[tuple[Any, tuple[int, int]], list[Lane]] = {}

    def lanes(self, out_shape: tuple[int, int], tools_key: Any = None,
              make_tools: Callable[[], Any] | None = None) -> list[Lane]:
        """The lanes writing experts of ``out_shape``; ``make_tools`` builds each lane's tools,
        shared by every output shape with the same ``tools_key``."""
        key = (tools_key, out_shape)
        if key not in self._lanes:
            tools = self._tools.setdefault(
                tools_key, [make_tools() if make_tools else None for _ in range(self.LANES)])
            self._lanes[key] = [Lane(torch.zeros(out_shape, dtype=torch.uint8), tool) for tool in tools]
        return self._lanes[key]


@contextlib.contextmanager
def single_threaded_torch() -> Iterator[None]:
    """Run torch ops single-threaded inside (the compute lanes are the parallelism)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(threads)


EncodeResult = tuple[Exactness, torch.Tensor]


def stream_experts(reader: SourceReader, out: Output, workspace: Workspace, name: str, lanes: list[Lane],
                   load: Callable[[int], tuple[Any, ...]], encode: Callable[..., EncodeResult], *,
                   release_every: int, total: Exactness | None = None) -> Exactness:
    """Every expert of output ``name`` (``…weight`` and ``…scale``), ``len(lanes)`` at a time.

    ``load(expert)`` runs here and reads the expert's source tensors; ``encode(lane, *loaded)``
    runs on a compute thread, fills ``lane.buffer`` and returns (exactness, float32 scale row
    [out']); that thread then writes the buffer itself (handing it to another thread would
    move every byte to another core's cache first). The source files are released every
    ``release_every`` experts (in-flight tensors keep their own pages). The experts' exactness
    is added, in expert order, to ``total`` (a fresh ``Exactness`` when None: a kind with more
    statistics passes its own subclass) and returned.
    """
    experts = out.shape(f"{name}.weight")[0]
    scales_out = torch.empty((experts, 1, out.shape(f"{name}.scale")[2]), dtype=torch.float32)
    exactness = Exactness() if total is None else total
    in_flight: list[tuple[int, Future[EncodeResult]]] = []

    def encode_and_write(lane: Lane, expert: int, *loaded: Any) -> EncodeResult:
        result = encode(lane, *loaded)
        out.write(f"{name}.weight", lane.buffer, expert * lane.buffer.numel())
        return result

    def finish_oldest() -> None:
        expert, future = in_flight.pop(0)
        result, scale_row = future.result()
        exactness.add(result)
        scales_out[expert, 0] = scale_row

    try:
        for expert in range(experts):
            if expert % release_every == 0:
                reader.release()
            if len(in_flight) == len(lanes):
                finish_oldest()  # the oldest expert's lane: the one this expert takes
            lane = lanes[expert % len(lanes)]
            in_flight.append((expert, workspace.pool.submit(encode_and_write, lane, expert, *load(expert))))
        while in_flight:
            finish_oldest()
    finally:
        for _, future in in_flight:  # an error: no lane may still write once the caller unwinds
            future.cancel()
        for _, future in in_flight:
            with contextlib.suppress(BaseException):
                future.result()
    reader.release()
    require_normal_scales(scales_out, f"{name}.scale")
    out.put(f"{name}.scale", scales_out)
    return exactness


# --------------------------------------------------------------------------- plain tensors


def copy_padded(reader: SourceReader, src_name: str, out: Output, name: str) -> None:
    """Rename, cast to BF16 and zero-pad one non-expert tensor, in row chunks."""
    shape = out.shape(name)
    path, info = reader.source.tensors[src_name]
    source_shape = info.shape
    if len(shape) == 1:
        values = reader.get(src_name)
        require_finite(values, path, src_name)
        out.put(name, pad_to(values.to(torch.bfloat16), shape))
        return
    rows, cols = shape
    step = max(1, CHUNK_BYTES // (cols * 2))
    for start in range(0, rows, step):
        stop = min(rows, start + step)
        if start < source_shape[0]:
            chunk = reader.slice(src_name)[start:min(stop, source_shape[0])]
            require_finite(chunk, path, src_name, start)
            if chunk.dtype == torch.bfloat16 and tuple(chunk.shape) == (stop - start, cols) and chunk.is_contiguous():
                out.put(name, chunk, offset=start * cols * 2)  # already what we write: no copy
            else:
                part = torch.zeros((stop - start, cols), dtype=torch.bfloat16)
                part[: chunk.shape[0], : chunk.shape[1]] = chunk
                out.put(name, part, offset=start * cols * 2)
            del chunk
            reader.release()
        else:
            out.put(name, torch.zeros((stop - start, cols), dtype=torch.bfloat16), offset=start * cols * 2)


def put_biases(out: Output, layer: int, gate_up: torch.Tensor, down: torch.Tensor, layout: fmt.Layout) -> None:
    """Write the raw expert biases: ``gate_up`` [E, 2I] interleaved (even = gate) becomes
    chunked halves; everything padded, BF16."""
    prefix = fmt.layer_prefix(layer)
    out.put(f"{prefix}{fmt.GATE_UP}.bias",
            chunk_interleaved(gate_up.to(torch.bfloat16), layout.padded_intermediate_size, 0.0))
    down = down.to(torch.bfloat16)
    out.put(f"{prefix}{fmt.DOWN}.bias", pad_to(down, (down.shape[0], layout.padded_hidden_size)))


def hf_biases(reader: SourceReader, layer: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The fused HF expert biases (MXFP4 and BF16 sources): gate_up [E, 2I] interleaved, down [E, H]."""
    biases = []
    for short in ("gate_up_proj_bias", "down_proj_bias"):
        name = expert_source_name(layer, short)
        values = reader.get(name)
        require_finite(values, reader.source.tensors[name][0], name)
        biases.append(values.to(torch.bfloat16))
    return biases[0], biases[1]


# source config.json keys never written to the output: ours replaces the quantization_config;
# ``_name_or_path`` is where the source sat (a local path, perhaps private), which transformers
# replaces with the directory it loads from (``AutoConfig.from_pretrained``), and which NxDI's
# ``checkpoint_loader_fn`` would otherwise read as the weights' directory when that path exists
# (a config built from the JSON by hand, not quantized): absent, it falls back to the model path.
DROPPED_CONFIG_KEYS = ("quantization_config", "_name_or_path")


def output_config(source_config: dict[str, Any], dims: fmt.ModelDims) -> dict[str, Any]:
    """The source ``config.json`` with its ``quantization_config`` replaced by ours, and no
    ``_name_or_path`` (``DROPPED_CONFIG_KEYS``: no file of the output names where the source sat)."""
    config = {key: value for key, value in source_config.items() if key not in DROPPED_CONFIG_KEYS}
    config["quantization_config"] = fmt.hf_config(dims)["quantization_config"]
    return config
