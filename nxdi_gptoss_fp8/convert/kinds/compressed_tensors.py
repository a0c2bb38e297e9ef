"""compressed-tensors FP8 sources (llm-compressor's FP8_DYNAMIC scheme on linearized experts).

llm-compressor quantizes only ``nn.Linear``, so it splits each layer's fused experts into one
set of linear layers per expert before quantizing:
``model.layers.L.mlp.experts.E.{gate,up,down}_proj.{weight F8_E4M3 [out, in], weight_scale
[out, 1], bias [out]}`` (``…mlp.experts.experts.E.…`` in llm-compressor 0.10–0.11). Weights are
OCP E4M3 (±448) with one static scale per output channel (``amax / 448``, stored in the model
dtype, usually BF16); activations are quantized dynamically at run time (no ``input_scale``).
Everything else is BF16 under its HF name.

Conversion: every row whose largest value exceeds Neuron's ±240 is halved and its scale
doubled — a power of two, so every value E4M3 can still hold stays exact; only values in the
bottom binade (below 2^-5 before halving) can round, and those are counted with their worst
error. A NaN byte, a non-finite bias or a ``weight_scale`` that is not a normal, finite, positive
float32 (a subnormal one included) on a row with values is refused. The split of the fused gate_up into ``gate_proj``/``up_proj`` depends on the
llm-compressor version (even/odd columns, or halves in 0.12.0–0.13.0) and is decided from
the names and ``transformers_version`` where that is possible, otherwise stated by the user
(``gate_up_split``). Anything else compressed-tensors can express is refused, never guessed.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

import torch

from ... import format as fmt
from ... import other_formats
from ...errors import ConversionError
from ...safeio.safetensors_header import TensorInfo
from .. import kernels
from ..fp8 import FP8_DTYPE, MIN_NORMAL_SCALE, fp8_values
from ..layout import TILE as _TILE_ROWS
from ..layout import chunk_halves, chunk_interleaved, pad_to, place_down, place_gate_up
from ..mxfp4 import Exactness
from ..output import CHUNK_BYTES, ExpertStats, Lane, Output, Workspace, put_biases, require_finite, stream_experts
from ..source import EXPERTS, FLOAT_DTYPES, HF_PREFIX, SourceReader, SourceSpec, non_expert_specs
from .base import ExpertRows

__all__ = [
    "FLOAT_QUANTIZED", "GATE_UP_SPLITS", "NAME", "QUANT_METHOD", "SPLIT_HALVES", "SPLIT_HELP", "SPLIT_INTERLEAVED",
    "CompressedTensorsFp8", "expert_prefix",
]

NAME = "compressed-tensors-fp8"
QUANT_METHOD = "compressed-tensors"
FLOAT_QUANTIZED = "float-quantized"
SPLIT_INTERLEAVED = other_formats.CT_SPLIT_INTERLEAVED
SPLIT_HALVES = other_formats.CT_SPLIT_HALVES
GATE_UP_SPLITS = other_formats.CT_GATE_UP_SPLITS
SPLIT_HELP = other_formats.CT_SPLIT_HELP
_PROJECTIONS = ("gate_proj", "up_proj", "down_proj")
_WEIGHTS = {"num_bits": 8, "type": "float", "strategy": "channel", "symmetric": True, "dynamic": False}
_ACTIVATIONS = {"num_bits": 8, "type": "float", "strategy": "token", "dynamic": True}
_UNSET = ("group_size", "block_structure", "actorder")
_MAG = 0x7F
_FP8_NAN = 0x7F
_NEURON_MAX_BYTE = 0x77  # 240 = 1.875 × 2^7: the largest E4M3 magnitude Neuron accepts


def expert_prefix(layer: int, expert: int, nested: bool) -> str:
    """``model.layers.L.mlp.experts.E.`` (``…experts.experts.E.`` when ``nested``)."""
    return f"{HF_PREFIX}{fmt.layer_prefix(layer)}{EXPERTS}{'experts.' if nested else ''}{expert}."


# Halving an E4M3 byte with integer ops: from exponent field 2 up, the exponent field minus one
# (subtract 0x08), always exact; below (magnitude m < 0x10, value m · 2^-9, linear across the
# subnormal and the first normal binade) the byte m/2 rounded to nearest even, inexact for odd m
# (the tests check this against float arithmetic for every byte)
_LOW_MAGNITUDE = 0x0F
_BOTTOM_LIMIT = 0x10


def _rounded_rel_errors() -> torch.Tensor:
    """float64 [16]: the relative error of halving (and doubling back) the bottom-binade
    magnitude m (0 for m = 0)."""
    values = torch.arange(16, dtype=torch.int32).to(torch.uint8).view(FP8_DTYPE).double()
    halves = (values.float() * 0.5).to(FP8_DTYPE).double()
    errors = (halves * 2 - values).abs() / values
    errors[0] = 0.0
    return errors


_ROUNDED_REL_ERROR = _rounded_rel_errors()
_CHUNK_BYTES = 1 << 18


class CompressedTensorsFp8:
    """The compressed-tensors FP8 source kind (see the module docstring)."""

    name = NAME
    description = "compressed-tensors FP8 (model.layers.N.mlp.experts.E.gate_proj.weight + weight_scale)"

    def recognizes(self, names: set[str]) -> bool:
        return any(f"{expert_prefix(0, 0, nested)}gate_proj.weight" in names for nested in (False, True))

    def resolve(self, config: dict[str, Any], dims: fmt.ModelDims, tensors: dict[str, tuple[str, TensorInfo]],
                config_path: str, options: dict[str, Any]) -> dict[str, Any]:
        where = f"{config_path}: quantization_config"
        quant = config.get("quantization_config")
        method = quant.get("quant_method") if isinstance(quant, dict) else None
        if not isinstance(quant, dict) or method != QUANT_METHOD:
            raise ConversionError(
                f"{config_path}: tensors are per-expert linear layers (llm-compressor names) but "
                f"quantization_config.quant_method is {method!r}, not {QUANT_METHOD!r}: config and weights "
                "come from different sets")
        _check_scheme(quant, where)
        nested = f"{expert_prefix(0, 0, True)}gate_proj.weight" in tensors
        _check_ignore(quant.get("ignore"), dims, nested, where)
        _check_tensor_kinds(tensors, dims, nested)
        split = _resolve_split(config, nested, options.get("gate_up_split"), config_path)
        return {"gate_up_split": split, "expert_names": f"{EXPERTS}{'experts.' if nested else ''}E"}

    def specs(self, dims: fmt.ModelDims, options: dict[str, Any]) -> dict[str, SourceSpec]:
        specs = non_expert_specs(dims)
        nested = options["expert_names"].startswith(f"{EXPERTS}experts.")
        h, i = dims.hidden_size, dims.intermediate_size
        shapes = {"gate_proj": (i, h), "up_proj": (i, h), "down_proj": (h, i)}
        for layer in range(dims.num_hidden_layers):
            for expert in range(dims.num_local_experts):
                prefix = expert_prefix(layer, expert, nested)
                for proj, (rows, cols) in shapes.items():
                    for suffix, shape, dtypes in (("weight", (rows, cols), (fmt.F8_E4M3,)),
                                                  ("weight_scale", (rows, 1), FLOAT_DTYPES),
                                                  ("bias", (rows,), FLOAT_DTYPES)):
                        name = f"{prefix}{proj}.{suffix}"
                        specs[name] = SourceSpec(name, shape, dtypes)
        return specs

    def convert_experts(self, reader: SourceReader, layer: int, out: Output, layout: fmt.Layout,
                        workspace: Workspace) -> list[ExpertStats]:
        put_biases(out, layer, *self.reference_biases(reader, layer), layout)
        return [_projection(reader, layer, proj, out, layout, workspace) for proj in (fmt.GATE_UP, fmt.DOWN)]

    def reference_rows(self, reader: SourceReader, layer: int, proj: str, expert: int) -> ExpertRows:
        """``q × weight_scale``: exact in float32 for BF16/F16 scales (4 × 8 or 11 significant
        bits), float64 for F32 ones; gate_up rows re-interleaved according to the split."""
        prefix = _prefix(reader, layer, expert)

        def part(name: str) -> tuple[torch.Tensor, torch.Tensor]:
            return reader.get(f"{prefix}{name}.weight"), reader.get(f"{prefix}{name}.weight_scale")

        if proj == fmt.DOWN:
            q, scale = part("down_proj")
        else:
            (gate, gate_scale), (up, up_scale) = part("gate_proj"), part("up_proj")
            if reader.source.options["gate_up_split"] == SPLIT_HALVES:  # gate_proj, up_proj: the fused rows
                q, scale = torch.cat((gate, up)), torch.cat((gate_scale, up_scale))
            else:
                q = torch.stack((gate, up), dim=1).reshape(2 * gate.shape[0], gate.shape[1])
                scale = torch.stack((gate_scale, up_scale), dim=1).reshape(2 * gate.shape[0], 1)
        return _ScaledRows(q, scale)

    def reference_biases(self, reader: SourceReader, layer: int) -> tuple[torch.Tensor, torch.Tensor]:
        experts = reader.source.dims.num_local_experts
        biases = {proj: torch.stack([_finite(reader, f"{_prefix(reader, layer, e)}{proj}.bias").to(torch.bfloat16)
                                     for e in range(experts)]) for proj in _PROJECTIONS}
        gate, up = biases["gate_proj"], biases["up_proj"]
        if reader.source.options["gate_up_split"] == SPLIT_HALVES:
            gate_up = torch.cat((gate, up), dim=1)
        else:
            gate_up = torch.stack((gate, up), dim=2).reshape(experts, 2 * gate.shape[1])
        return gate_up, biases["down_proj"]


class _ScaledRows(ExpertRows):
    """compressed-tensors rows: their FP8 times their channel scale."""

    def __init__(self, q: torch.Tensor, scale: torch.Tensor) -> None:
        super().__init__(q, tuple(q.shape), torch.float64 if scale.dtype == torch.float32 else torch.float32)
        self.scale = scale.to(self.dtype)

    def fp8_rows(self, start: int, stop: int, step: int = 1) -> tuple[torch.Tensor, torch.Tensor] | None:
        if self.dtype != torch.float32:  # F32 scales: products judged in float64
            return None
        return self.raw[start:stop:step].view(torch.uint8), self.scale[start:stop:step].reshape(-1)

    def decode(self, raw_rows: torch.Tensor, index: slice | torch.Tensor) -> torch.Tensor:
        values = fp8_values(raw_rows) if self.dtype == torch.float32 else raw_rows.to(self.dtype)
        return values.mul_(self.scale[index])


def _finite(reader: SourceReader, name: str) -> torch.Tensor:
    values = reader.get(name)
    require_finite(values, reader.source.tensors[name][0], name)
    return values


def _prefix(reader: SourceReader, layer: int, expert: int) -> str:
    return expert_prefix(layer, expert, reader.source.options["expert_names"].startswith(f"{EXPERTS}experts."))


# --------------------------------------------------------------------------- what is refused


def _refuse(subject: str, what: str) -> ConversionError:
    return ConversionError(f"{subject} {what}; only FP8_DYNAMIC (float-quantized, 8-bit float weights with "
                           "static per-channel scales, dynamic or no activation quantization) converts")


def _check_args(args: Any, wanted: dict[str, Any], where: str) -> None:
    if not isinstance(args, dict):
        raise _refuse(where, f"is {args!r}, not an object")
    for key, value in wanted.items():
        if args.get(key) != value:
            raise _refuse(f"{where}.{key}", f"is {args.get(key)!r}, not {value!r}")
    for key in _UNSET:
        if args.get(key) not in (None, False):
            raise _refuse(f"{where}.{key}", f"is {args.get(key)!r}")


def _check_scheme(quant: dict[str, Any], where: str) -> None:
    """The whole quantization_config must be FP8_DYNAMIC-shaped."""
    if quant.get("format") != FLOAT_QUANTIZED:
        raise _refuse(f"{where}.format", f"is {quant.get('format')!r}, not {FLOAT_QUANTIZED!r}")
    status = quant.get("quantization_status", "compressed")
    if status != "compressed":
        raise _refuse(f"{where}.quantization_status", f"is {status!r}: the weights were not saved compressed")
    for key in ("sparsity_config", "transform_config", "kv_cache_scheme"):
        if quant.get(key):
            raise _refuse(f"{where}.{key}", "is set (sparsity, transforms and KV-cache quantization change "
                                            "what the tensors mean)")
    groups = quant.get("config_groups")
    if not isinstance(groups, dict) or not groups:
        raise _refuse(f"{where}.config_groups", "is missing or empty")
    for group_name, group in groups.items():
        at = f"{where}.config_groups.{group_name}"
        if not isinstance(group, dict):
            raise _refuse(at, "is not an object")
        if group.get("format") not in (None, FLOAT_QUANTIZED):
            raise _refuse(f"{at}.format", f"is {group.get('format')!r}")
        _check_args(group.get("weights"), _WEIGHTS, f"{at}.weights")
        activations = group.get("input_activations")
        if activations is not None:
            if isinstance(activations, dict) and activations.get("dynamic") is False:
                raise _refuse(f"{at}.input_activations", "are static (input_scale tensors)")
            _check_args(activations, _ACTIVATIONS, f"{at}.input_activations")
        if group.get("output_activations") is not None:
            raise _refuse(f"{at}.output_activations", "are quantized")


def _check_ignore(ignore: Any, dims: fmt.ModelDims, nested: bool, where: str) -> None:
    """No expert linear layer may be in ``ignore`` (by name or ``re:`` pattern)."""
    if ignore is None:
        return
    if not isinstance(ignore, list) or not all(isinstance(entry, str) for entry in ignore):
        raise _refuse(f"{where}.ignore", "is not a list of module names")
    exact = set(ignore)
    patterns = []
    for entry in ignore:
        if entry.startswith("re:"):
            try:
                patterns.append(re.compile(entry[3:]))
            except re.error as exc:
                raise _refuse(f"{where}.ignore", f"holds an invalid pattern {entry!r} ({exc})") from None
    for layer in range(dims.num_hidden_layers):
        for expert in range(dims.num_local_experts):
            for proj in _PROJECTIONS:
                module = f"{expert_prefix(layer, expert, nested)}{proj}"
                if module in exact or any(pattern.match(module) for pattern in patterns):
                    raise _refuse(f"{where}.ignore", f"leaves expert {module} unquantized")


def _check_tensor_kinds(tensors: dict[str, tuple[str, TensorInfo]], dims: fmt.ModelDims, nested: bool) -> None:
    """One-line reasons for the tensor layouts other compressed-tensors schemes produce."""
    for name, (path, info) in tensors.items():
        if name.endswith(".input_scale"):
            raise _refuse(f"{path}: {name}", "is a static activation scale")
        if name.endswith((".weight_zero_point", ".weight_g_idx", ".weight_packed", ".weight_global_scale")):
            raise _refuse(f"{path}: {name}", "belongs to an asymmetric, grouped or packed scheme")
        is_expert = f".{EXPERTS}" in name and name.rsplit(".", 2)[-2] in _PROJECTIONS
        if name.endswith(".weight_scale") and not is_expert:
            raise _refuse(f"{path}: {name}", "quantizes a non-expert layer (attention, router and lm_head must "
                                             "stay unquantized)")
        if is_expert and name.endswith(".weight") and info.dtype != fmt.F8_E4M3:
            what = "int8" if info.dtype == "I8" else "unquantized" if info.dtype in FLOAT_DTYPES else "not FP8"
            raise _refuse(f"{path}: {name}", f"is {info.dtype} ({what} expert)")
        if is_expert and name.endswith(".weight_scale") and tuple(info.shape[1:]) != (1,):
            raise _refuse(f"{path}: {name}", f"has shape {list(info.shape)}, not per-channel [out, 1] "
                                             "(group, block or tensor strategy)")


def _resolve_split(config: dict[str, Any], nested: bool, stated: str | None, config_path: str) -> str:
    """The gate/up split: known from the names (B) or ``transformers_version`` < 5 (A); otherwise
    (C: halves, or D: even/odd, indistinguishable) only the user can say."""
    if stated is not None and stated not in GATE_UP_SPLITS:
        raise ConversionError(f"gate_up_split is {stated!r}: use one of {', '.join(GATE_UP_SPLITS)}")
    known, why = other_formats.ct_known_split(config.get("transformers_version"), nested)
    if known is not None:
        if stated not in (None, known):
            raise ConversionError(f"{config_path}: gate_up_split {stated!r} contradicts the checkpoint: {why}")
        return known
    if stated is None:
        version = config.get("transformers_version")
        raise ConversionError(
            f"{config_path}: the gate/up split of this compressed-tensors checkpoint cannot be told from its files "
            f"(transformers_version {version!r}, experts.E names): state it with {SPLIT_HELP}")
    return stated


# --------------------------------------------------------------------------- conversion


def _check_rows(row_max: torch.Tensor, scale: torch.Tensor, where: str) -> tuple[torch.Tensor, torch.Tensor]:
    """Rows' largest magnitude bytes and their scales → (float32 scales, doubled where halved;
    which rows are halved). Raises on a NaN byte, an unusable scale of a non-zero row, or a
    doubling that overflows, in that order, naming the first row."""
    if bool((row_max == _FP8_NAN).any()):
        row = int((row_max == _FP8_NAN).nonzero()[0])
        raise ConversionError(f"{where} row {row} holds a NaN byte: corrupt source")
    s = scale.reshape(-1).float()
    usable = torch.isfinite(s) & (s >= MIN_NORMAL_SCALE)  # a normal, finite float32 > 0
    if not bool(usable[row_max > 0].all()):
        row = int(((row_max > 0) & ~usable).nonzero()[0])
        value = float(s[row])
        why = ("below float32's normal range (2^-126): the output's scales must be normal floats"
               if 0 < value < MIN_NORMAL_SCALE else "not a finite positive scale")
        raise ConversionError(f"{where} row {row} has weight_scale {value}, {why}: corrupt source")
    halve = row_max > _NEURON_MAX_BYTE
    s = torch.where(usable, s, torch.ones_like(s))
    s = torch.where(halve, s * 2, s)
    if not bool(torch.isfinite(s).all()):
        raise ConversionError(f"{where}: doubling a weight_scale overflows float32: corrupt source")
    return s, halve


def _neuron_range(q: torch.Tensor, scale: torch.Tensor, where: str,
                  place: Callable[[torch.Tensor, int], None] | None = None,
                  out: torch.Tensor | None = None, dest: torch.Tensor | None = None,
                  ) -> tuple[torch.Tensor | None, torch.Tensor, Exactness]:
    """uint8 [rows, K] OCP E4M3 and its scale [rows, 1] → (E4M3 bytes within ±240, float32 scale
    [rows], exactness): rows beyond ±240 halved, their scales doubled.

    One pass over cache-sized row blocks: rows beyond ±240 are halved with a few integer ops;
    the rows are checked once all are seen (a corrupt source raises before anything is written). With ``place``, each finished block goes to
    ``place(block, first_row)`` while it is still in cache (fused with the transpose into the
    output buffer) and the bytes are returned as None; with ``out`` and ``dest`` too, the compiled
    encoder (``kernels``), when built, does it all in one pass: row r into column ``dest[r]``."""
    q = q.view(torch.uint8)
    rows, cols = q.shape
    step = max(1, _CHUNK_BYTES // max(cols, 1))
    if step > _TILE_ROWS:
        step -= step % _TILE_ROWS  # whole transpose tiles per block
    row_max = torch.empty(rows, dtype=torch.uint8)
    result = None
    if place is None:
        result = torch.empty_like(q)

        def place(block: torch.Tensor, first: int) -> None:
            result[first:first + block.shape[0]] = block

    exactness = Exactness(values=q.numel())
    if kernels.AVAILABLE and out is not None and dest is not None:
        row_max, histogram = kernels.ct_rows(q, _NEURON_MAX_BYTE, out, dest)
        _count_rounded(histogram, exactness)
        s, _ = _check_rows(row_max, scale, where)
        return None, s, exactness
    magnitude = torch.empty((min(step, rows), cols), dtype=torch.uint8)
    for start in range(0, rows, step):
        stop = min(rows, start + step)
        block, mag = q[start:stop], magnitude[:stop - start]
        torch.bitwise_and(block, _MAG, out=mag)
        torch.amax(mag, dim=1, out=row_max[start:stop])
        halve = row_max[start:stop] > _NEURON_MAX_BYTE  # rows are checked below, once all are seen
        if not bool(halve.any()):
            place(block, start)
            continue
        # branch-free (comparisons to bool cost ten times an integer op here): with the magnitude
        # m clamped to 0x10, the amount to subtract is d = ⌈m/2⌉ − (m & m>>1 & 1) = m − round_even(m/2)
        # in the bottom binades (m < 0x10, value m · 2^-9) and 0x08 (the exponent field minus one)
        # from exponent field 2 up
        minus, odd = _halving(mag)
        if not bool(halve.all()):
            halved_rows = halve.to(torch.uint8).unsqueeze(1)
            minus.mul_(halved_rows)
            odd.mul_(halved_rows)
        odd_rows = odd.amax(dim=1).nonzero().reshape(-1)
        if odd_rows.numel():
            rounded = block.index_select(0, odd_rows).bitwise_and_(_LOW_MAGNITUDE).mul_(odd.index_select(0, odd_rows))
            _count_rounded(torch.bincount(rounded.view(-1), minlength=16), exactness)
        place(torch.sub(block, minus, out=minus), start)
    s, _ = _check_rows(row_max, scale, where)
    return result, s, exactness


def _halving(mag: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(what to subtract from each byte to halve it, 1 where halving rounds it) for the
    magnitudes ``mag`` (uint8, clobbered)."""
    clamped = mag.clamp_(max=_BOTTOM_LIMIT)
    minus = (clamped + 1).bitwise_right_shift_(1)
    minus.sub_(clamped.bitwise_right_shift(1).bitwise_and_(clamped).bitwise_and_(1))
    return minus, clamped.bitwise_and_(1)  # odd m of the bottom binades: halving rounds them


def _count_rounded(counts: torch.Tensor, exactness: Exactness) -> None:
    """Add the bottom-binade magnitudes m (``counts[m]`` bytes each, odd m only: the values
    halving rounds) with the worst relative error of those rounded to a non-zero value (m = 1
    halves to 0: flushed to zero, counted apart)."""
    present = counts[3:16:2] > 0
    exactness.inexact += int(counts[1:16:2].sum())
    exactness.flushed_to_zero += int(counts[1])
    if bool(present.any()):
        exactness.max_rel_error = max(exactness.max_rel_error, float(_ROUNDED_REL_ERROR[3:16:2][present].max()))


def _encode_gate_up(lane: Lane, gate: torch.Tensor, gate_scale: torch.Tensor, up: torch.Tensor,
                    up_scale: torch.Tensor, split: str, padded_i: int, where: str) -> tuple[Exactness, torch.Tensor]:
    rows = gate.shape[0]
    if split == SPLIT_HALVES:  # gate_proj then up_proj rows are the fused [2I, H], rows interleaved
        if kernels.AVAILABLE:
            buffer = lane.buffer
            _, gate_s, exactness = _neuron_range(gate, gate_scale, f"{where}.gate_proj.weight", out=buffer,
                                                 dest=kernels.gate_up_destinations(rows, padded_i))
            _, up_s, up_exactness = _neuron_range(up, up_scale, f"{where}.up_proj.weight", out=buffer,
                                                  dest=kernels.gate_up_destinations(rows, padded_i, rows))
            exactness.add(up_exactness)
            return exactness, chunk_interleaved(torch.cat((gate_s, up_s)), padded_i, 1.0)
        gate, gate_s, exactness = _neuron_range(gate, gate_scale, f"{where}.gate_proj.weight")
        up, up_s, up_exactness = _neuron_range(up, up_scale, f"{where}.up_proj.weight")
        exactness.add(up_exactness)
        place_gate_up(torch.cat((gate, up)), lane.buffer)
        return exactness, chunk_interleaved(torch.cat((gate_s, up_s)), padded_i, 1.0)
    gate_out, up_out = lane.buffer[:, :padded_i], lane.buffer[:, padded_i:]
    columns = torch.arange(rows, dtype=torch.int64)
    _, gate_s, exactness = _neuron_range(gate, gate_scale, f"{where}.gate_proj.weight",
                                         lambda block, first: place_down(block, gate_out, first), lane.buffer, columns)
    _, up_s, up_exactness = _neuron_range(up, up_scale, f"{where}.up_proj.weight",
                                          lambda block, first: place_down(block, up_out, first), lane.buffer,
                                          columns + padded_i)
    exactness.add(up_exactness)
    return exactness, chunk_halves(gate_s, up_s, padded_i, 1.0)


def _encode_down(lane: Lane, down: torch.Tensor, down_scale: torch.Tensor, where: str) -> tuple[Exactness, torch.Tensor]:
    _, down_s, exactness = _neuron_range(down, down_scale, f"{where}.down_proj.weight",
                                         lambda block, first: place_down(block, lane.buffer, first), lane.buffer,
                                         torch.arange(down.shape[0], dtype=torch.int64))
    return exactness, pad_to(down_s, (lane.buffer.shape[1],), 1.0)


def _projection(reader: SourceReader, layer: int, proj: str, out: Output, layout: fmt.Layout,
                workspace: Workspace) -> ExpertStats:
    """All experts of one projection, ``Workspace.LANES`` at a time."""
    name = f"{fmt.layer_prefix(layer)}{proj}"
    _, rows_out, cols_out = out.shape(f"{name}.weight")
    lanes = workspace.lanes((rows_out, cols_out))
    split = reader.source.options["gate_up_split"]
    dims = reader.source.dims

    def load(expert: int) -> tuple[Any, ...]:
        prefix = _prefix(reader, layer, expert)
        where = prefix.rstrip(".")
        if proj == fmt.DOWN:
            return reader.get(f"{prefix}down_proj.weight"), reader.get(f"{prefix}down_proj.weight_scale"), where
        return (reader.get(f"{prefix}gate_proj.weight"), reader.get(f"{prefix}gate_proj.weight_scale"),
                reader.get(f"{prefix}up_proj.weight"), reader.get(f"{prefix}up_proj.weight_scale"),
                split, layout.padded_intermediate_size, where)

    encode = _encode_down if proj == fmt.DOWN else _encode_gate_up
    per_expert = dims.hidden_size * dims.intermediate_size * (1 if proj == fmt.DOWN else 2)
    exactness = stream_experts(reader, out, workspace, name, lanes, load, encode,
                               release_every=max(1, CHUNK_BYTES // per_expert))
    return ExpertStats.from_exactness(f"{name}.weight", exactness)
