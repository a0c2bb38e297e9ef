"""Where a normalized checkpoint's zero padding lies (H → H', I → I'), tensor by tensor.

One geometry for everything that writes or reads the padding: the deep scan checks that it is
zero, the stdlib tiny writer leaves it zero. Standard library only (the deep scan's numpy stays
out of the writers).
"""

from __future__ import annotations

from dataclasses import dataclass

from . import format as fmt

__all__ = ["Region", "padding_region"]


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
