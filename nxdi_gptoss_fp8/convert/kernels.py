"""The compiled one-pass encoders (``_kernels.c``), when the install built them.

Each source kind's expert goes through one C loop in cache-sized tiles — decode, channel
exponent or amax, scaling, rounding to E4M3, the transpose into NxDI's layout and the exactness
statistics — instead of a dozen torch passes. Optional: ``pip install`` compiles the extension
where a C compiler exists; without it (or with ``NXDI_GPTOSS_FP8_KERNELS=torch``) ``AVAILABLE``
is False and the kinds run their torch path, which is also what the tests hold these functions
to, byte for byte. Every table that decides a value is built here from the torch path's own
functions (compressed-tensors' halving alone is integer arithmetic in C too, the torch path's
formula, checked on every byte by the tests); the C file holds loops and layout otherwise. Loaded through ctypes, which releases the
GIL for each call, so the compute lanes run in parallel.
"""

from __future__ import annotations

import ctypes
import importlib.machinery
import logging
import os
from functools import cache
from typing import Any

import torch

from ..format import FP8_MAX
from . import mxfp4
from .fp8 import FP8_DTYPE

__all__ = ["AVAILABLE", "ENV", "bf16_amax", "bf16_encode", "ct_rows", "gate_up_destinations", "mxfp4_expert"]

ENV = "NXDI_GPTOSS_FP8_KERNELS"  # "torch": never load the compiled encoders; "compiled" or unset: where built


def _load() -> Any:
    choice = os.environ.get(ENV, "").strip().lower()
    if choice == "torch":
        return None
    if choice not in ("", "compiled"):
        logging.getLogger(__name__).warning("%s=%r is neither 'torch' nor 'compiled': the compiled encoders run where "
                                            "built", ENV, os.environ[ENV])
    here = os.path.dirname(os.path.abspath(__file__))
    for suffix in importlib.machinery.EXTENSION_SUFFIXES:
        path = os.path.join(here, f"_kernels{suffix}")
        if not os.path.isfile(path):
            continue
        try:
            library = ctypes.CDLL(path)
        except OSError:
            continue
        p, i64, i32 = ctypes.c_void_p, ctypes.c_int64, ctypes.c_int32
        library.nxg_mxfp4_expert.argtypes = (p, p, i64, i64, p, i32, i32, i32, i32, p, p, i32, i32, p, i32, i32, i32,
                                             p, i64, p, p, p, p)
        library.nxg_mxfp4_expert.restype = i64
        library.nxg_ct_rows.argtypes = (p, i64, i64, i32, p, i64, p, p, p)
        library.nxg_ct_rows.restype = None
        library.nxg_bf16_amax.argtypes = (p, i64, i64, p)
        library.nxg_bf16_amax.restype = None
        library.nxg_bf16_encode.argtypes = (p, i64, i64, p, ctypes.c_float, p, p, p, i64, p, p, p, p)
        library.nxg_bf16_encode.restype = None
        return library
    return None


_LIB = _load()
AVAILABLE = _LIB is not None


def _ptr(tensor: torch.Tensor) -> int:
    return tensor.data_ptr()


@cache
def _mxfp4_statistics() -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    codes, rel = mxfp4.exactness_table()
    return codes.contiguous(), rel, mxfp4._CODE_EXPONENT.to(torch.int32).contiguous()


@cache
def _e4m3_tables() -> tuple[torch.Tensor, torch.Tensor]:
    """(uint8 [2^17]: the E4M3 byte torch rounds a float32 within ±FP8_MAX to, keyed by its top
    16 bits and whether its low 16 bits are non-zero — every E4M3 rounding boundary has at most 5
    significant bits, so it never falls inside one key's interval; float32 [256]: each byte's value)."""
    keys = torch.arange(1 << 17, dtype=torch.int64)
    bits = ((keys & 0xFFFF) << 16) | (keys >> 16)
    values = bits.to(torch.int32).view(torch.float32).clamp(-FP8_MAX, FP8_MAX)
    rounded = values.to(FP8_DTYPE).view(torch.uint8).contiguous()
    return rounded, torch.arange(256, dtype=torch.int32).to(torch.uint8).view(FP8_DTYPE).float().contiguous()


def gate_up_destinations(rows: int, padded_half: int, first: int = 0) -> torch.Tensor:
    """int64 [rows]: the output column of fused gate_up rows ``first…`` (interleaved: even = gate
    into the first half, odd = up into the second, which starts at ``padded_half``)."""
    fused = torch.arange(first, first + rows, dtype=torch.int64)
    return (fused % 2) * padded_half + fused // 2


def _contiguous_u8(tensor: torch.Tensor) -> torch.Tensor:
    return tensor.contiguous().view(torch.uint8)


def _check_target(out: torch.Tensor, rows: int, dest: torch.Tensor, count: int) -> None:
    """The C loops write ``out[k, dest[j]]`` for k < ``rows``, j < ``count``: refuse, before any
    byte is written, a target they would overrun (a caller's bug, never data)."""
    if (out.dtype != torch.uint8 or out.dim() != 2 or out.stride(1) != 1 or out.shape[0] < rows
            or dest.dtype != torch.int64 or dest.shape != (count,)
            or (count and (int(dest.min()) < 0 or int(dest.max()) >= out.shape[1]))):
        raise ValueError(f"output buffer {list(out.shape)} (strides {list(out.stride())}) cannot take {rows} rows "
                         f"into columns {dest.shape}")


def mxfp4_expert(blocks: torch.Tensor, scales: torch.Tensor, out: torch.Tensor,
                 dest: torch.Tensor) -> tuple[torch.Tensor, mxfp4.Exactness]:
    """One MXFP4 expert (blocks [rows, K/32, 16], scales [rows, K/32], every scale byte at most
    ``MAX_SCALE_BYTE``) into ``out`` [K', out'] (source row r into column ``dest[r]``): (its
    channel exponents t, int32 [rows]; its exactness), as the torch path computes them."""
    blocks, scales, dest = _contiguous_u8(blocks), _contiguous_u8(scales), dest.contiguous()
    rows, groups = scales.shape
    if tuple(blocks.shape) != (rows, groups, mxfp4.BLOCK_SIZE // 2):
        raise ValueError(f"blocks {list(blocks.shape)} do not match scales {list(scales.shape)}")
    _check_target(out, groups * mxfp4.BLOCK_SIZE, dest, rows)
    byte_table = mxfp4._BYTE_TABLE.contiguous()  # the torch path's own table, whatever it is now
    codes, rel, code_exponent = _mxfp4_statistics()
    t = torch.empty(rows, dtype=torch.int32)
    counts = torch.zeros(2, dtype=torch.int64)
    worst = torch.zeros(1, dtype=torch.float64)
    _LIB.nxg_mxfp4_expert(
        _ptr(blocks), _ptr(scales), rows, groups, _ptr(byte_table), mxfp4.OFFSET_MIN, mxfp4.OFFSET_MAX,
        mxfp4.EXACT_OFFSET_MIN, mxfp4.EXACT_OFFSET_MAX, _ptr(codes), _ptr(rel), mxfp4.STAT_OFFSET_MIN,
        mxfp4.STAT_OFFSET_MAX, _ptr(code_exponent), mxfp4.TOP_EXPONENT, mxfp4.MIN_SCALE_EXPONENT,
        mxfp4.MAX_SCALE_EXPONENT, _ptr(out), out.stride(0), _ptr(dest), _ptr(t), _ptr(counts),
        _ptr(worst))
    exactness = mxfp4.Exactness(values=blocks.numel() * 2, inexact=int(counts[0]), flushed_to_zero=int(counts[1]),
                                max_rel_error=float(worst[0]))
    return t, exactness


def ct_rows(q: torch.Tensor, neuron_max: int, out: torch.Tensor, dest: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """OCP E4M3 rows ``q`` [rows, K] into ``out`` [K', out'] (row r into column ``dest[r]``), a
    row whose largest magnitude byte is above ``neuron_max`` halved (the integer ops of
    ``kinds.compressed_tensors``, vectorized): (each row's largest magnitude byte, uint8 [rows];
    int64 [16]: how many bytes of each odd magnitude below 16, the ones halving rounds, the halved
    rows hold)."""
    q, dest = _contiguous_u8(q), dest.contiguous()
    rows, cols = q.shape
    _check_target(out, cols, dest, rows)
    row_max = torch.empty(rows, dtype=torch.uint8)
    histogram = torch.zeros(16, dtype=torch.int64)
    _LIB.nxg_ct_rows(_ptr(q), rows, cols, neuron_max, _ptr(out), out.stride(0),
                     _ptr(dest), _ptr(row_max), _ptr(histogram))
    return row_max, histogram


def bf16_amax(weight: torch.Tensor) -> torch.Tensor:
    """int16 [cols]: the bits of each column's largest magnitude in BF16 ``weight`` [rows, cols]."""
    weight = weight.contiguous()
    amax = torch.empty(weight.shape[1], dtype=torch.int16)
    _LIB.nxg_bf16_amax(_ptr(weight), weight.shape[0], weight.shape[1], _ptr(amax))
    return amax


def bf16_encode(weight: torch.Tensor, scale: torch.Tensor, out: torch.Tensor,
                dest: torch.Tensor) -> tuple[int, int, int, float, float]:
    """BF16 ``weight`` [rows, cols] quantized with ``scale`` [cols] into ``out`` rows (column c
    into column ``dest[c]``): (non-zero round trips, inexact, non-zero source values, worst and
    summed relative error of the values kept non-zero) — ``fp8.DenseEncoder``'s statistics."""
    weight, scale, dest = weight.contiguous(), scale.to(torch.float32).contiguous(), dest.contiguous()
    if weight.dtype != torch.bfloat16 or weight.dim() != 2 or scale.shape != (weight.shape[1],):
        raise ValueError(f"expected BF16 [rows, cols] and float32 [cols] scales, got {weight.dtype} "
                         f"{list(weight.shape)} and {list(scale.shape)}")
    _check_target(out, weight.shape[0], dest, weight.shape[1])
    e4m3_of, e4m3_value = _e4m3_tables()
    counts = torch.zeros(3, dtype=torch.int64)
    worst = torch.zeros(1, dtype=torch.float32)
    total = torch.zeros(1, dtype=torch.float64)
    _LIB.nxg_bf16_encode(_ptr(weight), weight.shape[0], weight.shape[1], _ptr(scale), FP8_MAX, _ptr(e4m3_of),
                         _ptr(e4m3_value), _ptr(out), out.stride(0), _ptr(dest), _ptr(counts),
                         _ptr(worst), _ptr(total))
    return int(counts[0]), int(counts[1]), int(counts[2]), float(worst[0]), float(total[0])
