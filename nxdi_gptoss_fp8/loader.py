"""Zero-copy loading of a preflighted normalized checkpoint into NxDI's final state dict.

The loader never parses anything itself: it maps the shards that a preflight report describes,
and only when that report is bound to this load (``binding.Binding``: the same resolved
directory, a complete and clean run, the same NxDI config and custom-model opt-in); otherwise
``ReportBindingError`` before anything is mapped. Each shard is then re-checked on the open
descriptor against the identity the preflight bound (device, inode, size, mtime_ns, ctime_ns,
the SHA-256 of its header bytes, and that it still resolves inside the directory), so a file
rewritten, truncated, relinked or replaced in between is refused (``IntegrityError``). Each
shard is mapped private copy-on-write (``mmap.ACCESS_COPY``): NxD's preshard hooks may modify
tensors in place, and those writes land in private anonymous pages, never in the checkpoint.
Every stored tensor is a view into its mapping (``torch.frombuffer``).

Like any mmap loader, a mapping still shows later writes to the file and a truncation kills the
reader (SIGBUS). Two opt-ins (``LoadPolicy``) cover checkpoints that may change while loading:
verifying ``shard_sha256`` over the mapped bytes, and reading the shards into private memory.

Then the runtime-derived entries (docs/format.md, "Entries that are never stored") are
synthesized exactly as NxDI's GPT-OSS conversion (HF branch, BF16 compute) would for the given
NeuronConfig, and every tensor is already in the dtype NxDI's ``checkpoint_loader_fn`` would cast it to, so its ``_cast_helper``
finds nothing to copy. Requires torch.

One module over 500 lines: one load path (binding checks, mapping, runtime-derived entries)
sharing one state; split, each part would take the whole state as arguments.
"""

from __future__ import annotations

import hashlib
import itertools
import logging
import mmap
import os
import stat
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import torch

from . import format as fmt
from .errors import FailedReportError, IntegrityError, LoadError, ReportBindingError
from .machine import opened_path, usable_cpus
from .safeio.files import FileIdentity
from .safeio.hashing import hash_buffers
from .safeio.safetensors_header import HeaderError, SafetensorsHeader, read_header_bytes
from .units import plural
from .validate.binding import Binding, config_fingerprint
from .validate.findings import PreflightReport
from .validate.integrity import DIGESTS_KEY
from .validate.nxdi_config import config_attr, load_choices, neuron_config_view
from .validate.pipeline import allow_custom_from_env, preflight
from .validate.view import CheckpointView

__all__ = [
    "TORCH_DTYPES", "LoadPolicy", "LoadedCheckpoint", "RuntimeOptions", "check_report", "describe_load",
    "fused_qkv_views", "load_checkpoint", "load_state_dict", "logger", "map_shard", "tensor_view", "verify_loaded",
]

logger = logging.getLogger(__name__)

# safetensors dtype name → torch dtype (every dtype the format uses, plus the plain numeric ones)
TORCH_DTYPES: dict[str, torch.dtype] = {
    "F8_E4M3": torch.float8_e4m3fn,
    "F8_E5M2": torch.float8_e5m2,
    "BF16": torch.bfloat16,
    "F16": torch.float16,
    "F32": torch.float32,
    "F64": torch.float64,
    "BOOL": torch.bool,
    "U8": torch.uint8,
    "I8": torch.int8,
    "I16": torch.int16,
    "I32": torch.int32,
    "I64": torch.int64,
}
_DTYPE_NAMES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}


@dataclass(frozen=True)
class RuntimeOptions:
    """The NeuronConfig settings that shape the derived entries and the final dtypes.

    Defaults are NxDI's NeuronConfig defaults (``logical_nc_config`` defaults to 1 here, NxDI
    reads it from the platform; ``lm_head_pad`` defaults to ``logical_nc_config > 1`` as there).
    """

    tp_degree: int = 1
    local_ranks_size: int = 1
    fused_qkv: bool = False
    vocab_parallel: bool = False
    attention_dp_degree: int = 1
    cp_degree: int = 1
    lm_head_pad: bool = False
    lm_head_pad_alignment_size: int = 1
    logical_nc_config: int = 1
    torch_dtype: torch.dtype = torch.bfloat16
    cast_type: str = "config"

    @classmethod
    def from_config(cls, config: Any) -> RuntimeOptions:
        """Read the options from an NxDI InferenceConfig or NeuronConfig (or a mapping of one)."""
        if config is None:
            return cls()
        nc = neuron_config_view(config)
        tp = config_attr(nc, "tp_degree", 1)
        world = config_attr(nc, "world_size", None) or tp * config_attr(nc, "pp_degree", 1) * config_attr(nc, "ep_degree", 1)
        lnc = config_attr(nc, "logical_nc_config", 1)
        dtype = config_attr(nc, "torch_dtype", torch.bfloat16)
        if isinstance(dtype, str):
            if dtype not in _DTYPE_NAMES:
                raise LoadError(f"neuron_config.torch_dtype {dtype!r} is not one of {sorted(_DTYPE_NAMES)}")
            dtype = _DTYPE_NAMES[dtype]
        lm_head_pad = config_attr(nc, "lm_head_pad", None)
        return cls(
            tp_degree=tp,
            local_ranks_size=config_attr(nc, "local_ranks_size", None) or world,
            fused_qkv=bool(config_attr(nc, "fused_qkv", False)),
            vocab_parallel=bool(config_attr(nc, "vocab_parallel", False)),
            attention_dp_degree=config_attr(nc, "attention_dp_degree", 1),
            cp_degree=config_attr(nc, "cp_degree", 1),
            lm_head_pad=bool(lnc > 1 if lm_head_pad is None else lm_head_pad),
            lm_head_pad_alignment_size=config_attr(nc, "lm_head_pad_alignment_size", 1),
            logical_nc_config=lnc,
            torch_dtype=dtype,
            cast_type=config_attr(nc, "cast_type", "config"),
        )

    @property
    def casts(self) -> bool:
        """Whether NxDI's ``checkpoint_loader_fn`` would cast floating tensors (``_cast_helper``)."""
        return self.torch_dtype != torch.float32 and self.cast_type == "config"

    def final_dtype(self, name: str, dtype: torch.dtype) -> torch.dtype:
        """The dtype ``_cast_helper`` leaves a tensor in: floating tensors other than e4m3fn
        FP8 and ``*scale`` become ``torch_dtype`` when it casts at all."""
        if not self.casts or not dtype.is_floating_point or dtype == torch.float8_e4m3fn or name.endswith("scale"):
            return dtype
        return self.torch_dtype

    def pads_lm_head(self, vocab_size: int) -> bool:
        """NxDI's lm_head padding rule: pad (and add ``lm_head.bias``) when enabled and the
        vocabulary does not divide into tp × alignment × logical cores."""
        multiple = self.tp_degree * self.lm_head_pad_alignment_size * self.logical_nc_config
        return self.lm_head_pad and vocab_size % multiple != 0


@dataclass(frozen=True)
class LoadPolicy:
    """How the shard bytes reach NxDI: mapped (the default) or read into private memory, and
    whether ``shard_sha256`` is verified over the very bytes the tensors view.

    Each choice is an environment variable and a ``neuron_config`` attribute
    (``format.VERIFY_AT_LOAD_*``, ``format.LOAD_MODE_*``): verification is on when either asks
    for it; the two load-mode settings must not disagree.
    """

    verify_digests: bool = False
    load_mode: str = fmt.LOAD_MODE_MMAP

    @property
    def private(self) -> bool:
        return self.load_mode == fmt.LOAD_MODE_PRIVATE

    @classmethod
    def resolve(cls, config: Any = None, environ: Mapping[str, str] | None = None) -> LoadPolicy:
        """Read both choices from the environment and the NeuronConfig; ``LoadError`` for a value
        that is neither on/off (verify) nor a known mode, or for two disagreeing modes."""
        verify, mode = load_choices(config, environ)  # the one reader (the start plan reads it too)
        return cls(verify_digests=verify, load_mode=mode)


@dataclass
class LoadedCheckpoint:
    """A loaded state dict and what loading it cost."""

    state_dict: dict[str, torch.Tensor]
    shards: int = 0
    mapped: list[str] = field(default_factory=list)  # stored tensors, views into the mappings
    mapped_bytes: int = 0
    mapped_dtypes: dict[str, int] = field(default_factory=dict)  # safetensors dtype → tensor count
    derived: list[str] = field(default_factory=list)  # synthesized from the runtime config
    cast: list[str] = field(default_factory=list)  # stored tensors copied to another dtype
    copied_bytes: int = 0
    policy: LoadPolicy = field(default_factory=LoadPolicy)
    private_bytes: int = 0  # shard bytes read into anonymous memory (load mode "private")
    verified_bytes: int = 0  # bytes hashed against shard_sha256 at load
    verify_s: float = 0.0

    def describe(self) -> str:
        """A few lines saying what was mapped, derived and copied."""
        dtypes = ", ".join(f"{count} {dtype}" for dtype, count in sorted(self.mapped_dtypes.items()))
        how = (f"read into private memory ({plural(self.private_bytes, 'byte')})" if self.policy.private
               else "as copy-on-write views, no tensor byte read or copied")
        lines = [
            f"mapped {plural(len(self.mapped), 'tensor')} ({plural(self.mapped_bytes, 'byte')}) from {plural(self.shards, 'shard')} "
            f"{how}: {dtypes}",
            f"derived {plural(len(self.derived), 'runtime entry', 'runtime entries')} ({fmt.format_document_ref()}, Entries that are never stored): "
            + ", ".join(_summarize_keys(self.derived)),
            f"copied {plural(self.copied_bytes, 'byte')} in total (derived entries"
            + (f", {plural(len(self.cast), 'dtype cast')}" if self.cast else "") + ")",
        ]
        if self.policy.verify_digests:
            lines.append(f"verified {plural(self.shards, 'shard')} ({plural(self.verified_bytes, 'byte')}) against {DIGESTS_KEY} "
                         f"over the loaded bytes in {self.verify_s:.2f} s")
        return "\n".join(lines)


def _summarize_keys(keys: list[str]) -> list[str]:
    """``layers.0.x``, ``layers.1.x`` → ``layers.*.x ×2``; order of first appearance."""
    counts: dict[str, int] = {}
    for key in keys:
        parts = key.split(".")
        if len(parts) > 2 and parts[0] == "layers" and parts[1].isdigit():
            key = ".".join(["layers", "*", *parts[2:]])
        counts[key] = counts.get(key, 0) + 1
    return [f"{key} ×{count}" if count > 1 else key for key, count in counts.items()]


# --------------------------------------------------------------------------- mapping


def _refuse(shard: str, changes: list[str]) -> IntegrityError:
    return IntegrityError(
        f"{shard} changed after the preflight: {'; '.join(changes)}. Nothing was loaded; wait "
        "until the checkpoint is no longer being written, then load again (the preflight runs again)"
    )


def _read_private(fd: int, size: int, shard: str) -> mmap.mmap:
    """Read the whole file behind ``fd`` into anonymous memory (later writes to the file do not show)."""
    buffer = mmap.mmap(-1, size, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    with memoryview(buffer) as view:
        position = 0
        while position < size:
            count = os.preadv(fd, [view[position:]], position)
            if count <= 0:
                buffer.close()
                raise _refuse(shard, [f"it ended at byte {position:,} of {size:,} while being read (truncated)"])
            position += count
    return buffer


def map_shard(shard: str, header: SafetensorsHeader, *, root: str, private: bool = False) -> mmap.mmap:
    """Map one shard private copy-on-write (or, ``private``, read it into anonymous memory) after
    checking it is the file the preflight read, still inside the resolved directory ``root``.

    The checks run on the open descriptor that is then mapped, so the path cannot be swapped
    between check and map; the identity is checked again afterwards.
    """
    path = os.path.join(root, shard)
    try:  # O_NONBLOCK: a FIFO swapped in must not block the open (it then fails the identity check)
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_CLOEXEC", 0) | getattr(os, "O_NONBLOCK", 0))
    except OSError as exc:
        raise _refuse(shard, [f"it can no longer be opened ({exc.strerror or exc})"]) from None
    try:
        status = os.fstat(fd)
        changes = FileIdentity.of(status).changes_since(header.identity)
        target = opened_path(fd, path)
        if os.path.dirname(target) != root:
            changes.insert(0, f"it now resolves to {target}, outside the checkpoint directory (a link was put in its place)")
        if not changes and stat.S_ISREG(status.st_mode):
            with open(fd, "rb", buffering=0, closefd=False) as handle:
                try:
                    raw = read_header_bytes(handle, status.st_size)
                except HeaderError as exc:
                    raw, changes = None, [*changes, f"its header no longer reads ({exc})"]
            if raw is not None and len(raw) != header.header_length:
                changes.append(f"header length {header.header_length:,} → {len(raw):,}")
            elif raw is not None and hashlib.sha256(raw).hexdigest() != header.header_sha256:
                changes.append("header bytes differ (tensor names, shapes or offsets were rewritten)")
        if changes:
            raise _refuse(shard, changes)
        try:
            mapping = (_read_private(fd, header.identity.size, shard) if private
                       else mmap.mmap(fd, 0, access=mmap.ACCESS_COPY))
        except (OSError, ValueError) as exc:
            raise LoadError(f"cannot {'read' if private else 'map'} {shard} ({plural(header.identity.size, 'byte')}): {exc}") from None
        changes = FileIdentity.of(os.fstat(fd)).changes_since(header.identity)
        if changes or len(mapping) != header.identity.size:
            mapping.close()
            raise _refuse(shard, changes or ["its mapped size differs"])
        return mapping
    finally:
        os.close(fd)


def _range_view(mapping: mmap.mmap, header: SafetensorsHeader, begin: int, end: int, dtype_name: str,
                shape: tuple[int, ...], name: str) -> torch.Tensor:
    dtype = TORCH_DTYPES.get(dtype_name)
    if dtype is None:
        raise LoadError(f"{name}: dtype {dtype_name} cannot be loaded as a torch tensor")
    if end == begin:
        return torch.empty(shape, dtype=dtype)
    flat = torch.frombuffer(mapping, dtype=torch.uint8, count=end - begin, offset=header.data_offset + begin)
    return flat.view(dtype).reshape(shape)


def tensor_view(mapping: mmap.mmap, header: SafetensorsHeader, name: str) -> torch.Tensor:
    """The tensor ``name`` of ``header`` as a view into ``mapping`` (no bytes copied)."""
    info = header.tensors[name]
    return _range_view(mapping, header, info.begin, info.end, info.dtype, info.shape, name)


def fused_qkv_views(view: CheckpointView, mappings: Mapping[str, mmap.mmap]) -> dict[str, torch.Tensor]:
    """``Wqkv.{weight,bias}`` as views of the file where a layer's q, k, v tensors lie back to
    back in one shard in that order (our writer places them so): concatenating rows of
    row-major tensors is concatenating their bytes. Layers stored otherwise are not listed
    (the loader concatenates those, a copy)."""
    views: dict[str, torch.Tensor] = {}
    for layer in range(view.layout.dims.num_hidden_layers):  # type: ignore[union-attr]
        attn = f"{fmt.layer_prefix(layer)}self_attn."
        for part in ("weight", "bias"):
            keys = [f"{attn}{proj}_proj.{part}" for proj in "qkv"]
            shard = view.weight_map[keys[0]]
            if any(view.weight_map[key] != shard for key in keys):
                continue
            header = view.headers[shard]
            infos = [header.tensors[key] for key in keys]
            if any(a.end != b.begin for a, b in itertools.pairwise(infos)):
                continue
            shape = (sum(info.shape[0] for info in infos), *infos[0].shape[1:])
            fused = f"{attn}Wqkv.{part}"
            views[fused] = _range_view(mappings[shard], header, infos[0].begin, infos[-1].end, infos[0].dtype, shape, fused)
    return views


# --------------------------------------------------------------------------- derived entries


def _add_derived(result: LoadedCheckpoint, key: str, tensor: torch.Tensor) -> None:
    result.state_dict[key] = tensor
    result.derived.append(key)
    result.copied_bytes += tensor.numel() * tensor.element_size()


def _finalize(stored: Mapping[str, torch.Tensor], layout: fmt.Layout, options: RuntimeOptions,
              result: LoadedCheckpoint, fused_views: Mapping[str, torch.Tensor] | None = None) -> None:
    """Fill ``result.state_dict`` with the stored tensors (in their final dtype) and the derived
    entries, in the order NxDI's HF conversion produces them (docs/format.md, Entries that are never stored)."""
    sd = result.state_dict
    for name, tensor in stored.items():
        dtype = options.final_dtype(name, tensor.dtype)
        if dtype != tensor.dtype:
            tensor = tensor.to(dtype)
            result.cast.append(name)
            result.copied_bytes += tensor.numel() * tensor.element_size()
        sd[name] = tensor
    if result.cast:
        logger.info("cast %d tensors to %s as NxDI would (copies): torch_dtype differs from the stored BF16",
                    len(result.cast), options.torch_dtype)
    dims = layout.dims
    hidden = dims.hidden_size
    for layer in range(dims.num_hidden_layers):
        prefix = fmt.layer_prefix(layer)
        # clones, not views: NxD may save per-rank checkpoints with safetensors, which refuses
        # two tensors that share storage (a norm weight and its own first H entries would)
        for norm in ("input_layernorm", "post_attention_layernorm"):
            _add_derived(result, f"{prefix}{norm}.weight_unpadded", sd[f"{prefix}{norm}.weight"][:hidden].clone())
        if options.attention_dp_degree != options.cp_degree:
            _add_derived(result, f"{prefix}self_attn.tkg_learned_sinks.sink", sd[f"{prefix}self_attn.learned_sinks.sink"].clone())
    _add_derived(result, "norm.weight_unpadded", sd["norm.weight"][:hidden].clone())
    if options.pads_lm_head(dims.vocab_size):
        _add_derived(result, "lm_head.bias", torch.zeros(dims.vocab_size, dtype=options.final_dtype("lm_head.bias", torch.float32)))
    if options.fused_qkv:
        # NxDI's layout needs one Wqkv tensor: a view of the file when q, k, v lie back to back
        # (and keep their dtype), else a concatenated copy. No Wqkv.scale: the format has no
        # attention scales (attention is never quantized).
        for layer in range(dims.num_hidden_layers):
            attn = f"{fmt.layer_prefix(layer)}self_attn."
            for part in ("weight", "bias"):
                parts = [sd.pop(f"{attn}{proj}.{part}") for proj in ("q_proj", "k_proj", "v_proj")]
                key = f"{attn}Wqkv.{part}"
                ready = (fused_views or {}).get(key)
                if ready is not None and ready.dtype == parts[0].dtype:
                    sd[key] = ready
                    result.derived.append(key)
                else:
                    _add_derived(result, key, torch.cat(parts))
    if options.vocab_parallel:
        _add_derived(result, "embed_tokens.rank_util.rank", torch.arange(0, options.local_ranks_size))
    for layer in range(dims.num_hidden_layers):
        _add_derived(result, f"{fmt.layer_prefix(layer)}self_attn.rank_util.rank",
                     torch.arange(0, options.tp_degree, dtype=torch.int32))
    _add_derived(result, "rank_util.rank", torch.arange(0, options.tp_degree, dtype=torch.int32))


# --------------------------------------------------------------------------- entry points


def check_report(path: str | os.PathLike[str], report: PreflightReport, config: Any,
                 allow_custom_model: bool) -> Binding:
    """The report's binding when it vouches for loading ``path`` with ``config``; else
    ``ReportBindingError`` (one line: what differs and what to do). Reads no file."""
    where = os.fspath(path)
    checked = report.checked
    if checked is None:
        raise ReportBindingError(f"the report for {report.path} was not made by preflight() and is bound to nothing: "
                                 f"pass report=preflight({where!r}, ...) or no report (nothing was mapped)")
    binding = checked.binding
    root = os.path.realpath(where)
    if root != binding.root:
        raise ReportBindingError(f"the report checked {binding.root}, not {root}: preflight the directory you load "
                                 "(nothing was mapped)")
    if binding.headers_only:
        raise ReportBindingError(f"the report for {root} is headers-only (scale values not checked): run the full "
                                 "preflight (read_scales=True) before loading (nothing was mapped)")
    if binding.errors or not report.ok:
        first = report.errors[0] if report.errors else None
        what = f"first: {first.code} in {first.file or root}" if first else "findings removed from the report since"
        raise FailedReportError(report, f"the report for {root} has {plural(max(binding.errors, len(report.errors)), 'error')} "
                                        f"({what}): fix them (validate lists every finding), then load again "
                                        "(nothing was mapped)")
    fingerprint = config_fingerprint(config)
    if fingerprint != binding.config_fingerprint:
        given = "no NxDI config" if config is None else "a different NxDI config"
        made = "no NxDI config" if binding.config_fingerprint == "none" else "another NxDI config"
        raise ReportBindingError(f"the report for {root} was made with {made}, this load has {given}: preflight with the "
                                 "same config object the load gets, unchanged in between (nothing was mapped)")
    if binding.allow_custom_model and not allow_custom_model:
        raise ReportBindingError(f"the report for {root} was made with the custom-model opt-in and this load has none: "
                                 f"pass allow_custom_model=True or set {fmt.ALLOW_CUSTOM_ENV}=1 (nothing was mapped)")
    return binding


def _check_json_files(binding: Binding) -> None:
    """``config.json`` and the index must still be the files the preflight read."""
    for name in (fmt.CONFIG_FILE, fmt.INDEX_FILE):
        bound = binding.file(name)
        if bound is None:
            continue
        try:
            now = FileIdentity.of(os.stat(os.path.join(binding.root, name)))
        except OSError as exc:
            raise _refuse(name, [f"it can no longer be read ({exc.strerror or exc})"]) from None
        changes = now.changes_since(bound.identity)
        if changes:
            raise _refuse(name, changes)


def _map_all(view: CheckpointView, binding: Binding, policy: LoadPolicy) -> dict[str, mmap.mmap]:
    mappings: dict[str, mmap.mmap] = {}
    try:
        for shard, header in sorted(view.headers.items()):
            mappings[shard] = map_shard(shard, header, root=binding.root, private=policy.private)
    except BaseException:
        for mapping in mappings.values():
            mapping.close()
        raise
    return mappings


def verify_loaded(view: CheckpointView, mappings: Mapping[str, mmap.mmap]) -> int:
    """Check every loaded shard's bytes (exactly what the tensors view) against ``shard_sha256``;
    ``IntegrityError`` when the index has no digest for one, or one differs. Returns bytes hashed."""
    digests = view.metadata.get(DIGESTS_KEY)
    if not isinstance(digests, Mapping):
        raise IntegrityError(f"{fmt.INDEX_FILE} has no metadata.{DIGESTS_KEY}, so verifying at load "
                             f"({fmt.VERIFY_AT_LOAD_ENV} / neuron_config.{fmt.VERIFY_AT_LOAD_ATTR}) cannot check any "
                             "shard: re-write the checkpoint with digests, or turn verification off")
    missing = sorted(shard for shard in mappings if not isinstance(digests.get(shard), str))
    if missing:
        raise IntegrityError(f"{fmt.INDEX_FILE} metadata.{DIGESTS_KEY} has no digest for {missing[0]}: "
                             "re-write the checkpoint with digests, or turn verification off")
    actual = hash_buffers(mappings, workers=min(len(mappings), usable_cpus()))
    for shard in sorted(mappings):
        if actual[shard] != digests[shard]:
            raise IntegrityError(f"{shard}: the loaded bytes have SHA-256 {actual[shard]}, the index records "
                                 f"{digests[shard]}: the file differs from what was written (changed, corrupted or "
                                 "partly copied); copy it again from the source (nothing was returned)")
    return sum(len(mapping) for mapping in mappings.values())


def load_checkpoint(
    path: str | os.PathLike[str],
    config: Any = None,
    *,
    report: PreflightReport | None = None,
    allow_custom_model: bool | None = None,
    policy: LoadPolicy | None = None,
) -> LoadedCheckpoint:
    """Preflight (unless ``report`` is given), check the report is bound to this load, then map
    (or read), optionally verify, and finalize.

    Args:
        path: the checkpoint directory.
        config: NxDI's InferenceConfig (or its NeuronConfig, or a mapping); ``None`` uses
            NxDI's NeuronConfig defaults (tp 1, no fused QKV, ...).
        report: a complete, clean ``preflight()`` report of ``path`` made with this same
            ``config`` (and custom opt-in); reused, not redone. Anything else is refused.
        allow_custom_model: accept a custom profile; default: the environment opt-in.
        policy: load mode and verification; default: ``LoadPolicy.resolve(config)`` (the
            environment and the NeuronConfig attributes).

    Raises ``PreflightError`` listing every finding of its own preflight, ``ReportBindingError``
    for a report that does not vouch for this load, ``IntegrityError`` when a file changed after
    the preflight (or a digest differs), ``LoadError`` when a shard cannot be mapped. Example::

        sd = load_checkpoint("/ckpt/gpt-oss-120b-fp8", inference_config).state_dict
    """
    if allow_custom_model is None:
        allow_custom_model = allow_custom_from_env()
    if report is None:
        nc = neuron_config_view(config) if config is not None else None
        inference_config = config if config is not None and nc is not config else None
        report = preflight(path, neuron_config=nc, inference_config=inference_config,
                           allow_custom_model=allow_custom_model)
        report.raise_if_failed()
    binding = check_report(path, report, config, allow_custom_model)
    # after the preflight, which reports a bad neuron_config load option as a finding
    policy = policy if policy is not None else LoadPolicy.resolve(config)
    view = report.view
    if view is None or view.layout is None:
        raise LoadError(f"{path}: the preflight report holds no parsed checkpoint to load")
    options = RuntimeOptions.from_config(config)
    _check_json_files(binding)
    mappings = _map_all(view, binding, policy)
    result = LoadedCheckpoint(state_dict={}, shards=len(view.headers), policy=policy)
    if policy.private:
        result.private_bytes = sum(len(mapping) for mapping in mappings.values())
    if policy.verify_digests:
        started = time.perf_counter()
        try:
            result.verified_bytes = verify_loaded(view, mappings)
        except BaseException:
            for mapping in mappings.values():
                mapping.close()
            raise
        result.verify_s = time.perf_counter() - started
    stored: dict[str, torch.Tensor] = {}
    for name in fmt.expected_namespace(view.layout):
        shard = view.weight_map[name]
        info = view.headers[shard].tensors[name]
        stored[name] = tensor_view(mappings[shard], view.headers[shard], name)
        result.mapped.append(name)
        result.mapped_bytes += info.nbytes
        result.mapped_dtypes[info.dtype] = result.mapped_dtypes.get(info.dtype, 0) + 1
    fused_views = fused_qkv_views(view, mappings) if options.fused_qkv else None
    _finalize(stored, view.layout, options, result, fused_views)
    return result


def load_state_dict(
    path: str | os.PathLike[str],
    config: Any = None,
    *,
    report: PreflightReport | None = None,
    allow_custom_model: bool | None = None,
    policy: LoadPolicy | None = None,
) -> dict[str, torch.Tensor]:
    """The state dict NxDI's ``checkpoint_loader_fn`` would return for this checkpoint and
    config (without a speculation prefix); see ``load_checkpoint`` for the arguments."""
    return load_checkpoint(path, config, report=report, allow_custom_model=allow_custom_model, policy=policy).state_dict


def describe_load(path: str | os.PathLike[str], config: Any = None) -> str:
    """Load ``path`` (custom profiles allowed) and say what was mapped, derived and copied."""
    loaded = load_checkpoint(path, config, allow_custom_model=True)
    return loaded.describe()
