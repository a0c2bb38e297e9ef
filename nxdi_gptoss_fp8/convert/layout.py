"""Output layout helpers shared by every source kind: gate/up chunking, padding, transposes.

NxDI's expert layout is input-dim first: gate_up ``[H', 2I']`` with the gate channels in the
first half and the up channels in the second (``[gate | pad | up | pad]``), down ``[I', H']``.
"""

from __future__ import annotations

import torch

__all__ = ["TILE", "chunk_halves", "chunk_interleaved", "crop_to", "interleave_chunked", "pad_to", "place_down", "place_gate_up",
           "scale_row"]

TILE = 64


def chunk_interleaved(values: torch.Tensor, padded: int, fill: float) -> torch.Tensor:
    """[..., 2I] gate/up interleaved (even = gate, odd = up) → [..., 2I'] chunked
    ``[gate | pad | up | pad]``, each half padded to I' with ``fill``."""
    half = values.shape[-1] // 2
    out = torch.full((*values.shape[:-1], 2, padded), fill, dtype=values.dtype)
    out[..., :half] = values.reshape(*values.shape[:-1], half, 2).transpose(-1, -2)
    return out.reshape(*values.shape[:-1], 2 * padded)


def interleave_chunked(values: torch.Tensor, half: int) -> torch.Tensor:
    """The inverse of ``chunk_interleaved``: [..., 2I'] chunked ``[gate | pad | up | pad]`` →
    [..., 2I] interleaved (even = gate, odd = up), the padding dropped; ``half`` is I."""
    padded = values.shape[-1] // 2
    gate, up = values[..., :half], values[..., padded:padded + half]
    return torch.stack([gate, up], dim=-1).flatten(-2)


def chunk_halves(gate: torch.Tensor, up: torch.Tensor, padded: int, fill: float) -> torch.Tensor:
    """Separate gate [..., I] and up [..., I] → [..., 2I'] chunked ``[gate | pad | up | pad]``."""
    out = torch.full((*gate.shape[:-1], 2, padded), fill, dtype=gate.dtype)
    out[..., 0, : gate.shape[-1]] = gate
    out[..., 1, : up.shape[-1]] = up
    return out.reshape(*gate.shape[:-1], 2 * padded)


def pad_to(values: torch.Tensor, shape: tuple[int, ...], fill: float = 0.0) -> torch.Tensor:
    """``values`` zero-padded at the end of every dim to ``shape`` (NxDI's ``F.pad(…, (0, d))``)."""
    if tuple(values.shape) == tuple(shape):
        return values
    out = torch.full(shape, fill, dtype=values.dtype)
    out[tuple(slice(0, n) for n in values.shape)] = values
    return out


def scale_row(scales: torch.Tensor, gate_up: bool, padded_i: int, width: int) -> torch.Tensor:
    """One expert's channel scales [out] in the output's order and width: gate_up's (interleaved)
    chunked into ``[gate | pad | up | pad]`` of ``padded_i`` each, down's padded to ``width``;
    padding scales 1.0 (a scale must be a normal float)."""
    if gate_up:
        return chunk_interleaved(scales, padded_i, 1.0)
    return pad_to(scales, (width,), 1.0)


def crop_to(values: torch.Tensor, shape: tuple[int, ...]) -> torch.Tensor:
    """The inverse of ``pad_to``: the leading ``shape`` of ``values`` (a view: the padding dropped)."""
    if len(shape) != values.dim() or any(n > m for n, m in zip(shape, values.shape, strict=True)):
        raise ValueError(f"cannot crop {tuple(values.shape)} to {tuple(shape)}")
    return values[tuple(slice(0, n) for n in shape)]


def place_gate_up(rows: torch.Tensor, out: torch.Tensor, first_row: int = 0) -> None:
    """Source rows ``first_row…`` of [2I, H] (interleaved; ``first_row`` even) into ``out``
    [H', 2I']: transposed, chunked into ``[gate | up]``, padded.

    Copied in tiles of ``TILE`` source rows: a byte transpose in one piece misses the cache
    on every element and costs about twice as much."""
    count, h = rows.shape
    channel, padded_half = first_row // 2, out.shape[1] // 2
    pairs = rows.view(count // 2, 2, h)  # [channels, (gate, up), H]
    for start in range(0, count // 2, TILE):
        stop = min(count // 2, start + TILE)
        out[:h, channel + start:channel + stop].copy_(pairs[start:stop, 0].t())
        out[:h, padded_half + channel + start:padded_half + channel + stop].copy_(pairs[start:stop, 1].t())


def place_down(rows: torch.Tensor, out: torch.Tensor, first_row: int = 0) -> None:
    """Source rows ``first_row…`` of [out, in] (one output channel each) into ``out`` [in', out']
    as its columns: transposed, padded (in tiles, as above). Used for down [H, I] → [I', H'] and
    for separate gate or up rows [I, H] into one half of [H', 2I']."""
    count, i = rows.shape
    for start in range(0, count, TILE):
        stop = min(count, start + TILE)
        out[:i, first_row + start:first_row + stop].copy_(rows[start:stop].t())
