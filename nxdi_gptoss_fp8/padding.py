"""The padded geometry: where a normalized checkpoint's zero padding lies (H → H', I → I'), tensor by
tensor, and the named conversion targets — fixed padded sizes (``convert --target NAME``).

One geometry for everything that writes or reads the padding: the deep scan checks that it is
zero, the stdlib tiny writer leaves it zero. Standard library only (the deep scan's numpy stays
out of the writers).
"""

from __future__ import annotations

from dataclasses import dataclass

from . import format as fmt

__all__ = ["TARGETS", "ConversionTarget", "Region", "padding_region", "target_problems"]


# Tensors whose last dimension is H' (padded at its end); the others are listed in padding_region.
_HIDDEN_LAST = (
    "embed_tokens.weight", "lm_head.weight", "norm.weight", "input_layernorm.weight",
    "post_attention_layernorm.weight", "q_proj.weight", "k_proj.weight", "v_proj.weight",
    "o_proj.bias", "router.linear_router.weight", f"{fmt.DOWN}.bias",
)


@dataclass(frozen=True)
class Region:
    """Padding of one expert's [rows, cols] matrix: rows [row_start, rows) are padding, and
    in the rows before it the listed column ranges are."""

    row_start: int
    col_ranges: tuple[tuple[int, int], ...]


def padding_region(name: str, shape: tuple[int, ...], layout: fmt.Layout) -> Region | None:
    """The padding of tensor ``name`` as a ``Region`` of its [rows, cols] view, or None."""
    h, i = layout.dims.hidden_size, layout.dims.intermediate_size
    hp, ip = layout.padded_hidden_size, layout.padded_intermediate_size
    if (h, i) == (hp, ip) or name.endswith(".scale"):
        return None
    rows = shape[-2] if len(shape) >= 2 else 1
    if name.endswith((f"{fmt.GATE_UP}.weight", f"{fmt.GATE_UP}.bias")):
        row_start = h if name.endswith(".weight") else rows
        return Region(row_start, ((i, ip), (ip + i, 2 * ip)) if ip > i else ())
    if name.endswith(f"{fmt.DOWN}.weight"):
        return Region(i, ((h, hp),) if hp > h else ())
    if name.endswith("self_attn.o_proj.weight"):
        return Region(h, ())
    if name.endswith(_HIDDEN_LAST) and hp > h:
        return Region(rows, ((h, hp),))
    return None


# Named conversion targets: a geometry a checkpoint is converted for, recorded in the index as
# ``metadata.target`` (docs/format.md, Index metadata) so ``inspect`` and ``validate`` name it.
@dataclass(frozen=True)
class ConversionTarget:
    """A named geometry a checkpoint is converted for (``convert --target NAME``): fixed padded
    sizes, recorded in the index as ``metadata.target`` so ``inspect`` and ``validate`` name it."""

    name: str
    padded_hidden_size: int
    padded_intermediate_size: int
    purpose: str  # what it is for, one sentence (the dry run, the card, inspect)
    status: str  # who loads it today, one sentence


# docs/format.md, Index metadata (target); docs/vllm-neuron-plugin.md for nki-moe
TARGETS: dict[str, ConversionTarget] = {
    "nki-moe": ConversionTarget(
        "nki-moe", 3072, 3072,
        "the geometry of the vLLM Neuron plugin's GPT-OSS (Neuron SDK 2.32 and later): hidden and intermediate "
        "sizes padded to 3072, the expert layout the NKI library's MoE kernels (moe_block_tkg, moe_cte) read",
        "no released vLLM Neuron plugin loads FP8 GPT-OSS experts yet (docs/vllm-neuron-plugin.md); NxDI loads it "
        "like any padded checkpoint, with these padded sizes in its NeuronConfig",
    ),
}


def target_problems(target: str, padded_hidden_size: int, padded_intermediate_size: int) -> list[str]:
    """Why an index's ``target`` does not hold (empty when it does): an unknown name, or padded
    sizes other than the target's."""
    known = TARGETS.get(target)
    if known is None:
        return [f"target {target!r} is not one this package knows ({', '.join(TARGETS)})"]
    found = (padded_hidden_size, padded_intermediate_size)
    wanted = (known.padded_hidden_size, known.padded_intermediate_size)
    if found != wanted:
        return [f"target {target!r} pads hidden and intermediate sizes to {wanted[0]} and {wanted[1]}, but the "
                f"index records {found[0]} and {found[1]}"]
    return []
