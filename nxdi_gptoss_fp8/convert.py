"""Convert a published GPT-OSS checkpoint (HF MXFP4 or HF BF16) to the normalized FP8 format.

The source is detected from its own files: the top-level HF set named by its
``model.safetensors.index.json`` (or a single ``model.safetensors``), never the ``original/``
set the published repos ship beside it, and never a pickle. Every source header is validated
and every tensor name, shape and dtype checked against the config before a byte is written.

Tensors are read one at a time (experts one expert at a time, large matrices in row chunks)
and written at their final offsets through ``CheckpointWriter``, so memory does not grow with
the model, and the output only appears, complete, when the last byte and the index are down.

Experts: gate/up rows de-interleaved into chunked columns ``[gate | up]``, each half padded to
I', transposed input-dim first, padded to H', FP8-E4M3 with expert-wise per-channel float32
scales. MXFP4 sources use power-of-two scales that keep every value exact wherever E4M3 can
(``mxfp4``); BF16 sources use ``amax / 240``. Everything else is renamed, zero-padded like
NxDI's own HF conversion and stored as BF16. Requires torch and safetensors.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import re
import sys
import time
from collections.abc import Callable, Iterator, Mapping
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from typing import Any

import torch

from . import __version__, mxfp4
from . import format as fmt
from .errors import ConversionError
from .quant import FP8_DTYPE, quantize_expertwise
from .safetensors_header import HeaderError, TensorInfo, read_header
from .strict_json import JsonError, parse_json_strict
from .writer import CheckpointWriter, parse_size

SOURCE_MXFP4 = "hf-mxfp4"
SOURCE_BF16 = "hf-bf16"
HF_PREFIX = "model."
SINGLE_FILE = "model.safetensors"
FLOAT_DTYPES = ("BF16", "F16", "F32")
_CHUNK_BYTES = 32 << 20
_WRITEBACK_BYTES = 64 << 20
_TILE = 64
_ENCODE_ROWS = 1024
_MOVED = {
    "self_attn.sinks": "self_attn.learned_sinks.sink",
    "mlp.router.weight": "feed_forward.moe.router.linear_router.weight",
    "mlp.router.bias": "feed_forward.moe.router.linear_router.bias",
}
_EXPERTS = "mlp.experts."
_HF_SNAPSHOT = re.compile(r"models--([^/]+)--([^/]+)/snapshots/([0-9a-f]{40})")


# --------------------------------------------------------------------------- source layout


@dataclass(frozen=True)
class SourceSpec:
    """One tensor an HF GPT-OSS checkpoint must hold: name, shape and allowed dtypes."""

    name: str
    shape: tuple[int, ...]
    dtypes: tuple[str, ...]


def non_expert_names(dims: fmt.ModelDims) -> dict[str, str]:
    """HF name → normalized name of every tensor that is only renamed and padded."""
    names = {
        f"{HF_PREFIX}embed_tokens.weight": "embed_tokens.weight",
        f"{HF_PREFIX}norm.weight": "norm.weight",
        "lm_head.weight": "lm_head.weight",
    }
    for layer in range(dims.num_hidden_layers):
        prefix = fmt.layer_prefix(layer)
        for spec in fmt.layer_specs(fmt.Layout.unpadded(dims), layer):
            short = spec.name[len(prefix):]
            if fmt.EXPERT_PREFIX in short:
                continue
            hf_short = next((old for old, new in _MOVED.items() if new == short), short)
            names[f"{HF_PREFIX}{prefix}{hf_short}"] = spec.name
    return names


def source_specs(dims: fmt.ModelDims, kind: str) -> dict[str, SourceSpec]:
    """Every tensor of an HF GPT-OSS checkpoint of ``kind`` (``hf-mxfp4`` or ``hf-bf16``)."""
    unpadded = {spec.name: spec for spec in fmt.expected_namespace(fmt.Layout.unpadded(dims)).values()}
    specs = {
        hf: SourceSpec(hf, unpadded[ours].shape, FLOAT_DTYPES) for hf, ours in non_expert_names(dims).items()
    }
    e, h, i = dims.num_local_experts, dims.hidden_size, dims.intermediate_size
    if kind == SOURCE_MXFP4:
        experts = {
            "gate_up_proj_blocks": ((e, 2 * i, h // mxfp4.BLOCK_SIZE, mxfp4.BLOCK_SIZE // 2), ("U8",)),
            "gate_up_proj_scales": ((e, 2 * i, h // mxfp4.BLOCK_SIZE), ("U8",)),
            "gate_up_proj_bias": ((e, 2 * i), FLOAT_DTYPES),
            "down_proj_blocks": ((e, h, i // mxfp4.BLOCK_SIZE, mxfp4.BLOCK_SIZE // 2), ("U8",)),
            "down_proj_scales": ((e, h, i // mxfp4.BLOCK_SIZE), ("U8",)),
            "down_proj_bias": ((e, h), FLOAT_DTYPES),
        }
    else:
        # transformers' GptOssExperts: gate_up_proj [E, H, 2I] (gate/up interleaved on the last
        # dim), down_proj [E, I, H]: both already input-dim first.
        experts = {
            "gate_up_proj": ((e, h, 2 * i), FLOAT_DTYPES),
            "gate_up_proj_bias": ((e, 2 * i), FLOAT_DTYPES),
            "down_proj": ((e, i, h), FLOAT_DTYPES),
            "down_proj_bias": ((e, h), FLOAT_DTYPES),
        }
    for layer in range(dims.num_hidden_layers):
        for short, (shape, dtypes) in experts.items():
            name = expert_source_name(layer, short)
            specs[name] = SourceSpec(name, shape, dtypes)
    return specs


def expert_source_name(layer: int, short: str) -> str:
    return f"{HF_PREFIX}{fmt.layer_prefix(layer)}{_EXPERTS}{short}"


@dataclass
class Source:
    """A detected source checkpoint: its kind, config, dimensions and where each tensor is."""

    root: str
    kind: str
    config: dict[str, Any]
    dims: fmt.ModelDims
    tensors: dict[str, tuple[str, TensorInfo]]  # name → (file path, header entry)

    @property
    def files(self) -> list[str]:
        return sorted({path for path, _ in self.tensors.values()})

    def provenance(self) -> dict[str, Any]:
        """What the index's ``source`` metadata records (no timestamps: output is reproducible)."""
        record: dict[str, Any] = {"format": self.kind, "path": self.root,
                                  "converter": f"nxdi-gptoss-fp8 {__version__}"}
        match = _HF_SNAPSHOT.search(self.root)
        if match:
            record["repo"], record["revision"] = f"{match.group(1)}/{match.group(2)}", match.group(3)
        elif isinstance(self.config.get("_name_or_path"), str):
            record["repo"] = self.config["_name_or_path"]
        return record


class SourceReader:
    """Lazy, per-tensor access to a source's files through ``safetensors.safe_open``."""

    def __init__(self, source: Source) -> None:
        self.source = source
        self._stack = contextlib.ExitStack()
        self._handles: dict[str, Any] = {}

    def __enter__(self) -> SourceReader:
        return self

    def __exit__(self, *exc: object) -> None:
        self._stack.close()

    def release(self) -> None:
        """Close every open file. ``safe_open`` hands out views of a whole-file mapping, and each
        page touched through it stays in this process's RSS until the file is closed and the
        views are gone; releasing after each chunk keeps RSS flat however big the shards are."""
        self._stack.close()
        self._stack = contextlib.ExitStack()
        self._handles.clear()

    def _handle(self, path: str) -> Any:
        if path not in self._handles:
            from safetensors import safe_open

            self._handles[path] = self._stack.enter_context(safe_open(path, framework="pt"))
        return self._handles[path]

    def slice(self, name: str) -> Any:
        """A lazily indexed view: ``reader.slice(name)[e]`` reads expert ``e`` only."""
        path, _ = self.source.tensors[name]
        return self._handle(path).get_slice(name)

    def get(self, name: str) -> torch.Tensor:
        path, _ = self.source.tensors[name]
        return self._handle(path).get_tensor(name)


def _read_json(path: str, what: str) -> Any:
    try:
        with open(path, encoding="utf-8") as handle:
            return parse_json_strict(handle.read(), what=what)
    except OSError as exc:
        raise ConversionError(f"cannot read {path}: {exc.strerror}") from None
    except (JsonError, UnicodeDecodeError) as exc:
        raise ConversionError(f"{path} is not valid JSON ({exc}): re-download the file") from None


def _listing(root: str) -> str:
    try:
        entries = sorted(os.listdir(root))
    except OSError:
        return "nothing readable"
    shown = ", ".join(e + ("/" if os.path.isdir(os.path.join(root, e)) else "") for e in entries[:12])
    return (shown + (f", … ({len(entries)} entries)" if len(entries) > 12 else "")) or "an empty directory"


def _shard_files(root: str) -> dict[str, str]:
    """tensor name → shard file name, from the top-level HF index or the single-file header."""
    index_path = os.path.join(root, fmt.INDEX_FILE)
    if os.path.isfile(index_path):
        index = _read_json(index_path, fmt.INDEX_FILE)
        metadata = index.get("metadata") if isinstance(index, dict) else None
        if isinstance(metadata, dict) and metadata.get("format") == fmt.FORMAT_NAME:
            raise ConversionError(
                f"{root} is already a normalized FP8 checkpoint: check it with `nxdi-gptoss-fp8 validate {root}`"
            )
        weight_map = index.get("weight_map") if isinstance(index, dict) else None
        if not isinstance(weight_map, dict) or not weight_map:
            raise ConversionError(f"{index_path}: weight_map is missing or empty: re-download the index")
        for key, shard in weight_map.items():
            if not isinstance(shard, str) or os.path.basename(shard) != shard or shard in ("", ".", ".."):
                raise ConversionError(
                    f"{index_path}: weight_map[{key!r}] is {shard!r}; only files beside the index are read "
                    "(the original/ set is never mixed in)"
                )
        return dict(weight_map)
    single = os.path.join(root, SINGLE_FILE)
    if os.path.isfile(single):
        return dict.fromkeys(_header(single).tensors, SINGLE_FILE)
    hint = ""
    if os.path.basename(os.path.normpath(root)) == "original":
        hint = "; this is the OpenAI original/ set: point SRC at its parent directory (the HF set)"
    raise ConversionError(
        f"{root} has no {fmt.INDEX_FILE} or {SINGLE_FILE} (found: {_listing(root)}){hint}"
    )


def _header(path: str) -> Any:
    try:
        return read_header(path)
    except HeaderError as exc:
        raise ConversionError(f"{path}: not a valid safetensors file ({exc}): re-download it") from None
    except OSError as exc:
        raise ConversionError(f"cannot read {path}: {exc.strerror}") from None


def _classify(names: set[str]) -> str:
    first = f"{HF_PREFIX}layers.0.{_EXPERTS}"
    if f"{first}gate_up_proj_blocks" in names:
        return SOURCE_MXFP4
    if f"{first}gate_up_proj" in names:
        return SOURCE_BF16
    sample = ", ".join(sorted(names)[:4])
    if any(name.startswith("block.") for name in names):
        what = "OpenAI's original layout (block.N.*): convert the HF set (the parent of original/) instead"
    elif any(name.startswith(("layers.", "embed_tokens.")) for name in names):
        what = "already-converted (NxDI) names: a normalized checkpoint needs no conversion; validate it instead"
    else:
        what = "no GPT-OSS expert tensors (model.layers.0.mlp.experts.gate_up_proj[_blocks])"
    raise ConversionError(f"unrecognized source layout: {what} (found {len(names)} tensors, e.g. {sample})")


def open_source(src: str | os.PathLike[str]) -> Source:
    """Detect and validate a source checkpoint directory; raises ``ConversionError`` naming
    what was found when it is not an HF MXFP4 or HF BF16 GPT-OSS checkpoint."""
    root = os.path.abspath(os.fspath(src))
    if not os.path.isdir(root):
        raise ConversionError(f"{root} is not a directory: SRC is a checkpoint directory holding config.json")
    parent = os.path.dirname(root)
    if os.path.basename(root) == "original" and os.path.isfile(os.path.join(parent, fmt.CONFIG_FILE)):
        raise ConversionError(
            f"{root} is the OpenAI original/ set of the repo at {parent}: point SRC at its parent "
            "directory (the HF set); the two sets are never mixed"
        )
    config_path = os.path.join(root, fmt.CONFIG_FILE)
    if not os.path.isfile(config_path):
        raise ConversionError(f"{root} has no {fmt.CONFIG_FILE} (found: {_listing(root)})")
    config = _read_json(config_path, fmt.CONFIG_FILE)
    if not isinstance(config, dict):
        raise ConversionError(f"{config_path} is not a JSON object")
    if config.get("model_type") != fmt.MODEL_TYPE:
        raise ConversionError(
            f"{config_path}: model_type is {config.get('model_type')!r}, not {fmt.MODEL_TYPE!r}: only GPT-OSS converts"
        )
    try:
        dims = fmt.dims_from_config(config)
    except fmt.ConfigFieldError as exc:
        raise ConversionError(f"{config_path}: {exc}") from None

    weight_map = _shard_files(root)
    tensors: dict[str, tuple[str, TensorInfo]] = {}
    for shard in sorted(set(weight_map.values())):
        path = os.path.join(root, shard)
        if not os.path.isfile(path):
            raise ConversionError(f"{path} is named by the index but missing: finish the download")
        for name, info in _header(path).tensors.items():
            if weight_map.get(name) != shard:
                raise ConversionError(
                    f"{path} holds {name!r}, which the index assigns to {weight_map.get(name)!r}: "
                    "mixed or half-copied checkpoint sets"
                )
            tensors[name] = (path, info)
    missing_files = sorted(set(weight_map) - set(tensors))
    if missing_files:
        raise ConversionError(f"the index lists {missing_files[0]!r} but no shard holds it: re-download")

    kind = _classify(set(tensors))
    quant = config.get("quantization_config")
    method = quant.get("quant_method") if isinstance(quant, dict) else None
    if kind == SOURCE_MXFP4 and method != "mxfp4":
        raise ConversionError(
            f"{config_path}: tensors are MXFP4 (…_blocks/_scales) but quantization_config.quant_method is "
            f"{method!r}, not 'mxfp4': config and weights come from different sets"
        )
    if kind == SOURCE_BF16 and method is not None:
        raise ConversionError(
            f"{config_path}: tensors are dense but quantization_config.quant_method is {method!r}: "
            "config and weights come from different sets"
        )
    if kind == SOURCE_MXFP4:
        for label, size in (("hidden_size", dims.hidden_size), ("intermediate_size", dims.intermediate_size)):
            if size % mxfp4.BLOCK_SIZE:
                raise ConversionError(f"{config_path}: {label}={size} is not a multiple of the MXFP4 block size 32")
    _check_tensors(tensors, source_specs(dims, kind), kind)
    return Source(root=root, kind=kind, config=config, dims=dims, tensors=tensors)


def _check_tensors(tensors: dict[str, tuple[str, TensorInfo]], specs: dict[str, SourceSpec], kind: str) -> None:
    missing = sorted(set(specs) - set(tensors))
    extra = sorted(set(tensors) - set(specs))
    if missing:
        raise ConversionError(
            f"{kind} source lacks {len(missing)} tensors the config implies (first: {missing[0]}): "
            "incomplete download, or config.json from another model"
        )
    if extra:
        raise ConversionError(
            f"{kind} source has {len(extra)} tensors a GPT-OSS checkpoint does not (first: {extra[0]}): "
            "not a GPT-OSS HF checkpoint, or mixed sets"
        )
    for name, spec in specs.items():
        path, info = tensors[name]
        if info.shape != spec.shape or info.dtype not in spec.dtypes:
            raise ConversionError(
                f"{path}: {name} is {info.dtype}{list(info.shape)}, expected "
                f"{'/'.join(spec.dtypes)}{list(spec.shape)} from config.json"
            )


# --------------------------------------------------------------------------- report


def _size_text(size: int) -> str:
    for unit, factor in (("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if size >= factor:
            return f"{size / factor:.2f} {unit}"
    return f"{size} B"


@dataclass
class ExpertStats:
    """Exactness of one converted expert projection (all experts of one layer)."""

    name: str
    values: int = 0
    inexact: int = 0
    flushed_to_zero: int = 0
    max_rel_error: float = 0.0
    mean_rel_error: float | None = None  # BF16 sources: over the non-zero source values


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

    def exactness_summary(self) -> dict[str, Any]:
        return {"fp8_values": self.fp8_values, "inexact_values": self.inexact_values,
                "flushed_to_zero": sum(s.flushed_to_zero for s in self.experts),
                "max_rel_error": self.max_rel_error}

    def to_dict(self) -> dict[str, Any]:
        document = asdict(self)
        document.update(self.exactness_summary())
        return document

    def render_text(self, *, limit: int = 10) -> str:
        rate = self.fp8_bytes / self.elapsed_s / 1e6 if self.elapsed_s > 0 else 0.0
        lines = [
            f"converted {self.source} ({self.source_format}) → {self.out}",
            f"  profile {self.profile}, {self.layers} layers, H'={self.padded_hidden_size}, "
            f"I'={self.padded_intermediate_size}, {self.tensors} tensors",
            f"  {_size_text(self.bytes_written)} written ({_size_text(self.fp8_bytes)} FP8) in "
            f"{self.elapsed_s:.1f} s ({rate:.0f} MB/s FP8)",
        ]
        if self.source_format == SOURCE_MXFP4:
            lines.append(
                f"  exactness: {self.fp8_values - self.inexact_values} of {self.fp8_values} expert values exact "
                f"({self.inexact_values} inexact, worst relative error {self.max_rel_error:.3g})"
            )
            worst = sorted((s for s in self.experts if s.inexact), key=lambda s: -s.inexact)[:limit]
            lines += [f"    {s.name}: {s.inexact} inexact ({s.flushed_to_zero} flushed to zero), "
                      f"worst {s.max_rel_error:.3g}" for s in worst]
        else:
            lines.append(f"  amax/240 scaling: worst relative error {self.max_rel_error:.3g} over "
                         f"{self.fp8_values} expert values (per tensor below)")
            lines += [f"    {s.name}: max {s.max_rel_error:.3g}, mean {s.mean_rel_error or 0.0:.3g}, "
                      f"{s.flushed_to_zero} flushed to zero" for s in self.experts[:limit]]
            if len(self.experts) > limit:
                lines.append(f"    … {len(self.experts) - limit} more (see to_dict())")
        return "\n".join(lines)


# --------------------------------------------------------------------------- layout helpers


def chunk_interleaved(values: torch.Tensor, padded: int, fill: float) -> torch.Tensor:
    """[..., 2I] gate/up interleaved (even = gate, odd = up) → [..., 2I'] chunked
    ``[gate | pad | up | pad]``, each half padded to I' with ``fill``."""
    half = values.shape[-1] // 2
    out = torch.full((*values.shape[:-1], 2, padded), fill, dtype=values.dtype)
    out[..., :half] = values.reshape(*values.shape[:-1], half, 2).transpose(-1, -2)
    return out.reshape(*values.shape[:-1], 2 * padded)


def pad_to(values: torch.Tensor, shape: tuple[int, ...], fill: float = 0.0) -> torch.Tensor:
    """``values`` zero-padded at the end of every dim to ``shape`` (NxDI's ``F.pad(…, (0, d))``)."""
    if tuple(values.shape) == tuple(shape):
        return values
    out = torch.full(shape, fill, dtype=values.dtype)
    out[tuple(slice(0, n) for n in values.shape)] = values
    return out


def place_gate_up(rows: torch.Tensor, out: torch.Tensor, first_row: int = 0) -> None:
    """Source rows ``first_row…`` of [2I, H] (interleaved; ``first_row`` even) into ``out``
    [H', 2I']: transposed, chunked into ``[gate | up]``, padded.

    Copied in tiles of ``_TILE`` source rows: a byte transpose in one piece misses the cache
    on every element and costs about twice as much."""
    count, h = rows.shape
    channel, padded_half = first_row // 2, out.shape[1] // 2
    pairs = rows.view(count // 2, 2, h)  # [channels, (gate, up), H]
    for start in range(0, count // 2, _TILE):
        stop = min(count // 2, start + _TILE)
        out[:h, channel + start:channel + stop].copy_(pairs[start:stop, 0].t())
        out[:h, padded_half + channel + start:padded_half + channel + stop].copy_(pairs[start:stop, 1].t())


def place_down(rows: torch.Tensor, out: torch.Tensor, first_row: int = 0) -> None:
    """Source rows ``first_row…`` of [H, I] into ``out`` [I', H']: transposed, padded (in
    tiles, as above)."""
    count, i = rows.shape
    for start in range(0, count, _TILE):
        stop = min(count, start + _TILE)
        out[:i, first_row + start:first_row + stop].copy_(rows[start:stop].t())


# --------------------------------------------------------------------------- conversion


def _sync_file_range() -> Callable[[int, int, int, int], int] | None:
    try:
        function = ctypes.CDLL(None, use_errno=True).sync_file_range
    except (OSError, AttributeError):
        return None
    function.argtypes = (ctypes.c_int, ctypes.c_int64, ctypes.c_int64, ctypes.c_uint)
    return function  # type: ignore[no-any-return]


_SYNC_FILE_RANGE = _sync_file_range()
_SYNC_FILE_RANGE_WRITE = 2


def start_writeback(path: str) -> None:
    """Ask the kernel to start writing ``path``'s dirty pages to disk now, without waiting.

    The writer fsyncs every shard before it commits; starting the disk writes while the
    conversion is still encoding overlaps the two instead of leaving it all to that fsync.
    A no-op where ``sync_file_range`` does not exist (it only changes timing, never content).
    """
    if _SYNC_FILE_RANGE is None:
        return
    fd = os.open(path, os.O_RDONLY)
    try:
        _SYNC_FILE_RANGE(fd, 0, 0, _SYNC_FILE_RANGE_WRITE)
    finally:
        os.close(fd)


class _Output:
    """The writer, fed by one background thread so disk writes overlap the encoding, plus the
    progress bar. Every byte goes through ``put`` (waits) or ``put_async`` (returns a future)."""

    def __init__(self, writer: CheckpointWriter, bar: Any, pool: ThreadPoolExecutor) -> None:
        self.writer, self.bar, self.pool = writer, bar, pool
        self.bytes = self.fp8_bytes = 0
        self._unflushed: dict[str, int] = {}

    def _write(self, name: str, data: torch.Tensor, offset: int) -> None:
        self.writer.put(name, data, offset=offset)
        size = data.numel() * data.element_size()
        self.bytes += size
        if data.dtype in (FP8_DTYPE, torch.uint8):
            self.fp8_bytes += size
        self.bar.update(size)
        shard = self.writer.planned[name].shard
        self._unflushed[shard] = self._unflushed.get(shard, 0) + size
        if self._unflushed[shard] >= _WRITEBACK_BYTES and self.writer.tmp is not None:
            self._unflushed[shard] = 0
            start_writeback(os.path.join(self.writer.tmp, shard))

    def put_async(self, name: str, data: torch.Tensor, *, offset: int = 0) -> Future[None]:
        """Queue a write; ``data`` must not change until the future is done."""
        return self.pool.submit(self._write, name, data, offset)

    def put(self, name: str, data: torch.Tensor, *, offset: int = 0) -> None:
        self.put_async(name, data, offset=offset).result()


@dataclass
class _Lane:
    """One expert in flight: an encoder and an output buffer, reused for every expert it takes."""

    encoder: mxfp4.ExpertEncoder
    buffer: torch.Tensor
    write: Future[None] | None = None

    def wait_written(self) -> None:
        if self.write is not None:
            write, self.write = self.write, None
            write.result()


class _Workspace:
    """Encoders and output buffers, allocated once per shape; a pool of compute threads.

    ``LANES`` experts are encoded at once in plain threads (torch releases the GIL in its ops)
    with torch's own intra-op threading off: on a small shared machine that beats one expert
    at a time on OpenMP threads, which spin while they wait. Padding regions of the buffers
    are zeroed once and never written again.
    """

    LANES = 2

    def __init__(self, pool: ThreadPoolExecutor) -> None:
        self.pool = pool
        self._encoders: dict[int, list[mxfp4.ExpertEncoder]] = {}
        self._lanes: dict[tuple[int, tuple[int, int]], list[_Lane]] = {}

    def lanes(self, groups: int, out_shape: tuple[int, int]) -> list[_Lane]:
        """The lanes for experts of ``groups`` blocks per row written as ``out_shape``
        (encoders are shared by every output shape with the same block count)."""
        key = (groups, out_shape)
        if key not in self._lanes:
            encoders = self._encoders.setdefault(
                groups, [mxfp4.ExpertEncoder(_ENCODE_ROWS, groups) for _ in range(self.LANES)])
            self._lanes[key] = [_Lane(encoder, torch.zeros(out_shape, dtype=torch.uint8)) for encoder in encoders]
        return self._lanes[key]

    def wait(self) -> None:
        for lanes in self._lanes.values():
            for lane in lanes:
                lane.wait_written()


@contextlib.contextmanager
def _single_threaded_torch() -> Iterator[None]:
    """Run torch ops single-threaded inside (the compute lanes are the parallelism)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(threads)


def _spec(writer: CheckpointWriter, name: str) -> fmt.TensorSpec:
    return writer.planned[name].spec


def _copy_padded(reader: SourceReader, src_name: str, out: _Output, name: str) -> None:
    """Rename, cast to BF16 and zero-pad one non-expert tensor, in row chunks."""
    shape = _spec(out.writer, name).shape
    source_shape = reader.source.tensors[src_name][1].shape
    if len(shape) == 1:
        out.put(name, pad_to(reader.get(src_name).to(torch.bfloat16), shape))
        return
    rows, cols = shape
    step = max(1, _CHUNK_BYTES // (cols * 2))
    for start in range(0, rows, step):
        stop = min(rows, start + step)
        part = torch.zeros((stop - start, cols), dtype=torch.bfloat16)
        if start < source_shape[0]:
            chunk = reader.slice(src_name)[start:min(stop, source_shape[0])]
            part[: chunk.shape[0], : chunk.shape[1]] = chunk
            del chunk
            reader.release()
        out.put(name, part, offset=start * cols * 2)


def _expert_biases(reader: SourceReader, layer: int, out: _Output, layout: fmt.Layout) -> None:
    """The expert biases, raw: gate/up de-interleaved into chunked halves, everything padded."""
    prefix = fmt.layer_prefix(layer)
    gate_up = reader.get(expert_source_name(layer, "gate_up_proj_bias")).to(torch.bfloat16)
    out.put(f"{prefix}{fmt.GATE_UP}.bias", chunk_interleaved(gate_up, layout.padded_intermediate_size, 0.0))
    down = reader.get(expert_source_name(layer, "down_proj_bias")).to(torch.bfloat16)
    out.put(f"{prefix}{fmt.DOWN}.bias", pad_to(down, (down.shape[0], layout.padded_hidden_size)))


def _encode_expert(lane: _Lane, blocks: torch.Tensor, scales: torch.Tensor, proj: str, padded_i: int,
                   where: str) -> tuple[mxfp4.Exactness, torch.Tensor]:
    """Encode one MXFP4 expert into ``lane.buffer``, ``_ENCODE_ROWS`` source rows at a time;
    returns its exactness and scale row."""
    largest = int(scales.max())
    if largest > mxfp4.MAX_SCALE_BYTE:
        raise ConversionError(
            f"{where} holds scale byte {largest} (above {mxfp4.MAX_SCALE_BYTE}: NaN or beyond float32/BF16 "
            "range): corrupt source"
        )
    rows = scales.shape[0]
    exponents = torch.empty(rows, dtype=torch.int32)
    exactness = mxfp4.Exactness()
    place = place_gate_up if proj == fmt.GATE_UP else place_down
    for start in range(0, rows, lane.encoder.capacity):
        stop = min(rows, start + lane.encoder.capacity)
        part_blocks, part_scales = blocks[start:stop], scales[start:stop]
        t = lane.encoder.channel_exponents(part_blocks, part_scales)
        place(lane.encoder.encode(part_blocks, part_scales, t), lane.buffer, start)
        exactness.add(mxfp4.exactness(part_blocks, part_scales, t))
        exponents[start:stop] = t
    if proj == fmt.GATE_UP:
        return exactness, chunk_interleaved(mxfp4.scale_values(exponents), padded_i, 1.0)
    return exactness, pad_to(mxfp4.scale_values(exponents), (lane.buffer.shape[1],), 1.0)


def _mxfp4_projection(reader: SourceReader, layer: int, proj: str, out: _Output, layout: fmt.Layout,
                      workspace: _Workspace) -> ExpertStats:
    """All experts of one MXFP4 projection through the byte table, ``LANES`` at a time, each
    written (in the background) as soon as it is encoded."""
    short = "gate_up_proj" if proj == fmt.GATE_UP else "down_proj"
    name = f"{fmt.layer_prefix(layer)}{proj}"
    blocks_name, scales_name = expert_source_name(layer, f"{short}_blocks"), expert_source_name(layer, f"{short}_scales")
    experts, rows_out, cols_out = _spec(out.writer, f"{name}.weight").shape
    block_shape = reader.source.tensors[blocks_name][1].shape
    lanes = workspace.lanes(block_shape[2], (rows_out, cols_out))
    per_chunk = max(1, _CHUNK_BYTES // (block_shape[1] * block_shape[2] * block_shape[3]))
    scales_out = torch.empty((experts, 1, cols_out), dtype=torch.float32)
    exactness = mxfp4.Exactness()
    in_flight: list[tuple[int, _Lane, Future[tuple[mxfp4.Exactness, torch.Tensor]]]] = []

    def finish_oldest() -> None:
        expert, lane, future = in_flight.pop(0)
        result, scale_row = future.result()
        exactness.add(result)
        scales_out[expert, 0] = scale_row
        lane.write = out.put_async(f"{name}.weight", lane.buffer, offset=expert * lane.buffer.numel())

    for expert in range(experts):
        if expert % per_chunk == 0:
            reader.release()  # tensors still in flight keep their own pages mapped
            blocks_view, scales_view = reader.slice(blocks_name), reader.slice(scales_name)
        if len(in_flight) == len(lanes):
            finish_oldest()
        lane = lanes[expert % len(lanes)]
        lane.wait_written()
        future = workspace.pool.submit(_encode_expert, lane, blocks_view[expert], scales_view[expert], proj,
                                       layout.padded_intermediate_size, f"{scales_name}[{expert}]")
        in_flight.append((expert, lane, future))
    while in_flight:
        finish_oldest()
    del blocks_view, scales_view
    reader.release()
    workspace.wait()
    out.put(f"{name}.scale", scales_out)
    return ExpertStats(f"{name}.weight", exactness.values, exactness.inexact, exactness.flushed_to_zero,
                       exactness.max_rel_error)


def _dense_projection(reader: SourceReader, layer: int, proj: str, out: _Output, layout: fmt.Layout,
                      workspace: _Workspace) -> ExpertStats:
    """All experts of one dense (BF16) projection, one expert at a time, amax/240 scales."""
    short = "gate_up_proj" if proj == fmt.GATE_UP else "down_proj"
    name = f"{fmt.layer_prefix(layer)}{proj}"
    experts, rows_out, cols_out = _spec(out.writer, f"{name}.weight").shape
    scales_out = torch.empty((experts, 1, cols_out), dtype=torch.float32)
    stats = ExpertStats(f"{name}.weight")
    rel_sum, nonzero = 0.0, 0
    for expert in range(experts):
        weight = reader.slice(expert_source_name(layer, short))[expert].float()  # gate_up [H, 2I]; down [I, H]
        reader.release()
        dense = torch.zeros((rows_out, cols_out), dtype=torch.float32)
        if proj == fmt.GATE_UP:
            h, two_i = weight.shape
            dense.view(rows_out, 2, cols_out // 2)[:h, :, : two_i // 2] = weight.view(h, two_i // 2, 2).permute(0, 2, 1)
        else:
            dense[: weight.shape[0], : weight.shape[1]] = weight
        q, scale = quantize_expertwise(dense.unsqueeze(0))
        scales_out[expert] = scale[0]
        error = (q.float() * scale - dense).abs()[0]
        mask = dense != 0
        rel = error[mask] / dense.abs()[mask]
        stats.values += weight.numel()
        stats.inexact += int((error != 0).sum())
        stats.flushed_to_zero += int((mask & (q[0].float() == 0)).sum())
        if rel.numel():
            stats.max_rel_error = max(stats.max_rel_error, float(rel.max()))
            rel_sum += float(rel.double().sum())
            nonzero += rel.numel()
        out.put(f"{name}.weight", q[0], offset=expert * rows_out * cols_out)
    out.put(f"{name}.scale", scales_out)
    stats.mean_rel_error = rel_sum / nonzero if nonzero else 0.0
    return stats


def output_config(source_config: dict[str, Any], dims: fmt.ModelDims) -> dict[str, Any]:
    """The source ``config.json`` with its MXFP4 ``quantization_config`` replaced by ours."""
    config = {key: value for key, value in source_config.items() if key != "quantization_config"}
    config["quantization_config"] = fmt.hf_config(dims)["quantization_config"]
    return config


def _check_paths(source_root: str, out: str) -> None:
    real_src, real_out = os.path.realpath(source_root), os.path.realpath(out)
    if real_out == real_src or real_out.startswith(real_src + os.sep) or real_src.startswith(real_out + os.sep):
        raise ConversionError(
            f"OUT {out} overlaps SRC {source_root}: the source is never modified; choose an output outside it"
        )


def _progress_bar(enabled: bool, total: int, layers: int) -> Any:
    from tqdm import tqdm

    show = enabled and sys.stderr.isatty()
    return tqdm(total=total, unit="B", unit_scale=True, desc=f"convert 0/{layers} layers",
                file=sys.stderr, disable=not show, dynamic_ncols=True)


def convert(
    src: str | os.PathLike[str],
    out: str | os.PathLike[str],
    *,
    padded_hidden_size: int | None = None,
    padded_intermediate_size: int | None = None,
    max_shard_size: str | int = "5GB",
    overwrite: bool = False,
    progress: bool = True,
    provenance: Mapping[str, Any] | None = None,
    extra_files: Mapping[str, str | os.PathLike[str]] | None = None,
) -> ConversionReport:
    """Convert the HF MXFP4 or HF BF16 GPT-OSS checkpoint ``src`` into a normalized FP8
    checkpoint at ``out``.

    Args:
        src: the HF checkpoint directory (config.json + model.safetensors.index.json); its
            ``original/`` subdirectory is never read. ``src`` is never modified.
        out: the output directory; must be absent or empty unless ``overwrite``.
        padded_hidden_size / padded_intermediate_size: H' and I' (H or I plus a multiple of 32).
        max_shard_size: largest shard, e.g. ``"5GB"``.
        progress: show a tqdm bar on stderr (only when it is a terminal).
        provenance: extra fields for the index's ``source`` metadata (e.g. the Hub repo and the
            commit it resolved to; ``hub.ResolvedSource.provenance()``).
        extra_files: output file name → file to copy beside the checkpoint (tokenizer and
            generation config: ``hub.companion_files(src)``), inside the atomic write.

    Returns:
        A ``ConversionReport`` (bytes, time, exactness). Raises ``ConversionError`` for a source
        that is not an HF GPT-OSS checkpoint, an existing output, or bad padded sizes. Example::

            report = convert("gpt-oss-120b", "gpt-oss-120b-fp8")
            print(report.render_text())
    """
    started = time.perf_counter()
    source = open_source(src)
    dims = source.dims
    layout = fmt.Layout(dims, padded_hidden_size or dims.hidden_size, padded_intermediate_size or dims.intermediate_size)
    problems = layout.padding_problems()
    if problems:
        raise ConversionError("; ".join(problems))
    out_path = os.path.abspath(os.fspath(out))
    _check_paths(source.root, out_path)
    try:
        shard_bytes = parse_size(max_shard_size)
    except ValueError as exc:
        raise ConversionError(str(exc)) from None
    profile = fmt.profile_for_dims(dims)
    renames = non_expert_names(dims)
    by_layer: dict[int, list[tuple[str, str]]] = {}
    globals_: list[tuple[str, str]] = []
    for hf_name, name in renames.items():
        match = re.match(r"layers\.(\d+)\.", name)
        (by_layer.setdefault(int(match.group(1)), []) if match else globals_).append((hf_name, name))
    project = _mxfp4_projection if source.kind == SOURCE_MXFP4 else _dense_projection
    stats: list[ExpertStats] = []
    bar = _progress_bar(progress, fmt.expected_total_size(layout), dims.num_hidden_layers)
    with bar, SourceReader(source) as reader, CheckpointWriter(
        out_path, layout, profile, output_config(source.config, dims), max_shard_size=shard_bytes,
        source={**source.provenance(), **(provenance or {})}, overwrite=overwrite, extra_files=extra_files,
    ) as writer, ThreadPoolExecutor(max_workers=1, thread_name_prefix="convert-write") as pool, ThreadPoolExecutor(
        max_workers=_Workspace.LANES, thread_name_prefix="convert-encode"
    ) as compute, _single_threaded_torch():
        # the pools exit before the writer: no write is still running when it closes its files
        workspace = _Workspace(compute)
        output = _Output(writer, bar, pool)
        for hf_name, name in globals_:
            _copy_padded(reader, hf_name, output, name)
        for layer in range(dims.num_hidden_layers):
            for hf_name, name in by_layer[layer]:
                _copy_padded(reader, hf_name, output, name)
            _expert_biases(reader, layer, output, layout)
            for proj in (fmt.GATE_UP, fmt.DOWN):
                stats.append(project(reader, layer, proj, output, layout, workspace))
            bar.set_description(f"convert {layer + 1}/{dims.num_hidden_layers} layers")
        report = ConversionReport(
            source=source.root, source_format=source.kind, out=out_path, profile=profile,
            padded_hidden_size=layout.padded_hidden_size, padded_intermediate_size=layout.padded_intermediate_size,
            layers=dims.num_hidden_layers, tensors=len(writer.planned), bytes_written=output.bytes,
            fp8_bytes=output.fp8_bytes, elapsed_s=0.0, experts=stats,
        )
        assert writer.source is not None
        writer.source["exactness"] = report.exactness_summary()
        bar.set_description("hashing shards")
        writer.commit()
    report.elapsed_s = time.perf_counter() - started
    return report

