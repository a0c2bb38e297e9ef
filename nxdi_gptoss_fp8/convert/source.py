"""Reading a source checkpoint: its files, its tensors, and the protocol every source kind follows.

A source directory holds ``config.json`` and the top-level HF set named by
``model.safetensors.index.json`` (or a single ``model.safetensors``); never the ``original/`` set
the published repos ship beside it, never a pickle. Every input is checked to be a regular file
before it is opened (a FIFO would block the open), every shard header is parsed and matched
against the index before any tensor is read.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import re
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from .. import format as fmt
from .._version import __version__
from ..errors import ConversionError, FileTooLargeError, NotRegularFileError
from ..safeio.files import not_regular_reason, read_bounded
from ..safeio.json_file import MAX_JSON_FILE_BYTES, JsonFileError, read_json_file
from ..safeio.safetensors_header import HeaderError, TensorInfo, read_header
from ..units import plural

if TYPE_CHECKING:
    import torch

__all__ = [
    "EXPERTS",
    "FINGERPRINT_FIELDS",
    "FINGERPRINT_PARTS",
    "FLOAT_DTYPES",
    "HF_PREFIX",
    "SINGLE_FILE",
    "Source",
    "SourceReader",
    "SourceSpec",
    "check_claimed_dims",
    "check_tensors",
    "expert_source_name",
    "header",
    "listing",
    "non_expert_names",
    "non_expert_specs",
    "provenance_fingerprint",
    "read_json",
    "read_source_files",
    "shard_files",
]

HF_PREFIX = "model."
SINGLE_FILE = "model.safetensors"
FLOAT_DTYPES = ("BF16", "F16", "F32")
EXPERTS = "mlp.experts."
_MOVED = {
    "self_attn.sinks": "self_attn.learned_sinks.sink",
    "mlp.router.weight": "feed_forward.moe.router.linear_router.weight",
    "mlp.router.bias": "feed_forward.moe.router.linear_router.bias",
}
_HF_SNAPSHOT = re.compile(r"models--([^/]+)--([^/]+)/snapshots/([0-9a-f]{40})")


@dataclass(frozen=True)
class SourceSpec:
    """One tensor a source checkpoint must hold: name, shape and allowed dtypes."""

    name: str
    shape: tuple[int, ...]
    dtypes: tuple[str, ...]


def non_expert_names(dims: fmt.ModelDims) -> dict[str, str]:
    """HF name → normalized name of every tensor that is only renamed and padded (every source kind)."""
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


def non_expert_specs(dims: fmt.ModelDims) -> dict[str, SourceSpec]:
    """The renamed-only tensors with their unpadded shapes; any float dtype."""
    unpadded = {spec.name: spec for spec in fmt.expected_namespace(fmt.Layout.unpadded(dims)).values()}
    return {hf: SourceSpec(hf, unpadded[ours].shape, FLOAT_DTYPES) for hf, ours in non_expert_names(dims).items()}


def expert_source_name(layer: int, short: str) -> str:
    """``model.layers.L.mlp.experts.<short>``."""
    return f"{HF_PREFIX}{fmt.layer_prefix(layer)}{EXPERTS}{short}"


@dataclass
class Source:
    """A detected source checkpoint: its kind, config, dimensions, where each tensor is, and the
    options its kind resolved (e.g. the compressed-tensors gate/up split)."""

    root: str
    kind: str
    config: dict[str, Any]
    dims: fmt.ModelDims
    tensors: dict[str, tuple[str, TensorInfo]]  # name → (file path, header entry)
    options: dict[str, Any] = field(default_factory=dict)

    def provenance(self) -> dict[str, Any]:
        """What the index's ``source`` metadata records: what identifies the source wherever it
        sits (its format, the Hub repo and commit when it is an HF cache snapshot, its
        ``fingerprint``), never the local path it was read from; no timestamps, so the output is
        reproducible. ``config.json``'s ``_name_or_path`` names no repo here (and the output drops it)."""
        record: dict[str, Any] = {"format": self.kind, "converter": f"nxdi-gptoss-fp8 {__version__}", **self.options}
        match = _HF_SNAPSHOT.search(self.root.replace(os.sep, "/"))
        if match:
            record["repo"], record["revision"] = f"{match.group(1)}/{match.group(2)}", match.group(3)
        record["fingerprint"] = self.fingerprint()
        return record

    def fingerprint(self) -> dict[str, str]:
        """What identifies this source's files, not where they are (``provenance_fingerprint``): reads
        the config, the headers and a few blocks of each shard, so ``verify-conversion`` can tell
        at once whether a source is the one an output records."""
        return provenance_fingerprint(self.root, sorted({path for path, _info in self.tensors.values()}))


FINGERPRINT_FIELDS = ("config_sha256", "headers_sha256", "samples_sha256")
FINGERPRINT_PARTS = {"config_sha256": "config.json", "headers_sha256": "shard headers",
                     "samples_sha256": "sampled tensor data"}


def provenance_fingerprint(root: str, shard_paths: list[str]) -> dict[str, str]:
    """``Source.fingerprint`` of the files at ``root``, what the converter's provenance records to
    tell a source's files wherever they sit (not ``checkpoint_identity``, which binds pre-sharded
    weights to a normalized checkpoint): SHA-256 of ``config.json``, of every
    shard's name and header, and of every shard's name and evenly spread data samples (the
    pre-sharded manifest's blocks); ``ConversionError`` when a file cannot be read."""
    from ..validate.presharded_manifest import SAMPLE_BLOCK, SAMPLE_BLOCKS, read_rank

    config_path = os.path.join(root, fmt.CONFIG_FILE)
    try:
        config = hashlib.sha256(read_bounded(config_path, MAX_JSON_FILE_BYTES)[0]).hexdigest()
        headers, samples = hashlib.sha256(), hashlib.sha256()
        for path in shard_paths:
            read = read_rank(path, SAMPLE_BLOCKS, SAMPLE_BLOCK)
            name = os.path.basename(path)
            headers.update(f"{name}\0{hashlib.sha256(read.header).hexdigest()}\n".encode())
            samples.update(f"{name}\0{read.sample_sha256}\n".encode())
    except (OSError, NotRegularFileError, HeaderError, FileTooLargeError) as exc:
        raise ConversionError(f"cannot fingerprint the source at {root}: {getattr(exc, 'strerror', None) or exc}") from None
    return {"config_sha256": config, "headers_sha256": headers.hexdigest(), "samples_sha256": samples.hexdigest()}


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

            reason = _not_regular(path)
            if reason:  # safe_open would block on a FIFO
                raise ConversionError(f"{reason}: a checkpoint shard must be a regular file")
            self._handles[path] = self._stack.enter_context(safe_open(path, framework="pt"))
        return self._handles[path]

    def slice(self, name: str) -> Any:
        """A lazily indexed view: ``reader.slice(name)[e]`` reads expert ``e`` only."""
        path, _ = self.source.tensors[name]
        return self._handle(path).get_slice(name)

    def get(self, name: str) -> torch.Tensor:
        path, _ = self.source.tensors[name]
        return self._handle(path).get_tensor(name)


# --------------------------------------------------------------------------- files


def _not_regular(path: str) -> str | None:
    try:
        return not_regular_reason(path)
    except OSError:
        return None  # missing: the caller's own open says so


def read_json(path: str, what: str) -> Any:
    """Strictly parsed JSON of a regular file of at most ``MAX_JSON_FILE_BYTES``;
    ``ConversionError`` naming the file otherwise."""
    try:
        return read_json_file(path, what=what)
    except JsonFileError as exc:
        if exc.not_read:  # a NotRegularFileError's message says what the path is
            raise ConversionError(f"cannot read {path}: {getattr(exc.cause, 'strerror', None) or exc.cause}") from None
        if exc.oversized:
            raise ConversionError(f"{path} is larger than {plural(exc.limit, 'byte')}, too large for a GPT-OSS {what}: "
                                  "re-download the file") from None
        raise ConversionError(f"{path} is not valid JSON ({exc.cause}): re-download the file") from None


def header(path: str) -> Any:
    """The parsed safetensors header of the regular file ``path``."""
    reason = _not_regular(path)
    if reason:
        raise ConversionError(f"{reason}: a checkpoint shard must be a regular file")
    try:
        return read_header(path)
    except HeaderError as exc:
        raise ConversionError(f"{path}: not a valid safetensors file ({exc}): re-download it") from None
    except OSError as exc:
        raise ConversionError(f"cannot read {path}: {exc.strerror}") from None


def listing(root: str) -> str:
    """A short listing of ``root`` for messages."""
    try:
        entries = sorted(os.listdir(root))
    except OSError:
        return "nothing readable"
    shown = ", ".join(e + ("/" if os.path.isdir(os.path.join(root, e)) else "") for e in entries[:12])
    return (shown + (f", … ({plural(len(entries), 'entry', 'entries')})" if len(entries) > 12 else "")) or "an empty directory"


def shard_files(root: str) -> dict[str, str]:
    """tensor name → shard file name, from the top-level HF index or the single-file header."""
    index_path = os.path.join(root, fmt.INDEX_FILE)
    if os.path.lexists(index_path):
        index = read_json(index_path, fmt.INDEX_FILE)
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
    if os.path.lexists(single):
        return dict.fromkeys(header(single).tensors, SINGLE_FILE)
    hint = ""
    if os.path.basename(os.path.normpath(root)) == "original":
        hint = "; this is the OpenAI original/ set: point SRC at its parent directory (the HF set)"
    raise ConversionError(f"{root} has no {fmt.INDEX_FILE} or {SINGLE_FILE} (found: {listing(root)}){hint}")


def read_source_files(src: str | os.PathLike[str]) -> tuple[str, dict[str, Any], fmt.ModelDims,
                                                             dict[str, tuple[str, TensorInfo]]]:
    """(root, config, dims, tensors) of a GPT-OSS source directory; every header parsed and
    matched against the index. Kind-independent."""
    from ..recognize import compiled_model_dir

    root = os.path.abspath(os.fspath(src))
    if not os.path.isdir(root):
        raise ConversionError(f"{root} is not a directory: SRC is a checkpoint directory holding config.json")
    compiled = compiled_model_dir(root)
    if compiled is not None:  # NxDI's compile output (or its weights/): loaded as it is, never converted
        raise ConversionError(f"{root} is {'the weights/ folder of ' if compiled != root else ''}a compiled NxDI model "
                              "directory, not a source checkpoint (HF MXFP4, HF BF16 or compressed-tensors FP8): "
                              f"check it with `nxdi-gptoss-fp8 validate {compiled}` and load it with NxDI as the "
                              "compiled model path")
    parent = os.path.dirname(root)
    if os.path.basename(root) == "original" and os.path.isfile(os.path.join(parent, fmt.CONFIG_FILE)):
        raise ConversionError(
            f"{root} is the OpenAI original/ set of the repo at {parent}: point SRC at its parent "
            "directory (the HF set); the two sets are never mixed"
        )
    config_path = os.path.join(root, fmt.CONFIG_FILE)
    if not os.path.lexists(config_path):
        raise ConversionError(f"{root} has no {fmt.CONFIG_FILE} (found: {listing(root)})")
    config = read_json(config_path, fmt.CONFIG_FILE)
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

    weight_map = shard_files(root)
    tensors: dict[str, tuple[str, TensorInfo]] = {}
    for shard in sorted(set(weight_map.values())):
        path = os.path.join(root, shard)
        if not os.path.lexists(path):
            raise ConversionError(f"{path} is named by the index but missing: finish the download")
        for name, info in header(path).tensors.items():
            if weight_map.get(name) != shard:
                raise ConversionError(
                    f"{path} holds {name!r}, which the index assigns to {weight_map.get(name)!r}: "
                    "mixed or half-copied checkpoint sets"
                )
            tensors[name] = (path, info)
    missing_files = sorted(set(weight_map) - set(tensors))
    if missing_files:
        raise ConversionError(f"the index lists {missing_files[0]!r} but no shard holds it: re-download")
    return root, config, dims, tensors


_LAYER_NAME = re.compile(rf"^{re.escape(HF_PREFIX)}layers\.(\d{{1,12}})\.")


def check_claimed_dims(config_path: str, dims: fmt.ModelDims, tensors: dict[str, tuple[str, TensorInfo]]) -> None:
    """Every dimension ``config.json`` claims, against the tensors the index and headers hold,
    before any work is planned from it: the layer count against the layers named, and each
    dimension against the shape of a tensor that carries it (when present: a missing tensor is
    reported later, by name). Work after this is proportional to the tensors that exist, so a
    config claiming 10^6 layers or experts is refused at once."""
    layers = {int(match[1]) for name in tensors if (match := _LAYER_NAME.match(name))}
    if len(layers) != dims.num_hidden_layers or (layers and max(layers) != dims.num_hidden_layers - 1):
        found = f"{len(layers)} (layers {min(layers)}…{max(layers)})" if layers else "none"
        raise ConversionError(
            f"{config_path}: num_hidden_layers is {dims.num_hidden_layers:,} but the index and shard headers hold "
            f"tensors for {found}: config.json from another model, or an incomplete download")
    q, kv = dims.num_attention_heads * dims.head_dim, dims.num_key_value_heads * dims.head_dim
    claims = [
        (f"{HF_PREFIX}embed_tokens.weight", 0, dims.vocab_size, "vocab_size"),
        (f"{HF_PREFIX}embed_tokens.weight", 1, dims.hidden_size, "hidden_size"),
        (f"{HF_PREFIX}layers.0.mlp.router.weight", 0, dims.num_local_experts, "num_local_experts"),
        (f"{HF_PREFIX}layers.0.self_attn.sinks", 0, dims.num_attention_heads, "num_attention_heads"),
        (f"{HF_PREFIX}layers.0.self_attn.q_proj.weight", 0, q, "num_attention_heads × head_dim"),
        (f"{HF_PREFIX}layers.0.self_attn.k_proj.weight", 0, kv, "num_key_value_heads × head_dim"),
    ]
    for name, axis, claimed, label in claims:
        entry = tensors.get(name)
        if entry is None or len(entry[1].shape) <= axis:
            continue
        held = entry[1].shape[axis]
        if held != claimed:
            raise ConversionError(
                f"{config_path}: {label} is {claimed:,} but {entry[0]} holds {name} with {held:,} there "
                f"(shape {list(entry[1].shape)}): config.json and weights come from different models")


def check_tensors(tensors: dict[str, tuple[str, TensorInfo]], specs: dict[str, SourceSpec], kind: str) -> None:
    """Every spec present with its shape and dtype, and nothing else."""
    missing = sorted(set(specs) - set(tensors))
    extra = sorted(set(tensors) - set(specs))
    if missing:
        raise ConversionError(
            f"{kind} source lacks {plural(len(missing), 'tensor')} the config implies (first: {missing[0]}): "
            "incomplete download, or config.json from another model"
        )
    if extra:
        raise ConversionError(
            f"{kind} source has {plural(len(extra), 'tensor')} a GPT-OSS checkpoint does not (first: {extra[0]}): "
            "not a GPT-OSS HF checkpoint, or mixed sets"
        )
    for name, spec in specs.items():
        path, info = tensors[name]
        if info.shape != spec.shape or info.dtype not in spec.dtypes:
            raise ConversionError(
                f"{path}: {name} is {info.dtype}{list(info.shape)}, expected "
                f"{'/'.join(spec.dtypes)}{list(spec.shape)} from config.json"
            )
