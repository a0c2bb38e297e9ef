"""The fail-closed preflight: decide from the files alone whether a directory is a valid
normalized static-FP8 GPT-OSS checkpoint (docs/format.md), collecting every finding.

Reads only ``config.json``, the index, each shard's header and the expert scale tensors
(small); never a weight byte. Stdlib only, so it runs on any host. Data flows one way:
files → parsed headers → findings. The loader maps tensors only when the report is clean.
"""

from __future__ import annotations

import hashlib
import math
import os
import re
import stat
import struct
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from . import format as fmt
from .binding import seal
from .deps import missing
from .findings import PreflightReport, Severity
from .integrity import check_digests
from .safetensors_header import (
    FileIdentity,
    HeaderError,
    SafetensorsHeader,
    TensorInfo,
    parse_json_strict,
    read_header,
)

MAX_JSON_FILE_SIZE = 64 * 1024 * 1024
_SHA256_HEX = re.compile(r"^[0-9a-f]{64}$")
_TRUTHY = {"1", "true", "yes", "on"}
NOT_CHECKED_SCALES = "scale values"


def allow_custom_from_env(environ: Mapping[str, str] | None = None) -> bool:
    """Whether ``NXDI_GPTOSS_FP8_ALLOW_CUSTOM_MODEL`` opts in to custom-profile checkpoints."""
    value = (os.environ if environ is None else environ).get(fmt.ALLOW_CUSTOM_ENV, "")
    return value.strip().lower() in _TRUTHY


@dataclass
class CheckpointView:
    """What the preflight learned about a directory, shared by the checks (and the loader)."""

    root: str
    config: dict[str, Any] | None = None
    index: dict[str, Any] | None = None
    metadata: dict[str, Any] = field(default_factory=dict)
    weight_map: dict[str, str] = field(default_factory=dict)
    headers: dict[str, SafetensorsHeader] = field(default_factory=dict)
    broken_shards: set[str] = field(default_factory=set)
    dims: fmt.ModelDims | None = None
    layout: fmt.Layout | None = None
    # tensor name → the shards whose headers hold it (more than one is a collision)
    locations: dict[str, list[str]] = field(default_factory=dict)
    # config.json / index → (identity of the file read, SHA-256 of its bytes): bound into the report
    json_files: dict[str, tuple[FileIdentity, str]] = field(default_factory=dict)

    def tensor(self, key: str) -> tuple[str, TensorInfo] | None:
        """Where ``key`` physically is: the shard the index names if it holds it, else any."""
        shards = self.locations.get(key, [])
        if not shards:
            return None
        shard = self.weight_map.get(key)
        if shard not in shards:
            shard = shards[0]
        return shard, self.headers[shard].tensors[key]


def preflight(
    path: str | os.PathLike[str],
    *,
    neuron_config: Any = None,
    inference_config: Any = None,
    allow_custom_model: bool = False,
    read_scales: bool = True,
    deep: bool = False,
    verify_checksums: bool = False,
) -> PreflightReport:
    """Check the checkpoint directory ``path`` against the normalized-FP8 format (docs/format.md).

    Args:
        path: the checkpoint directory.
        neuron_config: NxDI's NeuronConfig, or a mapping of its attributes (flat, or nested
            under ``"neuron_config"`` as NxDI saves it); enables the ``neuron_config`` checks.
        inference_config: NxDI's InferenceConfig (or a mapping); its model dimensions must
            agree with the checkpoint's ``config.json``.
        allow_custom_model: accept a ``custom`` model profile (tiny test models).
        read_scales: read the expert scales and check their values (the default); False gives
            a headers-only verdict and an info finding saying the values were not checked.
        deep: also read every FP8 expert byte once (``deep_scan``: values beyond ±240 or
            NaN, non-zero padding, all-zero experts); needs numpy (``MissingDependencyError``
            without it).
        verify_checksums: hash every shard against the index's ``shard_sha256``
            (``integrity``); without digests that is an error (else only a warning).

    Returns:
        A ``PreflightReport`` with every finding; ``report.ok`` is the verdict. Never raises
        for a malformed checkpoint (only for a missing optional dependency). Example::

            report = preflight("/ckpt/gpt-oss-120b-fp8")
            report.raise_if_failed()
    """
    if deep:
        from . import deep_scan

        if deep_scan.np is None:  # fail before reading anything: the environment, not the checkpoint
            raise missing("numpy", "the deep scan (deep=True, validate --deep)")
    started = time.perf_counter()
    root = os.fspath(path)
    report = PreflightReport(path=root)
    view = CheckpointView(root=root)
    if _check_directory(view, report):
        _check_config(view, report)
        _check_index(view, report)
        _check_stray_files(view, report)
        _read_headers(view, report)
        _check_ownership(view, report)
        _check_collisions(view, report)
        _check_metadata_against_config(view, report, allow_custom_model)
        _check_namespace(view, report)
        _check_dtype_shape(view, report)
        _check_sidecars(view, report)
        if read_scales:
            _check_scale_values(view, report)
        else:
            report.not_checked.append(NOT_CHECKED_SCALES)
            report.add("values", "not_checked", "scale values were not read (headers-only preflight)", severity=Severity.INFO)
        _check_total_size(view, report)
        check_digests(view, report, verify=verify_checksums)
        if deep:
            from .deep_scan import deep_scan

            deep_scan(view, report)
        if inference_config is not None:
            _check_inference_config(view, report, inference_config)
        if neuron_config is not None:
            check_neuron_config(view, report, neuron_config)
    report.profile = view.metadata.get("model_profile") if isinstance(view.metadata.get("model_profile"), str) else None
    report.shards = len(view.headers)
    report.tensors = len(view.locations)
    report.checked = seal(
        view, root=os.path.realpath(root), headers_only=not read_scales, errors=len(report.errors),
        allow_custom_model=allow_custom_model,
        deep=deep, verify_checksums=verify_checksums, config=bound_config(neuron_config, inference_config),
        json_files=view.json_files,
    )
    report.elapsed_s = time.perf_counter() - started
    return report


# --------------------------------------------------------------------------- filesystem


def _check_directory(view: CheckpointView, report: PreflightReport) -> bool:
    if not os.path.exists(view.root):
        report.add("filesystem", "missing_directory", f"{view.root} does not exist", file=view.root)
        return False
    if not os.path.isdir(view.root):
        report.add(
            "filesystem", "not_a_directory",
            f"{view.root} is a file; pass the checkpoint directory that holds {fmt.INDEX_FILE}",
            file=view.root,
        )
        return False
    if not os.access(view.root, os.R_OK | os.X_OK):
        report.add("filesystem", "unreadable", f"{view.root} cannot be listed (permissions)", file=view.root)
        return False
    return True


def _read_json_file(view: CheckpointView, report: PreflightReport, name: str, check: str) -> Any:
    """Read a small JSON file strictly; report and return None when that is impossible."""
    file_path = os.path.join(view.root, name)
    try:
        size = os.stat(file_path).st_size
        if size > MAX_JSON_FILE_SIZE:
            report.add(check, "too_large", f"{name} is {size:,} bytes, above the {MAX_JSON_FILE_SIZE:,}-byte limit", file=name)
            return None
        with open(file_path, "rb") as handle:
            identity = FileIdentity.of(os.fstat(handle.fileno()))
            raw = handle.read(MAX_JSON_FILE_SIZE + 1)
    except OSError as exc:
        report.add("filesystem", "unreadable", f"cannot read {name}: {exc.strerror or exc}", file=name)
        return None
    report.bytes_read += len(raw)
    view.json_files[name] = (identity, hashlib.sha256(raw).hexdigest())
    try:
        document = parse_json_strict(raw.decode("utf-8"), what=name)
    except UnicodeDecodeError:
        report.add(check, "invalid_json", f"{name} is not UTF-8 text", file=name)
        return None
    except HeaderError as exc:
        report.add(check, exc.code, str(exc), file=name, key=exc.key)
        return None
    if document is None:  # a JSON null must not read as "unreadable, already reported"
        report.add(check, "not_an_object", f"{name} holds JSON null, not an object", file=name)
    return document


def _safe_shard_name(name: str) -> str | None:
    """Why ``name`` is not a plain file name in the checkpoint directory, or None."""
    if not name or name in (".", ".."):
        return "is empty or a directory reference"
    if "/" in name or "\\" in name or "\x00" in name:
        return "contains a path separator"
    if ".." in name.split("."):
        return "contains '..'"
    if os.path.isabs(name) or re.match(r"^[A-Za-z]:", name):
        return "is an absolute path"
    return None


def _check_stray_files(view: CheckpointView, report: PreflightReport) -> None:
    if view.index is None:
        return  # without a readable index every shard would look stray: the index finding says it
    listed = set(view.weight_map.values())
    try:
        entries = sorted(os.listdir(view.root))
    except OSError as exc:
        report.add("filesystem", "unreadable", f"cannot list {view.root}: {exc.strerror}", file=view.root)
        return
    for entry in entries:
        if entry in listed or not entry.lower().endswith(fmt.WEIGHT_FILE_SUFFIXES):
            continue
        kind = "pickle-based weight file (never opened)" if entry.lower().endswith(fmt.PICKLE_SUFFIXES) else "weight file"
        report.add(
            "filesystem", "stray_weight_file",
            f"{entry} is a {kind} that the index does not list; a second checkpoint set mixed into "
            "the directory is how wrong weights get loaded: move it out",
            file=entry,
        )


# --------------------------------------------------------------------------- config.json


def _check_config(view: CheckpointView, report: PreflightReport) -> None:
    if not os.path.exists(os.path.join(view.root, fmt.CONFIG_FILE)):
        report.add("config", "missing", f"{fmt.CONFIG_FILE} is missing: copy the model's Hugging Face config into the checkpoint directory", file=fmt.CONFIG_FILE)
        return
    config = _read_json_file(view, report, fmt.CONFIG_FILE, "config")
    if config is None:
        return
    if not isinstance(config, dict):
        report.add("config", "invalid_json", f"{fmt.CONFIG_FILE} is not a JSON object", file=fmt.CONFIG_FILE)
        return
    view.config = config
    name = fmt.CONFIG_FILE
    if config.get("model_type") != fmt.MODEL_TYPE:
        report.add("config", "wrong_model_type", f"model_type is {config.get('model_type')!r}, expected {fmt.MODEL_TYPE!r}", file=name, key="model_type")
    if config.get("architectures") != [fmt.ARCHITECTURE]:
        report.add("config", "wrong_architecture", f"architectures is {config.get('architectures')!r}, expected [{fmt.ARCHITECTURE!r}]", file=name, key="architectures")
    quant = config.get("quantization_config")
    if quant is not None:
        method = quant.get("quant_method") if isinstance(quant, dict) else None
        if method == "mxfp4":
            report.add(
                "config", "mxfp4_quantization_config",
                "config.json declares quant_method 'mxfp4': this is an HF MXFP4 config, and tools "
                "would read the FP8 bytes as MXFP4. If the checkpoint is HF MXFP4, unset "
                "CHECKPOINT_FORMAT or convert it with `nxdi-gptoss-fp8 convert`; if it is "
                f"normalized, set quant_method to {fmt.QUANT_METHOD!r}",
                file=name, key="quantization_config.quant_method",
            )
        elif method != fmt.QUANT_METHOD:
            report.add(
                "config", "foreign_quantization_config",
                f"quantization_config.quant_method is {method!r}; a normalized checkpoint has "
                f"{fmt.QUANT_METHOD!r} or no quantization_config",
                file=name, key="quantization_config.quant_method",
            )
    try:
        view.dims = fmt.dims_from_config(config)
    except fmt.ConfigFieldError as exc:
        report.add("config", "bad_field", f"{exc.field}: {exc.problem}; the namespace cannot be derived", file=name, key=exc.field)


# --------------------------------------------------------------------------- index


def _check_index(view: CheckpointView, report: PreflightReport) -> None:
    name = fmt.INDEX_FILE
    if not os.path.exists(os.path.join(view.root, name)):
        hint = ""
        if os.path.exists(os.path.join(view.root, "model.safetensors")):
            hint = " (a single-file model.safetensors was found: the format requires an index even for one shard)"
        report.add("filesystem", "missing_index", f"{name} is missing{hint}", file=name)
        return
    index = _read_json_file(view, report, name, "index")
    if index is None:
        return
    if not isinstance(index, dict):
        report.add("index", "not_an_object", f"{name} is not a JSON object", file=name)
        return
    view.index = index
    for extra in sorted(set(index) - {"metadata", "weight_map"}):
        report.add("index", "unexpected_field", f"unexpected top-level field {extra!r}: an index has only metadata and weight_map", file=name, key=extra)
    weight_map = index.get("weight_map")
    if not isinstance(weight_map, dict):
        report.add("index", "missing_weight_map", "weight_map is missing or not an object", file=name, key="weight_map")
    elif not weight_map:
        report.add("index", "empty_weight_map", "weight_map is empty: the index lists no tensor", file=name, key="weight_map")
    else:
        for key, shard in weight_map.items():
            if not isinstance(shard, str):
                report.add("index", "bad_weight_map_entry", f"weight_map[{key!r}] is {shard!r}, not a file name", file=name, key=key)
                continue
            problem = _safe_shard_name(shard)
            if problem:
                report.add("filesystem", "unsafe_shard_name", f"weight_map names shard {shard!r}, which {problem}; shards must be plain file names in the checkpoint directory", file=name, key=key)
                continue
            view.weight_map[key] = shard
    _check_metadata_fields(view, report, index.get("metadata"))


def _check_metadata_fields(view: CheckpointView, report: PreflightReport, metadata: Any) -> None:
    name = fmt.INDEX_FILE
    if not isinstance(metadata, dict):
        report.add("index", "missing_metadata", "metadata is missing or not an object", file=name, key="metadata")
        return
    if "format" not in metadata and set(metadata) <= {"total_size"}:
        report.add(
            "index", "not_normalized",
            f"the index has no normalized-format metadata (only {sorted(metadata)}): this is an HF "
            "index; unset CHECKPOINT_FORMAT to load an HF checkpoint with NxDI, or convert it with "
            "`nxdi-gptoss-fp8 convert`",
            file=name, key="metadata",
        )
    view.metadata = metadata
    allowed = {**fmt.REQUIRED_METADATA, **fmt.OPTIONAL_METADATA}
    for key in sorted(set(metadata) - set(allowed)):
        report.add("index", "unexpected_metadata", f"unexpected metadata field {key!r}", file=name, key=f"metadata.{key}")
    for key, kind in fmt.REQUIRED_METADATA.items():
        if key not in metadata:
            if "format" in metadata or key != "total_size":
                report.add("index", "missing_metadata_field", f"metadata field {key!r} is missing", file=name, key=f"metadata.{key}")
            continue
        value = metadata[key]
        valid = isinstance(value, (int, float)) and type(value) is not bool if kind is float else type(value) is kind
        if not valid:
            report.add("index", "wrong_metadata_type", f"metadata field {key!r} is {value!r}, expected {kind.__name__}", file=name, key=f"metadata.{key}")
    for key, kind in fmt.OPTIONAL_METADATA.items():
        if key in metadata and type(metadata[key]) is not kind:
            report.add("index", "wrong_metadata_type", f"metadata field {key!r} is a {type(metadata[key]).__name__}, expected an object", file=name, key=f"metadata.{key}")
    expected_values = {
        "format": fmt.FORMAT_NAME,
        "format_version": fmt.FORMAT_VERSION,
        "quantization_type": fmt.QUANTIZATION_TYPE,
        "quantization_dtype": fmt.QUANTIZATION_DTYPE,
        "fp8_max": fmt.FP8_MAX,
    }
    for key, expected in expected_values.items():
        if key in metadata and metadata[key] != expected and type(metadata[key]) is not bool:
            report.add("index", "wrong_metadata_value", f"metadata field {key!r} is {metadata[key]!r}, expected {expected!r}", file=name, key=f"metadata.{key}")
    profile = metadata.get("model_profile")
    if isinstance(profile, str) and profile not in fmt.PROFILE_NAMES:
        report.add("index", "unknown_profile", f"model_profile {profile!r} is not one of {list(fmt.PROFILE_NAMES)}", file=name, key="metadata.model_profile")
    total = metadata.get("total_size")
    if type(total) is int and total < 0:
        report.add("index", "wrong_metadata_value", f"total_size {total} is negative", file=name, key="metadata.total_size")
    digests = metadata.get("shard_sha256")
    if isinstance(digests, dict):
        shards = set(view.weight_map.values())
        for shard, digest in digests.items():
            if not (isinstance(digest, str) and _SHA256_HEX.match(digest)):
                report.add("index", "bad_shard_sha256", f"shard_sha256[{shard!r}] is not a lowercase hex SHA-256", file=name, key="metadata.shard_sha256")
            elif shard not in shards:
                report.add("index", "bad_shard_sha256", f"shard_sha256 names {shard!r}, which the weight_map does not use", file=name, key="metadata.shard_sha256")
        for shard in sorted(shards - set(digests)):
            report.add("index", "bad_shard_sha256", f"shard_sha256 has no digest for {shard!r}", file=name, key="metadata.shard_sha256")


# --------------------------------------------------------------------------- headers


class _ShardProblem(Exception):
    """Why one shard's header could not be read: becomes one finding, the shard is skipped."""

    def __init__(self, check: str, reason: str, message: str, key: str | None = None) -> None:
        super().__init__(message)
        self.check, self.reason, self.message, self.key = check, reason, message, key


def _read_shard_header(root: str, real_root: str, shard: str) -> SafetensorsHeader:
    path = os.path.join(root, shard)
    try:
        if stat.S_ISLNK(os.lstat(path).st_mode):
            target = os.path.realpath(path)
            if os.path.dirname(target) != real_root:
                raise _ShardProblem("filesystem", "link_outside", f"{shard} is a link to {target}, outside the checkpoint directory: copy the file in instead")
        return read_header(path)
    except FileNotFoundError:
        raise _ShardProblem("ownership", "missing_shard", f"the index lists shard {shard}, which does not exist") from None
    except HeaderError as exc:
        raise _ShardProblem("header", exc.code, f"{shard}: {exc}", exc.key) from None
    except IsADirectoryError:
        raise _ShardProblem("filesystem", "not_a_file", f"{shard} is a directory, not a shard file") from None
    except OSError as exc:
        raise _ShardProblem("filesystem", "unreadable", f"cannot read {shard}: {exc.strerror or exc}") from None


def _read_headers(view: CheckpointView, report: PreflightReport) -> None:
    real_root = os.path.realpath(view.root)
    for shard in sorted(set(view.weight_map.values())):
        try:
            header = _read_shard_header(view.root, real_root, shard)
        except _ShardProblem as problem:
            view.broken_shards.add(shard)
            report.add(problem.check, problem.reason, problem.message, file=shard, key=problem.key)
            continue
        report.bytes_read += header.bytes_read
        view.headers[shard] = header
        for key in header.tensors:
            view.locations.setdefault(key, []).append(shard)


def _check_ownership(view: CheckpointView, report: PreflightReport) -> None:
    for key, shard in view.weight_map.items():
        if shard in view.broken_shards or key in view.headers[shard].tensors:
            continue
        elsewhere = view.locations.get(key)
        if elsewhere:
            report.add("ownership", "key_in_other_shard", f"the index assigns {key} to {shard}, but it is only in {', '.join(elsewhere)}: fix the weight_map or move the tensor", file=shard, key=key)
        else:
            report.add("ownership", "key_not_in_shard", f"the index assigns {key} to {shard}, but no shard holds it", file=shard, key=key)
    for shard, header in view.headers.items():
        for key in header.tensors:
            if key not in view.weight_map:
                report.add("ownership", "unlisted_key", f"{shard} holds {key}, which the index does not list", file=shard, key=key)


def _check_collisions(view: CheckpointView, report: PreflightReport) -> None:
    for key, shards in view.locations.items():
        if len(shards) > 1:
            report.add("collision", "duplicate_tensor", f"{key} is in {len(shards)} shard headers ({', '.join(shards)}); exactly one may hold it", file=shards[1], key=key)


# --------------------------------------------------------------------------- config ↔ metadata


def _check_metadata_against_config(view: CheckpointView, report: PreflightReport, allow_custom_model: bool) -> None:
    if view.dims is None or not _dims_in_proportion(view, report):
        return
    dims, name = view.dims, fmt.CONFIG_FILE
    profile = view.metadata.get("model_profile")
    if profile in fmt.PROFILES:
        for field_name, expected in fmt.PROFILES[profile].as_dict().items():
            found = getattr(dims, field_name)
            if found != expected:
                report.add("config", "profile_mismatch", f"{field_name} is {found} but profile {profile} has {expected}", file=name, key=field_name)
    elif profile == fmt.PROFILE_CUSTOM and not allow_custom_model:
        matching = fmt.profile_for_dims(dims)
        hint = f" (its dimensions are those of {matching}: set model_profile to {matching!r})" if matching != fmt.PROFILE_CUSTOM else ""
        report.add(
            "config", "custom_profile_not_allowed",
            f"the checkpoint declares model_profile 'custom'{hint}; custom models load only on "
            f"request: pass allow_custom_model=True, --allow-custom-model, or set {fmt.ALLOW_CUSTOM_ENV}=1",
            file=fmt.INDEX_FILE, key="metadata.model_profile",
        )
    padded_h, padded_i = view.metadata.get("padded_hidden_size"), view.metadata.get("padded_intermediate_size")
    if type(padded_h) is not int or type(padded_i) is not int:
        return
    layout = fmt.Layout(dims, padded_h, padded_i)
    problems = layout.padding_problems()
    for problem in problems:
        report.add("config", "padding_mismatch", f"index metadata {problem} (config.json)", file=fmt.INDEX_FILE, key="metadata")
    if not problems:
        view.layout = layout


def _dims_in_proportion(view: CheckpointView, report: PreflightReport) -> bool:
    """Refuse a config whose namespace is far larger than what the checkpoint lists.

    Every later check enumerates the expected namespace (and neuron_config the layers), so a
    config.json claiming 10^11 layers must not be believed: the work stays proportional to
    the files' size. Forgets the dimensions (one finding) when they are out of proportion.
    """
    unit = fmt.Layout.unpadded(view.dims)  # type: ignore[arg-type]
    layers = view.dims.num_hidden_layers  # type: ignore[union-attr]
    expected = len(fmt.global_specs(unit)) + layers * len(fmt.layer_specs(unit, 0))
    present = len(set(view.weight_map) | set(view.locations))
    if expected <= 2 * present + 1024:
        return True
    report.add(
        "config", "dims_out_of_proportion",
        f"num_hidden_layers={layers} means {expected:,} tensors but the checkpoint lists {present:,}: "
        "this config.json does not describe the checkpoint; no namespace is derived from it",
        file=fmt.CONFIG_FILE, key="num_hidden_layers",
    )
    view.dims = None
    return False


def config_attr(source: Any, name: str, default: Any = None) -> Any:
    """Attribute ``name`` of an NxDI config object, or key ``name`` of a mapping standing in for one."""
    if isinstance(source, Mapping):
        return source.get(name, default)
    return getattr(source, name, default)


def _check_inference_config(view: CheckpointView, report: PreflightReport, config: Any) -> None:
    """NxDI's InferenceConfig holds the padded sizes in hidden/intermediate_size, the originals aside."""
    if view.dims is None:
        return
    original = {
        "hidden_size": config_attr(config, "original_hidden_size", config_attr(config, "hidden_size")),
        "intermediate_size": config_attr(config, "original_intermediate_size", config_attr(config, "intermediate_size")),
    }
    for field_name, expected in view.dims.as_dict().items():
        found = original.get(field_name, config_attr(config, field_name))
        if field_name == "num_local_experts" and found is None:
            found = config_attr(config, "num_experts")
        if field_name == "num_experts_per_tok" and found is None:
            found = config_attr(config, "experts_per_token")
        if found is not None and found != expected:
            report.add("config", "nxdi_config_mismatch", f"NxDI's config has {field_name}={found}, the checkpoint's config.json {expected}: compile with the checkpoint's config", file=fmt.CONFIG_FILE, key=field_name)


# --------------------------------------------------------------------------- namespace, dtypes, sidecars


def _check_namespace(view: CheckpointView, report: PreflightReport) -> None:
    present = set(view.weight_map) | set(view.locations)
    expected = fmt.expected_namespace(view.layout) if view.layout else None
    for key in sorted(present):
        if expected is not None and key in expected:
            continue
        where = view.weight_map.get(key) or (view.locations.get(key) or [None])[0]
        reason = fmt.derived_reason(key)
        foreign = fmt.foreign_name(key)
        if reason:
            report.add("namespace", "derived_key", f"{key} is {reason} at load time and must not be stored: remove it", file=where, key=key)
        elif foreign:
            report.add("namespace", foreign[0], f"{key} is not a normalized name; {foreign[1]}", file=where, key=key)
        elif fmt.is_stray_scale(key):
            report.add("sidecar", "stray_scale", f"{key} is a scale the format does not have (only the expert .scale sidecars exist): remove it", file=where, key=key)
        elif expected is not None:
            report.add("namespace", "unexpected_key", f"{key} is not part of the format: remove it", file=where, key=key)
    if expected is None:
        return
    for key, spec in expected.items():
        if key in present:
            continue
        report.add("namespace", "missing_key", f"{key} ({spec.dtype}{list(spec.shape)}) is missing from the index and every shard", key=key)


def _check_dtype_shape(view: CheckpointView, report: PreflightReport) -> None:
    if view.layout is None:
        return
    for key, spec in fmt.expected_namespace(view.layout).items():
        found = view.tensor(key)
        if found is None:
            continue
        shard, info = found
        if info.dtype != spec.dtype:
            report.add("dtype_shape", "wrong_dtype", f"{key} is {info.dtype}, the format requires {spec.dtype}", file=shard, key=key)
        if info.shape != spec.shape:
            report.add("dtype_shape", "wrong_shape", f"{key} has shape {list(info.shape)}, the format requires {list(spec.shape)}", file=shard, key=key)


def _check_sidecars(view: CheckpointView, report: PreflightReport) -> None:
    for key in sorted(view.locations):
        shard, info = view.tensor(key)  # type: ignore[misc]
        if info.dtype.startswith("F8_") and key.endswith(".weight"):
            scale = fmt.scale_key_for(key)
            scale_at = view.tensor(scale) if scale else None
            if scale_at is None:
                report.add("sidecar", "missing_scale", f"FP8 weight {key} has no {scale} tensor", file=shard, key=key)
            elif scale_at[0] != shard:
                report.add("sidecar", "split_shard", f"{scale} is in {scale_at[0]} but its weight {key} is in {shard}: a weight and its scale must share a shard", file=scale_at[0], key=scale)
        elif fmt.is_expert_scale(key):
            weight = fmt.weight_key_for(key)
            weight_at = view.tensor(weight) if weight else None
            if weight_at is None or not weight_at[1].dtype.startswith("F8_"):
                report.add("sidecar", "orphan_scale", f"{key} has no FP8 weight {weight} beside it", file=shard, key=key)


# --------------------------------------------------------------------------- values


@dataclass
class ScaleStats:
    """Counts over one float32 scale tensor: ``bad`` values are not finite and > 0.

    The other counts overlap (-0.0 is both negative and zero) and only explain ``bad``.
    """

    bad: int
    negative: int
    zero: int
    non_finite: int
    first_bad: int = -1


# Class of a float32's most significant byte (sign + 7 exponent bits): N negative, Z zero or
# subnormal, E exponent at its top (huge, inf or NaN), "." an ordinary positive value.
_TOP_BYTE_CLASS = bytes(
    ord("N") if b & 0x80 else ord("Z") if b == 0 else ord("E") if b == 0x7F else ord(".")
    for b in range(256)
)


def scale_stats(raw: bytes) -> ScaleStats:
    """Count little-endian float32 values in ``raw`` that are not finite and > 0.

    Fast path in C loops (stride slice, translate, count) over the top byte of each value:
    ordinary positive scales are decided by it alone. Only tensors with zero/subnormal or
    top-exponent values, or negatives, are re-read value by value.
    """
    classes = bytes(raw[3::4]).translate(_TOP_BYTE_CLASS)
    if classes.count(b".") == len(classes):
        return ScaleStats(0, 0, 0, 0)
    bad = negative = zero = non_finite = 0
    first_bad = -1
    for index, (value,) in enumerate(struct.iter_unpack("<f", raw[: len(classes) * 4])):
        if value > 0 and not math.isinf(value):
            continue
        bad += 1
        first_bad = index if first_bad < 0 else first_bad
        negative += math.copysign(1.0, value) < 0 and not math.isnan(value)
        zero += value == 0
        non_finite += not math.isfinite(value)
    return ScaleStats(bad, negative, zero, non_finite, first_bad)


def _check_scale_values(view: CheckpointView, report: PreflightReport) -> None:
    # only scales of the format's shape are read: a mis-shaped "scale" could be any size
    expected = fmt.expected_namespace(view.layout) if view.layout else {}
    for key in sorted(view.locations):
        if not fmt.is_expert_scale(key):
            continue
        shard, info = view.tensor(key)  # type: ignore[misc]
        spec = expected.get(key)
        if info.dtype != fmt.F32 or spec is None or info.shape != spec.shape:
            continue
        header = view.headers[shard]
        try:
            with open(header.path, "rb") as handle:
                handle.seek(header.data_offset + info.begin)
                raw = handle.read(info.nbytes)
        except OSError as exc:
            report.add("filesystem", "unreadable", f"cannot read {key} from {shard}: {exc.strerror}", file=shard, key=key)
            continue
        report.bytes_read += len(raw)
        if len(raw) != info.nbytes:
            report.add("header", "data_beyond_file", f"{shard} ended while reading {key}", file=shard, key=key)
            continue
        stats = scale_stats(raw)
        if stats.bad:
            (value,) = struct.unpack_from("<f", raw, 4 * stats.first_bad)
            coords = _unravel(stats.first_bad, info.shape)
            report.add(
                "values", "bad_scale",
                f"{key} has {stats.bad} scales that are not finite and > 0 ({stats.negative} negative, "
                f"{stats.zero} zero, {stats.non_finite} inf/NaN); first at {list(coords)} = {value!r}",
                file=shard, key=key,
            )


def _unravel(index: int, shape: tuple[int, ...]) -> tuple[int, ...]:
    coords = []
    for dim in reversed(shape):
        coords.append(index % dim if dim else 0)
        index //= dim or 1
    return tuple(reversed(coords))


def _check_total_size(view: CheckpointView, report: PreflightReport) -> None:
    total = view.metadata.get("total_size")
    if type(total) is not int or view.broken_shards or not view.headers:
        return
    actual = sum(info.nbytes for header in view.headers.values() for info in header.tensors.values())
    if actual != total:
        report.add("index", "total_size_mismatch", f"metadata total_size is {total:,} but the shard headers hold {actual:,} tensor bytes", file=fmt.INDEX_FILE, key="metadata.total_size")


# --------------------------------------------------------------------------- neuron_config


def neuron_config_view(neuron_config: Any) -> Any:
    """The NeuronConfig attributes of whatever the caller passed (object, flat or nested mapping)."""
    if isinstance(neuron_config, Mapping):
        inner = neuron_config.get("neuron_config")
        return inner if isinstance(inner, Mapping) else neuron_config
    inner = getattr(neuron_config, "neuron_config", None)
    return inner if inner is not None else neuron_config


def bound_config(neuron_config: Any, inference_config: Any) -> Any:
    """The one config object a report is bound to, as the loader receives it: the
    InferenceConfig (or nested mapping) when given, else the NeuronConfig; both when the
    NeuronConfig is not the one inside the InferenceConfig (no single load config matches that)."""
    if inference_config is None:
        return neuron_config
    if neuron_config is None or neuron_config is neuron_config_view(inference_config):
        return inference_config
    return (neuron_config, inference_config)


def _positive_int(value: Any, default: int) -> int | None:
    if value is None:
        return default
    if type(value) is int and value > 0:
        return value
    return None


def check_neuron_config(view: CheckpointView, report: PreflightReport, neuron_config: Any) -> None:
    """The ``neuron_config`` checks (docs/format.md, Findings by check): what NxDI needs to run this checkpoint."""
    nc = neuron_config_view(neuron_config)
    add = report.add
    if not config_attr(nc, "quantized", False):
        add("neuron_config", "not_quantized", "quantized is not set: set quantized=True and quantized_checkpoints_path to the checkpoint directory, or NxDI builds BF16 experts and casts the FP8 bytes without scales", key="quantized")
    if config_attr(nc, "quantization_dtype", "int8") != fmt.QUANTIZATION_DTYPE:
        add("neuron_config", "wrong_quantization_dtype", f"quantization_dtype is {config_attr(nc, 'quantization_dtype', 'int8')!r}: set it to {fmt.QUANTIZATION_DTYPE!r}", key="quantization_dtype")
    if config_attr(nc, "quantization_type", "per_tensor_symmetric") != fmt.QUANTIZATION_TYPE:
        add("neuron_config", "wrong_quantization_type", f"quantization_type is {config_attr(nc, 'quantization_type', 'per_tensor_symmetric')!r}: set it to {fmt.QUANTIZATION_TYPE!r} (the only scale layout GPT-OSS experts accept)", key="quantization_type")
    if config_attr(nc, "is_mxfp4_compute", False):
        add("neuron_config", "mxfp4_compute", "is_mxfp4_compute is on: MXFP4 compute expects packed FP4 experts, not FP8; turn it off", key="is_mxfp4_compute")
    dims, metadata = view.dims, view.metadata
    if dims is not None:
        for attr, base, stored in (
            ("padded_hidden_size", dims.hidden_size, metadata.get("padded_hidden_size")),
            ("padded_intermediate_size", dims.intermediate_size, metadata.get("padded_intermediate_size")),
        ):
            wanted = config_attr(nc, attr) or base
            if type(stored) is int and wanted != stored:
                add("neuron_config", "padding_mismatch", f"{attr} is {wanted} at runtime but the checkpoint was written for {stored}: set {attr}={stored} or re-convert with --{attr.replace('_', '-')} {wanted}", key=attr)
    _check_modules_to_not_convert(view, report, nc)
    tp = _positive_int(config_attr(nc, "tp_degree"), 1)
    ep = _positive_int(config_attr(nc, "moe_ep_degree"), 1)
    moe_tp = _positive_int(config_attr(nc, "moe_tp_degree"), 1)
    for attr, value in (("tp_degree", tp), ("moe_ep_degree", ep), ("moe_tp_degree", moe_tp)):
        if value is None:
            add("neuron_config", "bad_degree", f"{attr} is {config_attr(nc, attr)!r}, not a positive integer", key=attr)
    if tp is None or ep is None or moe_tp is None or view.layout is None:
        return
    expert_tp = moe_tp if ep > 1 else tp
    ip, experts = view.layout.padded_intermediate_size, view.layout.dims.num_local_experts
    if ip % expert_tp:
        which = "moe_tp_degree" if ep > 1 else "tp_degree"
        add("neuron_config", "expert_tp_indivisible", f"the padded intermediate size {ip} is not divisible by the MoE tensor-parallel degree {which}={expert_tp}: pick a degree that divides it or re-convert with a padded intermediate size that it divides", key=which)
    if experts % ep:
        add("neuron_config", "expert_ep_indivisible", f"{experts} experts cannot be split over moe_ep_degree={ep}", key="moe_ep_degree")


def _excluded(path: str, entries: list[str]) -> bool:
    """NxD's rule: a module is not converted when any entry is a substring of its dotted path."""
    return any(entry in path for entry in entries)


def _check_modules_to_not_convert(view: CheckpointView, report: PreflightReport, nc: Any) -> None:
    entries = config_attr(nc, "modules_to_not_convert") or []
    if not isinstance(entries, (list, tuple)) or not all(isinstance(e, str) for e in entries):
        report.add("neuron_config", "bad_modules_to_not_convert", f"modules_to_not_convert is {entries!r}, not a list of module names", key="modules_to_not_convert")
        return
    entries = list(entries)
    layers = view.dims.num_hidden_layers if view.dims else 1
    qkv = ("qkv_proj.Wqkv",) if config_attr(nc, "fused_qkv", False) else ("qkv_proj.q_proj", "qkv_proj.k_proj", "qkv_proj.v_proj")
    attention_paths = [f"layers.{i}.self_attn.{name}" for i in range(layers) for name in (*qkv, "o_proj.o_proj")]
    missing = [p for p in attention_paths if not _excluded(p, entries)]
    if missing:
        report.add("neuron_config", "attention_not_excluded", f"attention is not in modules_to_not_convert (e.g. {missing[0]}): expert-wise FP8 cannot quantize attention; add 'self_attn'", key="modules_to_not_convert")
    if not _excluded("lm_head", entries):
        report.add("neuron_config", "lm_head_not_excluded", "lm_head is not in modules_to_not_convert: add 'lm_head'", key="modules_to_not_convert")
    expert_paths = [f"layers.{i}.{proj}" for i in range(layers) for proj in (fmt.GATE_UP, fmt.DOWN)]
    excluded = [p for p in expert_paths if _excluded(p, entries)]
    if excluded:
        report.add("neuron_config", "experts_excluded", f"modules_to_not_convert excludes the FP8 experts (e.g. {excluded[0]}): NxDI would cast the FP8 bytes to BF16 without their scales; remove that entry", key="modules_to_not_convert")
