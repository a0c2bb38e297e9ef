#!/usr/bin/env python3
"""A plain numpy converter to the normalized FP8 format, written from docs/format.md ("Tensor
namespace", "Layout rules") and docs/converting.md ("Exactness") alone, not from the package's
code: the yardstick ``scripts/bench_convert.py`` measures the converter against by default.

Numpy and the standard library only; one thread; the source read through memory maps; one
safetensors file written with ``os.pwrite``; no hashing, no fsync, no index, no padding (H' = H,
I' = I). The expert tensors get their normalized names; every other tensor is copied under its
source name, byte for byte (the sources the benchmark makes are BF16 already).

E4M3 rounding is done in float64 arithmetic: a value's quantum is 2^(e − 3) for its binade e
(at least 2^-9, E4M3's subnormal step), ``numpy.rint`` rounds the multiple to nearest even, the
magnitude saturates at 240, and the byte is the rounded value's position among the 121 E4M3
magnitudes from 0 to 240, with the sign bit of the input (so −0 stays 0x80). MXFP4 and
compressed-tensors go through lookup tables built by that rounding (a (block offset, packed
byte) table; a 256-entry halving table); BF16 values are rounded one by one.

    python scripts/numpy_convert.py SRC OUT_FILE [--kind hf-mxfp4|hf-bf16|compressed-tensors-fp8]

The last stdout line is JSON: ``fp8_bytes``, ``bytes``, ``kind``, ``wall_s``, ``cpu_s`` (after imports).
"""

from __future__ import annotations

import argparse
import json
import os
import struct
import sys
import time

import numpy as np

NEURON_MAX = 240.0
STEP = 256  # source rows (output channels) encoded at a time
EXPERTS = "feed_forward.moe.expert_mlps.mlp_op."
HF_EXPERTS = "mlp.experts."
DTYPES = {"U8": (np.uint8, 1), "F8_E4M3": (np.uint8, 1), "BF16": (np.uint16, 2), "F16": (np.float16, 2),
          "F32": (np.float32, 4)}
FP4 = np.array([0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0, -0.0, -0.5, -1.0, -1.5, -2.0, -3.0, -4.0, -6.0])


def e4m3_magnitudes() -> np.ndarray:
    """float64 [121]: E4M3 magnitudes 0 … 240 in byte order (exponent bias 7, 3 mantissa bits)."""
    byte = np.arange(0x79)
    exponent, mantissa = byte >> 3, byte & 7
    return np.where(exponent == 0, mantissa / 512.0, (1.0 + mantissa / 8.0) * np.exp2(exponent - 7.0))


MAGNITUDES = e4m3_magnitudes()


def to_e4m3(values: np.ndarray) -> np.ndarray:
    """uint8 E4M3 bytes of ``values`` (float64 or float32, finite): nearest, ties to even, |v| ≤ 240."""
    x = np.asarray(values, dtype=np.float64)
    size = np.abs(x)
    _, exponent = np.frexp(size)  # size = f · 2^exponent, f in [0.5, 1)
    quantum = np.exp2(np.maximum(exponent - 1, -6) - 3.0)
    rounded = np.minimum(np.rint(size / quantum) * quantum, NEURON_MAX)
    return (np.searchsorted(MAGNITUDES, rounded) | (np.signbit(x).astype(np.int64) << 7)).astype(np.uint8)


def e4m3_values(q: np.ndarray) -> np.ndarray:
    """float64 values of OCP E4M3 bytes (range ±448; the NaN magnitude 0x7F must not occur)."""
    magnitude = (q & 0x7F).astype(np.int64)
    exponent, mantissa = magnitude >> 3, magnitude & 7
    size = np.where(exponent == 0, mantissa / 512.0, (1.0 + mantissa / 8.0) * np.exp2(exponent - 7.0))
    return np.where(q & 0x80, -size, size)


def bf16_floats(bits: np.ndarray) -> np.ndarray:
    return (bits.astype(np.uint32) << 16).view(np.float32)


class Safetensors:
    """The tensors of a source directory (an index, or one model.safetensors), memory-mapped."""

    def __init__(self, root: str) -> None:
        index = os.path.join(root, "model.safetensors.index.json")
        if os.path.exists(index):
            with open(index) as handle:
                files = sorted(set(json.load(handle)["weight_map"].values()))
        else:
            files = ["model.safetensors"]
        with open(os.path.join(root, "config.json")) as handle:
            self.config = json.load(handle)
        self.entries: dict[str, tuple[np.memmap, int, dict]] = {}
        for name in files:
            path = os.path.join(root, name)
            with open(path, "rb") as handle:
                (length,) = struct.unpack("<Q", handle.read(8))
                header = json.loads(handle.read(length))
            header.pop("__metadata__", None)
            mapped = np.memmap(path, dtype=np.uint8, mode="r")
            for tensor, entry in header.items():
                self.entries[tensor] = (mapped, 8 + length, entry)

    def array(self, name: str) -> np.ndarray:
        mapped, base, entry = self.entries[name]
        begin, end = entry["data_offsets"]
        return mapped[base + begin:base + end].view(DTYPES[entry["dtype"]][0]).reshape(entry["shape"])

    def dtype(self, name: str) -> str:
        return self.entries[name][2]["dtype"]

    def kind(self) -> str:
        names = set(self.entries)
        if f"model.layers.0.{HF_EXPERTS}gate_up_proj_blocks" in names:
            return "hf-mxfp4"
        if f"model.layers.0.{HF_EXPERTS}gate_up_proj" in names:
            return "hf-bf16"
        return "compressed-tensors-fp8"


class OneFile:
    """One safetensors file, its header planned from (name, dtype, shape) first, data written by offset."""

    def __init__(self, path: str, plan: list[tuple[str, str, tuple[int, ...]]]) -> None:
        header, position = {}, 0
        for name, dtype, shape in plan:
            size = DTYPES[dtype][1] * int(np.prod(shape))
            header[name] = {"dtype": dtype, "shape": list(shape), "data_offsets": [position, position + size]}
            position += size
        text = json.dumps(header, separators=(",", ":")).encode()
        text += b" " * (-len(text) % 8)
        self.start = {name: 8 + len(text) + entry["data_offsets"][0] for name, entry in header.items()}
        self.fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o644)
        os.pwrite(self.fd, struct.pack("<Q", len(text)) + text, 0)
        os.ftruncate(self.fd, 8 + len(text) + position)

    def write(self, name: str, data: np.ndarray, offset: int = 0) -> None:
        view = memoryview(np.ascontiguousarray(data)).cast("B")
        position = self.start[name] + offset
        while view.nbytes:
            done = os.pwrite(self.fd, view, position)
            view, position = view[done:], position + done

    def close(self) -> None:
        os.close(self.fd)


def chunked(values: np.ndarray) -> np.ndarray:
    """[..., 2I] gate/up interleaved (even = gate) → [..., 2I] as [gate | up] (format.md, Layout rules)."""
    return np.concatenate((values[..., 0::2], values[..., 1::2]), axis=-1)


# --------------------------------------------------------------------------- the three encoders


OFFSETS = (-24, 12)  # block offsets d tabulated; below, every code rounds to ±0; above, only zeros occur
_BYTES = np.arange(256)
# per (offset d, packed byte): its two E4M3 bytes as one little-endian uint16 (low nibble first)
PAIR_TABLE = np.stack([
    to_e4m3(FP4[_BYTES & 0x0F] * 2.0 ** d).astype(np.uint16) | (to_e4m3(FP4[_BYTES >> 4] * 2.0 ** d).astype(np.uint16) << 8)
    for d in range(OFFSETS[0], OFFSETS[1] + 1)]).astype("<u2")
TOP_CODE = np.maximum(_BYTES & 7, (_BYTES >> 4) & 7)  # the larger magnitude code of a packed byte


def mxfp4_expert(blocks: np.ndarray, scales: np.ndarray, gate_up: bool, out: np.ndarray) -> np.ndarray:
    """HF MXFP4 rows [R, K/32, 16] (+ E8M0 scales [R, K/32]) → ``out`` [K, R] input dim first
    (gate_up: rows interleaved, into [gate | up]); power-of-two channel scales 2^t putting each
    channel's largest value on exponent 7 (128 or 192), 1.0 for a zero channel. Returns the
    float32 scales in output order."""
    if scales.size and int(scales.max()) > 252:
        raise ValueError("an MXFP4 scale byte above 252 (NaN, or beyond float32)")
    rows = scales.shape[0]
    t = np.zeros(rows, dtype=np.int64)
    for first in range(0, rows, STEP):
        part_scales = scales[first:first + STEP].astype(np.int64)
        part = blocks[first:first + STEP]
        block_max = np.abs(FP4[TOP_CODE[part].max(axis=-1)]) * np.exp2(part_scales - 127.0)  # exact
        largest = block_max.max(axis=1)
        _, exponent = np.frexp(largest)
        channel = np.where(largest > 0, np.clip(exponent - 1 - 7, -126, 127), 0)
        t[first:first + STEP] = channel
        offsets = np.clip(part_scales - 127 - channel[:, None], *OFFSETS) - OFFSETS[0]
        encoded = PAIR_TABLE[offsets[..., None], part].view(np.uint8).reshape(part.shape[0], -1)
        if gate_up:
            half = out.shape[1] // 2
            out[:, first // 2:(first + part.shape[0]) // 2] = encoded[0::2].T
            out[:, half + first // 2:half + (first + part.shape[0]) // 2] = encoded[1::2].T
        else:
            out[:, first:first + part.shape[0]] = encoded.T
    scale = np.exp2(t.astype(np.float64)).astype(np.float32)
    return chunked(scale) if gate_up else scale


def bf16_expert(bits: np.ndarray, gate_up: bool, out: np.ndarray) -> np.ndarray:
    """A BF16 expert [in, out] (gate_up: columns interleaved) → ``out`` [in, out] FP8 with
    scales amax/240 in float32 (at least 2^-126, 1.0 for a zero channel); returns them in
    output order."""
    amax = np.zeros(bits.shape[1], dtype=np.float32)
    for first in range(0, bits.shape[0], STEP):
        np.maximum(amax, np.abs(bf16_floats(bits[first:first + STEP])).max(axis=0), out=amax)
    if not np.isfinite(amax).all():
        raise ValueError("a BF16 expert holds a NaN or an infinity")
    scale = np.where(amax > 0, np.maximum(amax / np.float32(NEURON_MAX), np.float32(2.0 ** -126)),
                     np.float32(1.0)).astype(np.float32)
    order = np.concatenate((np.arange(0, bits.shape[1], 2), np.arange(1, bits.shape[1], 2))) if gate_up else None
    for first in range(0, bits.shape[0], STEP):
        x = np.clip(bf16_floats(bits[first:first + STEP]) / scale, -NEURON_MAX, NEURON_MAX)
        encoded = to_e4m3(x)
        out[first:first + x.shape[0]] = encoded if order is None else encoded[:, order]
    return scale if order is None else scale[order]


def ct_into(q: np.ndarray, scale_bits: np.ndarray, out: np.ndarray) -> np.ndarray:
    """compressed-tensors rows (OCP E4M3 [R, K], BF16 channel scales [R, 1]) → ``out`` [K, R]:
    a row whose largest magnitude exceeds 240 is halved (each value rounded to nearest even) and
    its scale doubled. Returns the float32 scales."""
    rows = q.shape[0]
    scale = bf16_floats(scale_bits.reshape(-1)).astype(np.float32)
    result = np.empty(rows, dtype=np.float32)
    for first in range(0, rows, STEP):
        part = q[first:first + STEP]
        if ((part & 0x7F) == 0x7F).any():
            raise ValueError("a NaN byte in a compressed-tensors weight")
        magnitude = (part & 0x7F).max(axis=1)  # E4M3 bytes order like their magnitudes
        too_big = magnitude > 0x77  # format.md: an exponent field of all ones is beyond 240 (0x77)
        part_scale = scale[first:first + STEP]
        nonzero = magnitude > 0
        good = np.isfinite(part_scale) & (part_scale >= np.float32(2.0 ** -126))
        if not good[nonzero].all():
            raise ValueError("a weight_scale that is not a normal, finite, positive float32")
        encoded = part.copy()
        if too_big.any():
            encoded[too_big] = HALVED[part[too_big]]
        out[:, first:first + part.shape[0]] = encoded.T
        part_scale = np.where(good, part_scale, np.float32(1.0))
        result[first:first + part.shape[0]] = np.where(too_big, part_scale * np.float32(2.0), part_scale)
    return result


# every byte halved (NaN's magnitude, refused above, mapped anywhere)
HALVED = to_e4m3(np.where((_BYTES & 0x7F) == 0x7F, 0.0, e4m3_values(_BYTES.astype(np.uint8))) / 2.0)


# --------------------------------------------------------------------------- the converter


def convert(src: str, out_path: str, kind: str | None = None) -> dict:
    source = Safetensors(src)
    kind = kind or source.kind()
    config = source.config
    layers, experts = config["num_hidden_layers"], config["num_local_experts"]
    h, i = config["hidden_size"], config["intermediate_size"]
    others = sorted(name for name in source.entries if f".{HF_EXPERTS}" not in name)
    plan = [(name, source.dtype(name), tuple(source.entries[name][2]["shape"])) for name in others]
    for layer in range(layers):
        prefix = f"layers.{layer}.{EXPERTS}"
        plan += [(f"{prefix}gate_up_proj.weight", "F8_E4M3", (experts, h, 2 * i)),
                 (f"{prefix}gate_up_proj.scale", "F32", (experts, 1, 2 * i)),
                 (f"{prefix}gate_up_proj.bias", "BF16", (experts, 2 * i)),
                 (f"{prefix}down_proj.weight", "F8_E4M3", (experts, i, h)),
                 (f"{prefix}down_proj.scale", "F32", (experts, 1, h)),
                 (f"{prefix}down_proj.bias", "BF16", (experts, h))]
    output = OneFile(out_path, plan)
    for name in others:
        output.write(name, source.array(name))
    gate_up, down = np.zeros((h, 2 * i), dtype=np.uint8), np.zeros((i, h), dtype=np.uint8)
    for layer in range(layers):
        prefix, hf = f"layers.{layer}.{EXPERTS}", f"model.layers.{layer}.{HF_EXPERTS}"
        scales = {"gate_up": np.empty((experts, 1, 2 * i), np.float32), "down": np.empty((experts, 1, h), np.float32)}
        for expert in range(experts):
            if kind == "hf-mxfp4":
                scales["gate_up"][expert, 0] = mxfp4_expert(source.array(f"{hf}gate_up_proj_blocks")[expert],
                                                            source.array(f"{hf}gate_up_proj_scales")[expert], True, gate_up)
                scales["down"][expert, 0] = mxfp4_expert(source.array(f"{hf}down_proj_blocks")[expert],
                                                         source.array(f"{hf}down_proj_scales")[expert], False, down)
            elif kind == "hf-bf16":
                scales["gate_up"][expert, 0] = bf16_expert(source.array(f"{hf}gate_up_proj")[expert], True, gate_up)
                scales["down"][expert, 0] = bf16_expert(source.array(f"{hf}down_proj")[expert], False, down)
            else:
                linear = f"{hf}{expert}."
                gate = ct_into(source.array(f"{linear}gate_proj.weight"), source.array(f"{linear}gate_proj.weight_scale"),
                               gate_up[:, :i])
                up = ct_into(source.array(f"{linear}up_proj.weight"), source.array(f"{linear}up_proj.weight_scale"),
                             gate_up[:, i:])
                scales["gate_up"][expert, 0] = np.concatenate((gate, up))
                scales["down"][expert, 0] = ct_into(source.array(f"{linear}down_proj.weight"),
                                                    source.array(f"{linear}down_proj.weight_scale"), down)
            output.write(f"{prefix}gate_up_proj.weight", gate_up, expert * gate_up.size)
            output.write(f"{prefix}down_proj.weight", down, expert * down.size)
        if kind == "compressed-tensors-fp8":
            biases = [(np.concatenate([source.array(f"{hf}{e}.gate_proj.bias"), source.array(f"{hf}{e}.up_proj.bias")]),
                       source.array(f"{hf}{e}.down_proj.bias")) for e in range(experts)]
            gate_up_bias, down_bias = np.stack([b[0] for b in biases]), np.stack([b[1] for b in biases])
        else:
            gate_up_bias, down_bias = chunked(source.array(f"{hf}gate_up_proj_bias")), source.array(f"{hf}down_proj_bias")
        output.write(f"{prefix}gate_up_proj.scale", scales["gate_up"])
        output.write(f"{prefix}down_proj.scale", scales["down"])
        output.write(f"{prefix}gate_up_proj.bias", gate_up_bias)
        output.write(f"{prefix}down_proj.bias", down_bias)
    output.close()
    return {"fp8_bytes": layers * experts * (gate_up.size + down.size), "bytes": os.path.getsize(out_path), "kind": kind}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("src")
    parser.add_argument("out_file")
    parser.add_argument("--kind", choices=("hf-mxfp4", "hf-bf16", "compressed-tensors-fp8"))
    args = parser.parse_args()
    wall, cpu = time.perf_counter(), os.times()
    result = convert(args.src, args.out_file, args.kind)
    done = os.times()
    result.update(wall_s=time.perf_counter() - wall, cpu_s=done.user + done.system - cpu.user - cpu.system)
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
