"""An independent, plain vectorized numpy encoder of GPT-OSS experts into the normalized FP8
layout: the baseline ``bench_convert.py --numpy`` times the converter against.

Written from docs/format.md (expert tensors input-dim first, gate_up ``[gate | pad | up | pad]``,
E4M3 bytes within ±240 times a float32 per-output-channel scale, padding zero, scale padding 1.0)
and docs/converting.md's rule for each source kind (Exactness); it shares no code with the package (numpy only: its
own safetensors reader, its own E4M3 encoder and decoder, its own layout). One expert at a time:

  hf-bf16          scale = amax/240 per output channel (at least 2^-126; 1.0 for an all-zero
                   channel), q = E4M3(clip(w / scale, ±240)), round to nearest even
  hf-mxfp4         values FP4 × 2^(scale byte − 127); per channel the power of two 2^t that puts
                   the channel's largest value on E4M3 exponent 7 (t in [−126, 127], 0 for an
                   all-zero channel); q = E4M3(value / 2^t)
  compressed-tensors OCP E4M3 rows whose magnitude exceeds 240 are halved (value / 2, rounded to
                   E4M3) with their scale doubled; the other rows' bytes are kept
"""

from __future__ import annotations

import json
import os
from typing import Any

import numpy as np

__all__ = ["Encoded", "SafetensorsFile", "e4m3_bytes", "e4m3_values", "encode_expert"]

FP8_MAX = np.float32(240.0)
FP4 = np.array([0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0, -0.0, -0.5, -1.0, -1.5, -2.0, -3.0, -4.0, -6.0], np.float32)
_DTYPES = {"BF16": np.uint16, "F32": np.float32, "U8": np.uint8, "F8_E4M3": np.uint8, "F16": np.float16}
Encoded = tuple[np.ndarray, np.ndarray]  # (uint8 [in', out'], float32 scale [out'])
CHUNK_ROWS = 64  # rows of a 2880-wide expert at a time: the passes stay in cache


class SafetensorsFile:
    """The tensors of one .safetensors file as numpy arrays over a read-only memory map."""

    def __init__(self, path: str) -> None:
        with open(path, "rb") as handle:
            size = int.from_bytes(handle.read(8), "little")
            self.header: dict[str, Any] = json.loads(handle.read(size))
        self.base = 8 + size
        self.map = np.memmap(path, dtype=np.uint8, mode="r")

    def get(self, name: str) -> np.ndarray:
        entry = self.header[name]
        start, stop = entry["data_offsets"]
        return self.map[self.base + start:self.base + stop].view(_DTYPES[entry["dtype"]]).reshape(entry["shape"])


def _float32(values: np.ndarray) -> np.ndarray:
    """BF16 bits (uint16) or any float → float32."""
    if values.dtype == np.uint16:
        return (values.astype(np.uint32) << 16).view(np.float32)
    return values.astype(np.float32)


def e4m3_bytes(y: np.ndarray) -> np.ndarray:
    """uint8 E4M3 bytes of float32 ``y`` (|y| ≤ 448), round to nearest even; the sign kept on zero."""
    a = np.abs(y)
    bits = a.view(np.uint32)
    rounded = (bits + np.uint32(0x7FFFF) + ((bits >> np.uint32(20)) & np.uint32(1))) >> np.uint32(20)
    normal = rounded.view(np.int32) - ((127 - 7) << 3)  # exponent field and 3 mantissa bits, rebiased
    # below 2^-6: multiples of 2^-9, rounded to nearest even by adding 1.5·2^14 (whose float32 ulp is 2^-9)
    subnormal = (a + _SUBNORMAL_MAGIC).view(np.int32) - _SUBNORMAL_MAGIC.view(np.int32)
    code = np.where(a < np.float32(2.0**-6), subnormal, normal).astype(np.uint8)
    return code | (y.view(np.uint32) >> np.uint32(24)).astype(np.uint8) & np.uint8(0x80)


_SUBNORMAL_MAGIC = np.float32(1.5 * 2.0**14)


def _e4m3_table() -> np.ndarray:
    codes = np.arange(256)
    exponent, mantissa = (codes >> 3) & 0x0F, codes & 0x07
    magnitude = np.where(exponent == 0, mantissa * 2.0**-9, (1 + mantissa / 8) * 2.0 ** (exponent - 7.0))
    magnitude = np.where((codes & 0x7F) == 0x7F, np.nan, magnitude)
    return np.where(codes & 0x80, -magnitude, magnitude).astype(np.float32)


_E4M3 = _e4m3_table()


def e4m3_values(q: np.ndarray) -> np.ndarray:
    """float32 values of E4M3 bytes."""
    return _E4M3[q]


def _place(rows_out: np.ndarray, padded: tuple[int, int], interleaved_half: int | None) -> np.ndarray:
    """[out, in] channel rows → [in', out'] (gate_up: rows interleaved gate/up → [gate | pad | up | pad])."""
    out = np.zeros(padded, np.uint8)
    if interleaved_half is None:
        out[: rows_out.shape[1], : rows_out.shape[0]] = rows_out.T
    else:
        half = rows_out.shape[0] // 2
        out[: rows_out.shape[1], :half] = rows_out[0::2].T
        out[: rows_out.shape[1], interleaved_half:interleaved_half + half] = rows_out[1::2].T
    return out


def _scales(scale: np.ndarray, width: int, interleaved_half: int | None) -> np.ndarray:
    out = np.ones(width, np.float32)
    if interleaved_half is None:
        out[: scale.size] = scale
    else:
        out[: scale.size // 2] = scale[0::2]
        out[interleaved_half:interleaved_half + scale.size // 2] = scale[1::2]
    return out


def _pow2(exponents: np.ndarray) -> np.ndarray:
    """float32 2^e, exactly (float32's normal range through the bits; below it by ldexp)."""
    e = exponents.astype(np.int32)
    normal = ((np.clip(e, -126, 127) + 127).astype(np.uint32) << np.uint32(23)).view(np.float32)
    return np.where(e >= -126, normal, np.ldexp(np.float32(1.0), e).astype(np.float32))


def _bf16(weight: np.ndarray, padded: tuple[int, int], half: int | None) -> Encoded:
    amax = np.zeros(weight.shape[1], np.float32)
    for start in range(0, weight.shape[0], CHUNK_ROWS):  # [in, out] as stored: one channel a column
        np.maximum(amax, np.abs(_float32(weight[start:start + CHUNK_ROWS])).max(axis=0), out=amax)
    scale = np.where(amax > 0, np.maximum(amax / FP8_MAX, np.float32(2.0**-126)), np.float32(1.0)).astype(np.float32)
    q = np.empty(weight.shape, np.uint8)
    for start in range(0, weight.shape[0], CHUNK_ROWS):
        w = _float32(weight[start:start + CHUNK_ROWS])
        q[start:start + CHUNK_ROWS] = e4m3_bytes(np.clip(w / scale, -FP8_MAX, FP8_MAX))
    return _place(q.T, padded, half), _scales(scale, padded[1], half)


# each packed byte's two values (low nibble first) as one 8-byte item, so a take() decodes both
_FP4_PAIRS = np.ascontiguousarray(np.stack((FP4[np.arange(256) & 0x0F], FP4[np.arange(256) >> 4]), axis=-1)
                                  ).view(np.uint64).reshape(256)


def _mxfp4(blocks: np.ndarray, block_scales: np.ndarray, padded: tuple[int, int], half: int | None) -> Encoded:
    rows = blocks.shape[0]
    q = np.empty((rows, blocks.shape[1] * 32), np.uint8)
    t = np.empty(rows, np.int32)
    for start in range(0, rows, CHUNK_ROWS // 4):
        stop = min(rows, start + CHUNK_ROWS // 4)
        codes = np.take(_FP4_PAIRS, blocks[start:stop]).view(np.float32).reshape(stop - start, -1, 32)
        values = (codes * _pow2(block_scales[start:stop].astype(np.int32) - 127)[..., None]).reshape(stop - start, -1)
        largest = np.abs(values).max(axis=1)
        _, exponent = np.frexp(largest)  # largest = m · 2^exponent, m in [0.5, 1)
        t[start:stop] = np.where(largest > 0, np.clip(exponent - 1 - 7, -126, 127), 0)
        q[start:stop] = e4m3_bytes(values * _pow2(-t[start:stop])[:, None])
    return _place(q, padded, half), _scales(_pow2(t), padded[1], half)


def _ct(q: np.ndarray, scale: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """One OCP E4M3 linear [out, in] and its scale [out, 1] → (E4M3 within ±240, float32 scale [out])."""
    s = _float32(scale.reshape(-1)).copy()
    beyond = (q & 0x7F).max(axis=1) > 0x77  # magnitudes above 240
    if beyond.any():
        q = q.copy()
        q[beyond] = e4m3_bytes(e4m3_values(q[beyond]) / np.float32(2.0))
        s[beyond] *= np.float32(2.0)
    return q, s


def encode_expert(kind: str, proj: str, tensors: dict[str, np.ndarray], padded: tuple[int, int],
                  padded_i: int) -> Encoded:
    """One expert's (FP8 bytes [in', out'], scales [out']) of ``proj`` (``gate_up`` or ``down``)
    from its source ``tensors`` (hf-bf16: ``weight`` [in, out]; hf-mxfp4: ``blocks``, ``scales``;
    compressed-tensors: ``gate``, ``gate_scale``, ``up``, ``up_scale`` or ``down``, ``down_scale``)."""
    half = padded_i if proj == "gate_up" else None
    if kind == "hf-bf16":  # [H, 2I] (gate/up interleaved on the columns) or [I, H]
        return _bf16(tensors["weight"], padded, half)
    if kind == "hf-mxfp4":
        return _mxfp4(tensors["blocks"], tensors["scales"], padded, half)
    if half is None:
        q, s = _ct(tensors["down"], tensors["down_scale"])
        return _place(q, padded, None), _scales(s, padded[1], None)
    gate, gate_s = _ct(tensors["gate"], tensors["gate_scale"])
    up, up_s = _ct(tensors["up"], tensors["up_scale"])
    rows = np.empty((2 * gate.shape[0], gate.shape[1]), np.uint8)  # interleave: even = gate, odd = up
    rows[0::2], rows[1::2] = gate, up
    scales = np.empty(2 * gate_s.size, np.float32)
    scales[0::2], scales[1::2] = gate_s, up_s
    return _place(rows, padded, half), _scales(scales, padded[1], half)


if __name__ == "__main__":  # a quick self-test of the E4M3 encoder against the table
    every = _E4M3[np.isfinite(_E4M3)]
    assert np.array_equal(e4m3_bytes(every), np.arange(256, dtype=np.uint8)[np.isfinite(_E4M3)])
    print("ok", os.path.basename(__file__))
