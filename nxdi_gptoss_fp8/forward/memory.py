"""How much memory ``check-forward`` needs, from the model's shapes, and whether the host has it.

The two models run one after the other, each holding one decoder layer's experts at a time
(``layer_experts`` for NxDI, per-layer hooks in ``reference``), so the need is the larger of:

* NxDI's model: its float32 embedding and head and every checked layer's attention in float32,
  with the BF16 pages they were loaded from (dropped once copied); for the layer running, its
  FP8 experts twice (NxD's sharded copy, and the mapped pages it was copied from) and what NxD
  dequantizes to float32: every expert at once on its all-experts path (a context of fewer
  than ``NXD_BLOCK_SIZE`` / top-k tokens), else one expert per block (its blockwise path);
* the reference: its float32 embedding and head, one layer's attention in float32, and the
  experts it decodes one at a time, with the source bytes of the layer;

plus the process itself (torch, NxDI, NxD and transformers imported). Figures are estimates
with a margin (``MARGIN``), checked against ``scripts/bench_check_forward.py``.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

from .. import format as fmt
from ..units import format_bytes

__all__ = ["FORWARD_PROCESS_BYTES", "MARGIN", "NXD_BLOCK_SIZE", "MemoryNeed", "ReferenceNeed", "check_memory", "forward_memory",
           "reference_memory", "require_memory"]

FORWARD_PROCESS_BYTES = 900 << 20  # the interpreter with torch, NxDI, NxD and transformers imported
MARGIN = 1.15
F32_BYTES = 4
NXD_BLOCK_SIZE = 512  # NxD's default blockwise block size (modules/moe/model_utils.DEFAULT_BLOCK_SIZE)


@dataclass(frozen=True)
class MemoryNeed:
    """The estimate: the total and its parts, in bytes."""

    total: int
    nxdi: int
    reference: int
    per_layer: int
    layers: int

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    def render(self) -> str:
        return (f"about {format_bytes(self.total)} for {self.layers} layer{'s' if self.layers != 1 else ''} "
                f"(NxDI's model {format_bytes(self.nxdi)}, then the reference {format_bytes(self.reference)}; "
                f"{format_bytes(self.per_layer)} more per further layer)")


def _attention(hidden: int, dims: fmt.ModelDims) -> int:
    q, kv = dims.num_attention_heads * dims.head_dim, dims.num_key_value_heads * dims.head_dim
    return hidden * (q + 2 * kv) + q * hidden + q + 2 * kv + hidden + dims.num_attention_heads


def forward_memory(layout: fmt.Layout, layers: int, seq_len: int) -> MemoryNeed:
    """The memory ``check-forward`` needs for ``layers`` layers of ``layout`` and a context of ``seq_len``."""
    dims = layout.dims
    experts, hidden, inter = dims.num_local_experts, layout.padded_hidden_size, layout.padded_intermediate_size
    per_expert = hidden * 2 * inter + inter * hidden
    fp8_layer = experts * per_expert
    all_experts = seq_len * dims.num_experts_per_tok < NXD_BLOCK_SIZE
    dequantized = F32_BYTES * (experts if all_experts else 2) * per_expert
    rows = seq_len * experts if all_experts else 2 * NXD_BLOCK_SIZE
    activations = F32_BYTES * rows * (2 * inter + inter + hidden)
    nxdi_layer = (F32_BYTES + 2) * _attention(hidden, dims)  # float32 parameters, and the BF16 pages while loading
    nxdi = (FORWARD_PROCESS_BYTES + (F32_BYTES + 2) * 2 * dims.vocab_size * hidden + layers * nxdi_layer
            + 2 * fp8_layer + dequantized + activations)
    h, i = dims.hidden_size, dims.intermediate_size
    source_layer = experts * (h * 2 * i + i * h)  # at most one byte a value (MXFP4: half), mapped while read
    reference = (FORWARD_PROCESS_BYTES + F32_BYTES * 2 * dims.vocab_size * h + F32_BYTES * _attention(h, dims)
                 + 2 * F32_BYTES * (h * 2 * i + i * h) + source_layer)
    total = int(max(nxdi, reference) * MARGIN)
    return MemoryNeed(total, int(nxdi * MARGIN), int(reference * MARGIN), int(nxdi_layer * MARGIN), layers)


def check_memory(need: MemoryNeed, available: tuple[int | None, str] | None = None) -> str:
    """A line saying what the check needs and what the host offers; ``CpuModelError`` (one line)
    when the host offers less (``available`` defaults to ``machine.available_memory()``:
    MemAvailable, or the memory cgroup's headroom when smaller)."""
    return require_memory(need.total, need.render(), "free memory or check fewer layers (--layers)", available)


def require_memory(total: int, what: str, fix: str, available: tuple[int | None, str] | None = None) -> str:
    """``needs WHAT; HOST offers N`` when the host offers ``total`` bytes, else ``CpuModelError``
    (one line ending with ``fix``)."""
    from ..errors import CpuModelError
    from ..machine import available_memory

    offered, where = available if available is not None else available_memory()
    if offered is None:
        return f"needs {what}; the host's free memory is unknown"
    if total > offered:
        raise CpuModelError(f"needs {what}, and {where} offers {format_bytes(offered)}: {fix}")
    return f"needs {what}; {where} offers {format_bytes(offered)}"


@dataclass(frozen=True)
class ReferenceNeed:
    """The memory of a transformers reference built for NxDI's accuracy check: the model in its
    dtype, and what building one layer adds (one expert in float32, the layer's stored bytes)."""

    total: int
    model: int
    per_layer: int

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    def render(self) -> str:
        return (f"about {format_bytes(self.total)} (the reference model {format_bytes(self.model)}, "
                f"{format_bytes(self.per_layer)} more while a layer is built)")


def reference_memory(dims: fmt.ModelDims, itemsize: int, layers: int | None = None) -> ReferenceNeed:
    """What a transformers ``GptOssForCausalLM`` of ``dims`` (its first ``layers`` layers) in a
    dtype of ``itemsize`` bytes needs, built one layer at a time: its parameters (the unpadded
    namespace without scales), the process, and the largest layer step — one expert's
    projections dequantized to float32 and the layer's stored experts (at most a byte a value)."""
    unpadded = fmt.Layout.unpadded(dims)
    count = dims.num_hidden_layers if layers is None else layers
    kept = [spec for spec in fmt.expected_namespace(unpadded).values()
            if not spec.name.endswith(".scale") and (not spec.name.startswith("layers.")
                                                      or int(spec.name.split(".")[1]) < count)]
    model = sum(itemsize * spec.numel for spec in kept)
    h, i = dims.hidden_size, dims.intermediate_size
    per_expert = h * 2 * i + i * h
    per_layer = 2 * F32_BYTES * per_expert + dims.num_local_experts * per_expert
    total = int((FORWARD_PROCESS_BYTES + model + per_layer) * MARGIN)
    return ReferenceNeed(total, model, int(per_layer * MARGIN))
