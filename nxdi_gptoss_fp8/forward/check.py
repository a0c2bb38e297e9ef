"""``check-forward``: a user's normalized checkpoint through NxDI's real model (CPU mode, first K
layers) against transformers on the published source's same K layers.

Order: preflight the whole checkpoint (a failure stops here: no model is built, NxDI is not
imported); refuse at once a source the reference cannot read, a source of another model and a
host without the memory the run needs (``memory``); copy the first K layers and the global tensors into a K-layer normalized checkpoint
(only those tensors are read); run NxDI's model from it through the hook; run the reference; compare
per position under the bound the source allows (``forward_metrics``): an MXFP4 source must agree
to float32 rounding, a BF16 source within FP8 quantization error.
"""

from __future__ import annotations

import json
import os
import tempfile
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import Any

from .. import format as fmt
from ..errors import ConversionError
from ..safeio.json_file import read_json_file
from ..units import plural
from ..validate.findings import PreflightReport
from ..validate.pipeline import allow_custom_from_env, preflight
from .memory import MemoryNeed
from .metrics import EXACT, QUANTIZED, Bound, PositionMetrics, bound_for, compare, summarize

__all__ = [
    "DEFAULT_LAYERS", "DEFAULT_STEPS", "DEFAULT_TOKENS", "WINDOW_SHARD_SIZE", "ForwardCheckReport", "check_forward",
    "write_window",
]

DEFAULT_LAYERS, DEFAULT_TOKENS, DEFAULT_STEPS = 2, 12, 6
WINDOW_SHARD_SIZE = 2 << 30


@dataclass
class ForwardCheckReport:
    """The outcome of one forward check: the preflight, then (if it passed) the comparison."""

    checkpoint: str
    source: str
    layers: int
    preflight: PreflightReport
    source_format: str | None = None
    tokens: list[int] = field(default_factory=list)
    context: int = 0
    bound: Bound | None = None
    positions: list[PositionMetrics] = field(default_factory=list)
    neuron_config_changed: list[str] = field(default_factory=list)
    memory: MemoryNeed | None = None
    timings: dict[str, float] = field(default_factory=dict)

    @property
    def model_built(self) -> bool:
        return bool(self.positions)

    @property
    def ok(self) -> bool:
        return self.preflight.ok and self.model_built and all(m.ok for m in self.positions)

    def to_dict(self) -> dict[str, Any]:
        return {
            "ok": self.ok, "checkpoint": self.checkpoint, "source": self.source, "source_format": self.source_format,
            "layers": self.layers, "tokens": self.tokens, "context": self.context,
            "preflight": json.loads(self.preflight.to_json()), "model_built": self.model_built,
            "bound": self.bound.to_dict() if self.bound else None,
            "summary": summarize(self.positions) if self.positions else None,
            "positions": [asdict(m) for m in self.positions],
            "neuron_config_changed_for_cpu": self.neuron_config_changed,
            "memory_estimate": self.memory.to_dict() if self.memory else None,
            "timings_s": {key: round(value, 3) for key, value in self.timings.items()},
        }

    def render_text(self) -> str:
        if not self.preflight.ok:
            return (f"{self.preflight.render_text()}\n"
                    f"check-forward: FAIL: the preflight refused {self.checkpoint}; no model was built")
        lines = [f"check-forward {self.checkpoint}",
                 f"  reference: transformers GptOssForCausalLM on {self.source} ({self.source_format}), float32",
                 f"  first {plural(self.layers, 'layer')}, {plural(len(self.tokens), 'token')}: context pass over {self.context}, "
                 f"{plural(len(self.tokens) - self.context, 'teacher-forced step')}"]
        if self.memory is not None:
            lines.append(f"  memory: {self.memory.render()}")
        if self.neuron_config_changed:
            lines.append(f"  NeuronConfig keys set for the CPU: {', '.join(self.neuron_config_changed)}")
        assert self.bound is not None
        lines.append(f"  bound ({self.bound.kind}): {self.bound.why}")
        limit = (f"max |Δ| ≤ {self.bound.max_abs_diff:.3g}" if self.bound.max_abs_diff is not None
                 else f"cosine ≥ {self.bound.min_cosine:.6f}")
        lines.append(f"  {'pos':>4}  {'max |Δlogit|':>12}  {'cosine':>10}  {'top-1':>5}  {'KL':>10}")
        for m in self.positions:
            lines.append(f"  {m.position:>4}  {m.max_abs_diff:>12.3e}  {m.cosine:>10.7f}  {'yes' if m.top1_agree else 'NO':>5}  "
                         f"{m.kl:>10.3e}{'' if m.ok else '  VIOLATION'}")
        s = summarize(self.positions)
        lines.append(f"  worst: max |Δ| {s['max_abs_diff']:.3e}, cosine {s['min_cosine']:.7f}, top-1 agreement "
                     f"{s['top1_agreement']:.0%}, KL {s['max_kl']:.3e} (bound: {limit})")
        timing = ", ".join(f"{key} {value:.1f} s" for key, value in self.timings.items())
        lines.append(f"  time: {timing}")
        agrees = ("to float32 rounding" if self.bound.kind == EXACT else "within FP8 quantization error")
        verdict = (f"PASS: NxDI's model computes from this checkpoint what the source computes, {agrees}"
                   if self.ok else f"FAIL: {s['violations']} of {s['positions']} positions exceed the bound")
        lines.append(f"check-forward: {verdict}")
        return "\n".join(lines)


def _read_config(root: str) -> dict[str, Any]:
    config: dict[str, Any] = read_json_file(os.path.join(root, fmt.CONFIG_FILE), what=fmt.CONFIG_FILE)
    return config


def write_window(ckpt: str, out: str, layout: fmt.Layout, layers: int, *, allow_custom_model: bool) -> str:
    """A normalized checkpoint at ``out`` holding the first ``layers`` layers and the global
    tensors of ``ckpt`` (whose layout is ``layout``), with the same padding. The loader
    preflights ``ckpt`` and maps it; only the copied tensors are read."""
    from ..loader import LoadPolicy, load_checkpoint
    from ..writer import CheckpointWriter

    # mapped and unverified whatever the environment asks: reading or hashing every shard
    # would touch the whole checkpoint (the window itself is then loaded as configured)
    loaded = load_checkpoint(ckpt, allow_custom_model=allow_custom_model,
                             policy=LoadPolicy(load_mode=fmt.LOAD_MODE_MMAP))
    config = _read_config(ckpt)
    config["num_hidden_layers"] = layers
    if isinstance(config.get("layer_types"), list):
        config["layer_types"] = config["layer_types"][:layers]
    dims = fmt.ModelDims(**{**layout.dims.as_dict(), "num_hidden_layers": layers})
    window = fmt.Layout(dims, layout.padded_hidden_size, layout.padded_intermediate_size)
    source = {"generator": "nxdi-gptoss-fp8 check-forward", "window_of": os.path.abspath(ckpt), "layers": layers}
    from .layer_experts import release_pages

    with CheckpointWriter(out, window, fmt.PROFILE_CUSTOM, config, max_shard_size=WINDOW_SHARD_SIZE, source=source) as writer:
        for name in fmt.expected_namespace(window):
            writer.put(name, loaded.state_dict[name])
            release_pages(loaded.state_dict[name])  # written: its mapped pages leave this process's memory
        return writer.commit()


def check_forward(
    ckpt: str | os.PathLike[str],
    source: str | os.PathLike[str],
    *,
    layers: int | None = DEFAULT_LAYERS,
    tokens: int = DEFAULT_TOKENS,
    steps: int = DEFAULT_STEPS,
    neuron_config: dict[str, Any] | None = None,
    allow_custom_model: bool = False,
    say: Callable[[str], None] | None = None,
    available_memory: tuple[int | None, str] | None = None,
) -> ForwardCheckReport:
    """Run the forward check of ``ckpt`` against the HF source ``source`` (``layers`` None: all).

    Everything that can refuse is decided before NxDI is imported or a model is built: the
    preflight, the source's kind (the reference reads HF MXFP4 and BF16 only) and model, the
    counts, and the memory the run needs against what the host offers (``say`` gets that line
    first; ``available_memory`` replaces the host's figure, for tests). Raises ``CpuModelError``
    when NxDI, NxD or transformers is missing or the host lacks the memory, ``ConversionError``
    when ``source`` is not a readable HF GPT-OSS checkpoint of the same model, ``ValueError``
    for bad counts. A preflight failure is not raised: the report says so (``model_built``
    False). Example::

        report = check_forward("/ckpt/gpt-oss-20b-fp8", "/hf/gpt-oss-20b", layers=2)
        print(report.render_text())
    """
    from ..convert import SOURCE_MXFP4, open_source
    from . import cpu_model
    from .memory import check_memory, forward_memory
    from .reference import require_reference_kind

    ckpt, source = os.path.abspath(os.fspath(ckpt)), os.path.abspath(os.fspath(source))
    allow_custom_model = allow_custom_model or allow_custom_from_env()
    started = time.perf_counter()
    report = ForwardCheckReport(ckpt, source, layers or 0, preflight(ckpt, neuron_config=neuron_config,
                                                                    allow_custom_model=allow_custom_model))
    report.timings["preflight"] = time.perf_counter() - started
    if not report.preflight.ok:
        return report
    src = open_source(source)
    require_reference_kind(src.kind, source)
    dims = fmt.dims_from_config(_read_config(ckpt))
    if src.dims != dims:
        raise ConversionError(f"{source} is not the model of {ckpt}: its dimensions {src.dims.as_dict()} differ "
                              f"from {dims.as_dict()}")
    layers = dims.num_hidden_layers if layers is None else layers
    if not 1 <= layers <= dims.num_hidden_layers:
        raise ValueError(f"--layers must be 1..{dims.num_hidden_layers} or all, not {layers}")
    report.layers = layers
    plan = cpu_model.fixed_plan(dims.vocab_size, tokens, steps)
    layout = report.preflight.view.layout if report.preflight.view is not None else None
    assert layout is not None, "a clean preflight report holds the checkpoint's layout"
    report.memory = forward_memory(layout, layers, cpu_model.NxdiCpuAdaptations.seq_len(plan, dims.sliding_window))
    line = check_memory(report.memory, available_memory)
    if say is not None:
        say(line)
    cpu_model.require_nxdi()
    report.source_format, report.tokens, report.context = src.kind, list(plan.tokens), plan.context
    with tempfile.TemporaryDirectory(prefix="nxdi-gptoss-fp8-window-") as work:
        window = ckpt
        if layers < dims.num_hidden_layers:
            mark = time.perf_counter()
            window = write_window(ckpt, os.path.join(work, "window"), layout, layers, allow_custom_model=allow_custom_model)
            report.timings["window"] = time.perf_counter() - mark
        settings = dict(neuron_config or {})
        # a padded checkpoint runs only with its padding (set unless given)
        for key, size, base in (("padded_hidden_size", layout.padded_hidden_size, dims.hidden_size),
                                ("padded_intermediate_size", layout.padded_intermediate_size, dims.intermediate_size)):
            if size != base:
                settings.setdefault(key, size)
        spec = cpu_model.RunSpec(window, cpu_model.ROUTE_NORMALIZED, settings,
                                 allow_custom_model=allow_custom_model or window != ckpt)
        _, report.neuron_config_changed = cpu_model.neuron_settings(spec, plan, 1, layers, dims.sliding_window)
        mark = time.perf_counter()
        checked = cpu_model.run_forward(spec, plan)
        report.timings["nxdi"] = time.perf_counter() - mark
    from .reference import reference_logits

    mark = time.perf_counter()
    reference = reference_logits(source, plan.tokens, plan.positions, layers)
    report.timings["reference"] = time.perf_counter() - mark
    hidden = dims.hidden_size
    report.bound = bound_for(EXACT if src.kind == SOURCE_MXFP4 else QUANTIZED, hidden_size=hidden, layers=layers,
                             reference=reference)
    report.positions = compare(checked, reference, plan.positions, report.bound)
    report.timings["total"] = time.perf_counter() - started
    return report
