"""The fail-closed preflight: decide from the files alone whether a directory is a valid
normalized static-FP8 GPT-OSS checkpoint (docs/format.md), collecting every finding.

Reads only ``config.json``, the index, each shard's header and the expert scale tensors
(small); never a weight byte. Stdlib only, so it runs on any host. Data flows one way:
files → parsed headers → findings. The loader maps tensors only when the report is clean.
"""

from __future__ import annotations

import functools
import gc
import hashlib
import itertools
import operator
import os
import re
import stat
import struct
import sys
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from . import format as fmt
from .binding import seal
from .deps import missing
from .errors import NotRegularFileError
from .files import open_regular
from .findings import MAX_FINDINGS_PER_CODE, PreflightReport, Severity
from .integrity import check_digests
from .nxdi_config import (
    Problem,
    bounded_int,
    config_field_problems,
    describe,
    has_model_fields,
    model_config_problems,
    model_part,
    neuron_config_problems,
    neuron_config_view,
    read_config_file,
    switch_from_env,
)
from .safetensors_header import FileIdentity, HeaderError, SafetensorsHeader, TensorInfo, read_header
from .strict_json import JsonError, parse_json_strict

MAX_JSON_FILE_SIZE = 64 * 1024 * 1024
# Scales are read in chunks of this size (memory), and never more than this in all: the
# published profiles hold 159 MB (120b) and 360 MB (120b padded to 3072/8192) of scales.
SCALE_CHUNK_BYTES = 16 * 1024 * 1024
MAX_SCALE_BYTES = 1024 * 1024 * 1024
# How deep and how wide the directory is searched for weight files in subdirectories.
NESTED_SEARCH_DEPTH = 2
NESTED_SEARCH_ENTRIES = 10_000
_SHA256_HEX = re.compile(r"^[0-9a-f]{64}$")
NOT_CHECKED_SCALES = "scale values"


def allow_custom_from_env(environ: Mapping[str, str] | None = None) -> bool:
    """Whether ``NXDI_GPTOSS_FP8_ALLOW_CUSTOM_MODEL`` opts in to custom-profile checkpoints
    (``nxdi_config.parse_switch``; ``ConfigError`` for a value that is neither on nor off)."""
    return switch_from_env(fmt.ALLOW_CUSTOM_ENV, os.environ if environ is None else environ,
                           "accept custom-profile checkpoints")


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
    # what ``recognize`` says the directory is, once asked (``foreign_recognition``)
    recognition: Any = None
    _namespace: tuple[fmt.Layout, dict[str, fmt.TensorSpec]] | None = field(default=None, repr=False, compare=False)

    def expected(self) -> dict[str, fmt.TensorSpec] | None:
        """``fmt.expected_namespace(self.layout)``, derived once per layout (several checks and the
        deep scan walk it; do not modify it), or None without a layout."""
        if self.layout is None:
            return None
        if self._namespace is None or self._namespace[0] is not self.layout:
            self._namespace = (self.layout, fmt.expected_namespace(self.layout))
        return self._namespace[1]

    def tensor(self, key: str) -> tuple[str, TensorInfo] | None:
        """Where ``key`` physically is: the shard the index names if it holds it, else any."""
        shards = self.locations.get(key, [])
        if not shards:
            return None
        shard = self.weight_map.get(key)
        if shard not in shards:
            shard = shards[0]
        return shard, self.headers[shard].tensors[key]


# The checkpoint kinds ``recognize`` names that are not normalized (compiled NxDI output and
# pre-sharded weights are not checkpoints to convert or load with CHECKPOINT_FORMAT).
_FOREIGN_KINDS = ("hf-mxfp4", "hf-bf16", "compressed-tensors-fp8", "compressed-tensors", "nxdi-legacy-bf16",
                  "nxdi-legacy-fp8", "openai-original")
_HF_KINDS = _FOREIGN_KINDS[:4]


def foreign_recognition(view: CheckpointView) -> Any:
    """What ``inspect`` says the directory is when it is another kind of checkpoint (HF,
    compressed-tensors, legacy: a ``recognize.Recognition``), else None. Asked once per view,
    and only for a directory that is not normalized: a valid checkpoint never pays for it."""
    if view.recognition is None:
        from .recognize import recognize

        view.recognition = recognize(view.root)
    return view.recognition if view.recognition.kind in _FOREIGN_KINDS else None


def _foreign_advice(view: CheckpointView) -> str | None:
    """``this is an HF BF16 checkpoint: convert it with …``: inspect's verdict and action, for
    an HF or compressed-tensors directory."""
    recognition = foreign_recognition(view)
    if recognition is None or recognition.kind not in _HF_KINDS:
        return None
    return f"this is {recognition.title}: {', or '.join(recognition.actions)}"


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
        path: the checkpoint directory (a str or ``os.PathLike``).
        neuron_config: NxDI's NeuronConfig, a mapping of its attributes (flat, or nested
            under ``"neuron_config"`` as NxDI saves it), or the path of such a JSON file (read
            as ``validate --neuron-config`` reads it); enables the ``neuron_config`` checks.
        inference_config: NxDI's InferenceConfig (or a mapping, or a JSON file's path); its
            model dimensions must agree with the checkpoint's ``config.json``.
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
        for a malformed checkpoint; raises ``TypeError`` for an argument of the wrong type (a
        flag that is not a bool, a config that is a number or a list), ``ConfigError`` for a
        config file that cannot be read, ``MissingDependencyError`` for a missing optional
        dependency. Example::

            report = preflight("/ckpt/gpt-oss-120b-fp8")
            report.raise_if_failed()
    """
    path = _checked_path(path)
    neuron_config = _checked_config(neuron_config, "neuron_config")
    inference_config = _checked_config(inference_config, "inference_config")
    for name, flag in (("allow_custom_model", allow_custom_model), ("read_scales", read_scales), ("deep", deep),
                       ("verify_checksums", verify_checksums)):
        if not isinstance(flag, bool):
            raise TypeError(f"preflight({name}=...) takes True or False, not {type(flag).__name__} {describe(flag)}")
    if deep:
        from . import deep_scan

        if deep_scan.np is None:  # fail before reading anything: the environment, not the checkpoint
            raise missing("numpy", "the deep scan (deep=True, validate --deep)")
    started = time.perf_counter()
    # The cyclic garbage collector would re-walk every object a large index creates, many
    # times over while it is parsed; the checks build no cycles, so it pauses until the verdict.
    collecting = gc.isenabled()
    gc.disable()
    try:
        report = _run_checks(path, neuron_config=neuron_config, inference_config=inference_config,
                             allow_custom_model=allow_custom_model, read_scales=read_scales, deep=deep,
                             verify_checksums=verify_checksums)
    finally:
        if collecting:
            gc.enable()
    report.elapsed_s = time.perf_counter() - started
    return report


def _checked_path(path: Any) -> str:
    """``path`` as a str: a str or ``os.PathLike`` of str, else ``TypeError``."""
    try:
        root = os.fspath(path)
    except TypeError:
        raise TypeError(f"preflight(path) takes the checkpoint directory as a str or os.PathLike, not "
                        f"{type(path).__name__}") from None
    if not isinstance(root, str):
        raise TypeError(f"preflight(path) takes a str path, not {type(root).__name__}: decode it first")
    return root


# config values that can only be a mistake (NxDI's configs are objects or mappings)
_NOT_A_CONFIG = (bool, int, float, complex, bytes, bytearray, list, tuple, set, frozenset)


def _checked_config(config: Any, name: str) -> Any:
    """A config argument as the checks take it: a path is read as a JSON file (``ConfigError``
    when it cannot be), a number, string of bytes or sequence is a ``TypeError``."""
    if isinstance(config, (str, os.PathLike)):
        path = os.fspath(config)
        if not isinstance(path, str):
            raise TypeError(f"preflight({name}=...) takes a str path, not {type(path).__name__}")
        return read_config_file(path, f"{name} {path}")
    if isinstance(config, _NOT_A_CONFIG):
        raise TypeError(f"preflight({name}=...) takes NxDI's config object, a mapping of its attributes or the "
                        f"path of its JSON file, not {type(config).__name__}")
    return config


def _run_checks(root: str, *, neuron_config: Any, inference_config: Any, allow_custom_model: bool,
                read_scales: bool, deep: bool, verify_checksums: bool) -> PreflightReport:
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
        _check_total_size(view, report)
        if not read_scales:
            report.not_checked.append(NOT_CHECKED_SCALES)
            report.add("values", "not_checked", "scale values were not read (headers-only preflight)", severity=Severity.INFO)
        elif _scales_trusted(view, report):
            _check_scale_values(view, report)
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
        view, root=root if "\x00" in root else os.path.realpath(root), headers_only=not read_scales, errors=report.error_count,
        allow_custom_model=allow_custom_model,
        deep=deep, verify_checksums=verify_checksums, config=bound_config(neuron_config, inference_config),
        json_files=view.json_files,
    )
    return report


# --------------------------------------------------------------------------- filesystem


def _check_directory(view: CheckpointView, report: PreflightReport) -> bool:
    if "\x00" in view.root:  # no file name holds one (os functions raise ValueError)
        report.add("filesystem", "missing_directory", f"{view.root!r} contains a NUL byte: no directory has that name",
                   file=view.root)
        return False
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


def _link_outside(root: str, name: str) -> str | None:
    """Where ``name`` in ``root`` leads when it is a link resolving outside ``root``, else None."""
    path = os.path.join(root, name)
    if not stat.S_ISLNK(os.lstat(path).st_mode):
        return None
    target = os.path.realpath(path)
    return None if os.path.dirname(target) == os.path.realpath(root) else target


def _read_json_file(view: CheckpointView, report: PreflightReport, name: str, check: str) -> Any:
    """Read a small JSON file strictly; report and return None when that is impossible.

    A link out of the directory, a FIFO, socket, device or directory is refused before it is
    opened (``filesystem``); the size is checked on the opened file before it is read.
    """
    file_path = os.path.join(view.root, name)
    try:
        target = _link_outside(view.root, name)
        if target is not None:
            report.add("filesystem", "link_outside", f"{name} is a link to {target}, outside the checkpoint directory: copy the file in instead", file=name)
            return None
        with open_regular(file_path) as handle:
            identity = FileIdentity.of(os.fstat(handle.fileno()))
            size = identity.size
            if size > MAX_JSON_FILE_SIZE:
                report.add(check, "too_large", f"{name} is {size:,} bytes, above the {MAX_JSON_FILE_SIZE:,}-byte limit", file=name)
                return None
            raw = handle.read(MAX_JSON_FILE_SIZE + 1)
    except NotRegularFileError as exc:
        report.add("filesystem", "not_a_file", f"{exc}: {name} must be a plain file (refused before it was opened for reading)", file=name)
        return None
    except OSError as exc:
        report.add("filesystem", "unreadable", f"cannot read {name}: {exc.strerror or exc}", file=name)
        return None
    report.bytes_read += len(raw)
    view.json_files[name] = (identity, hashlib.sha256(raw).hexdigest())
    if len(raw) > MAX_JSON_FILE_SIZE:
        report.add(check, "too_large", f"{name} grew above the {MAX_JSON_FILE_SIZE:,}-byte limit while it was read", file=name)
        return None
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError:
        report.add(check, "invalid_json", f"{name} is not UTF-8 text", file=name)
        return None
    del raw  # only the text is needed while it is parsed (memory: the index may be 64 MB)
    try:
        document = parse_json_strict(text, what=name)
    except JsonError as exc:
        report.add(check, exc.code, str(exc), file=name, key=exc.key)
        return None
    if document is None:  # a JSON null must not read as "unreadable, already reported"
        report.add(check, "not_an_object", f"{name} holds JSON null, not an object", file=name)
    return document


@functools.lru_cache(maxsize=4096)
def _shard_name_problem(name: str) -> tuple[str, str] | None:
    """(code, why) when ``name`` is not a plain ``*.safetensors`` file name in the directory."""
    problem = _unsafe_name(name)
    if problem:
        return "unsafe_shard_name", problem
    if not name.endswith(".safetensors"):
        return "not_safetensors", "does not end in .safetensors (only safetensors shards are read; pickles are never opened)"
    return None


def _unsafe_name(name: str) -> str | None:
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
    # every name the index lists counts, also one refused as a shard name (its own finding says so)
    weight_map = view.index.get("weight_map")
    listed = {s for s in weight_map.values() if type(s) is str} if isinstance(weight_map, dict) else set()
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
    _check_nested_weight_files(view, report)


def _check_nested_weight_files(view: CheckpointView, report: PreflightReport) -> None:
    """Warn about weight files in subdirectories (the published repos ship ``original/``).

    They are never read, but a tool pointed at the directory may pick them up. The search is
    bounded: ``NESTED_SEARCH_DEPTH`` levels, ``NESTED_SEARCH_ENTRIES`` entries, no links followed.
    """
    found: dict[str, list[str]] = {}
    budget = NESTED_SEARCH_ENTRIES
    level = [""]
    for _ in range(NESTED_SEARCH_DEPTH + 1):
        below: list[str] = []
        for relative in level:
            try:
                with os.scandir(os.path.join(view.root, relative)) as entries:
                    for entry in entries:
                        budget -= 1
                        if budget < 0:
                            break
                        name = os.path.join(relative, entry.name) if relative else entry.name
                        if entry.is_dir(follow_symlinks=False):
                            below.append(name)
                        elif relative and entry.name.lower().endswith(fmt.WEIGHT_FILE_SUFFIXES):
                            found.setdefault(name.split(os.sep, 1)[0], []).append(name)
            except OSError:
                continue
        level = below
    for directory, names in sorted(found.items()):
        shown = ", ".join(sorted(names)[:5]) + (f" and {len(names) - 5} more" if len(names) > 5 else "")
        report.add(
            "filesystem", "nested_weight_files",
            f"{directory}/ holds weight files ({shown}); they are not part of this checkpoint and are "
            "never read, but a second weight set beside it is easy to load by mistake: move it out",
            file=directory, severity=Severity.WARNING,
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
        report.add("config", exc.reason, f"{exc.field}: {exc.problem}; the namespace cannot be derived", file=name, key=exc.field)
    _add_problems(report, model_config_problems(config, view.dims, check="config", what=name, compare_dims=False), file=name)
    _add_problems(report, config_field_problems(config, view.dims), file=name)


def _add_problems(report: PreflightReport, problems: list[Problem], *, file: str | None = None) -> None:
    for problem in problems:
        report.add(problem.check, problem.reason, problem.message, file=file, key=problem.key,
                   severity=Severity.WARNING if problem.warning else Severity.ERROR)


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
        _check_weight_map(view, report, weight_map)
    _check_metadata_fields(view, report, index.get("metadata"))


def _check_weight_map(view: CheckpointView, report: PreflightReport, weight_map: dict[str, Any]) -> None:
    """Keep the entries naming a plain ``*.safetensors`` file; one finding per bad shard name.

    Work is per distinct shard name where it can be (an index may list millions of keys).
    """
    name = fmt.INDEX_FILE
    if set(map(type, weight_map.values())) == {str}:
        problems = {shard: _shard_name_problem(shard) for shard in set(weight_map.values())}
        if not any(problems.values()):
            view.weight_map = weight_map
            return
    bad: dict[str, list[Any]] = {}  # shard name → [code, problem, first key, count]
    for key, shard in weight_map.items():
        if type(shard) is not str:
            report.add("index", "bad_weight_map_entry", f"weight_map[{key[:200]!r}] is {describe(shard)}, not a file name", file=name, key=key)
            continue
        problem = _shard_name_problem(shard)
        if problem is None:
            view.weight_map[key] = shard
        elif shard in bad:
            bad[shard][3] += 1
        else:
            bad[shard] = [*problem, key, 1]
    for shard, (code, problem, key, count) in bad.items():
        more = f" (and {count - 1:,} more keys)" if count > 1 else ""
        report.add(
            "filesystem", code,
            f"weight_map names shard {shard[:200]!r} for {key[:200]!r}{more}, which {problem}; shards must be "
            "plain *.safetensors file names in the checkpoint directory",
            file=name, key=key,
        )


def _check_metadata_fields(view: CheckpointView, report: PreflightReport, metadata: Any) -> None:
    name = fmt.INDEX_FILE
    if not isinstance(metadata, dict):
        report.add("index", "missing_metadata", "metadata is missing or not an object", file=name, key="metadata")
        return
    if "format" not in metadata and set(metadata) <= {"total_size", "total_parameters"}:
        advice = _foreign_advice(view) or (
            f"this is a Hugging Face index: {fmt.convert_advice(view.root)} (an HF MXFP4 checkpoint also loads "
            "with CHECKPOINT_FORMAT unset)")
        report.add(
            "index", "not_normalized",
            f"the index has no normalized-format metadata (only {sorted(metadata)}); {advice}",
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
    elif type(total) is int and total > fmt.MAX_BYTE_COUNT:
        report.add("index", "out_of_range", f"total_size {describe(total)} is above 2^53 bytes", file=name, key="metadata.total_size")
    for key in ("padded_hidden_size", "padded_intermediate_size"):
        value = metadata.get(key)
        if type(value) is int and bounded_int(value) is None:
            report.add("index", "out_of_range", f"metadata field {key!r} is {describe(value)}, not an integer in 1 … 2^31", file=name, key=f"metadata.{key}")
    digests = metadata.get("shard_sha256")
    if isinstance(digests, dict):
        shards = set(view.weight_map.values())
        unused = digests.keys() - shards
        for shard in _first_members(unused, digests):
            report.add("index", "bad_shard_sha256", f"shard_sha256 names {shard[:200]!r}, which the weight_map does not use", file=name, key="metadata.shard_sha256")
        report.add_omitted("index", "bad_shard_sha256", len(unused) - MAX_FINDINGS_PER_CODE)
        for shard in digests.keys() & shards:
            digest = digests[shard]
            if not (isinstance(digest, str) and _SHA256_HEX.match(digest)):
                report.add("index", "bad_shard_sha256", f"shard_sha256[{shard!r}] is not a lowercase hex SHA-256", file=name, key="metadata.shard_sha256")
        for shard in sorted(shards - digests.keys()):
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
    except NotRegularFileError as exc:
        raise _ShardProblem("filesystem", "not_a_file", f"{exc}: a shard must be a plain file (refused before it was opened for reading)") from None
    except OSError as exc:
        raise _ShardProblem("filesystem", "unreadable", f"cannot read {shard}: {exc.strerror or exc}") from None


def _read_headers(view: CheckpointView, report: PreflightReport) -> None:
    real_root = os.path.realpath(view.root)
    listed = set(view.weight_map.values())
    try:
        present = listed & set(os.listdir(view.root))
    except OSError:
        present = listed
    for shard in sorted(listed - present):  # one listing, not a stat per missing name
        view.broken_shards.add(shard)
        report.add("ownership", "missing_shard", f"the index lists shard {shard}, which does not exist", file=shard)
    for shard in sorted(present):
        try:
            header = _read_shard_header(view.root, real_root, shard)
        except _ShardProblem as problem:
            view.broken_shards.add(shard)
            report.add(problem.check, problem.reason, problem.message, file=shard, key=problem.key)
            continue
        report.bytes_read += header.bytes_read
        view.headers[shard] = header
        if view.locations.keys().isdisjoint(header.tensors):  # the common case, at C speed
            view.locations.update(zip(header.tensors, map(list, itertools.repeat((shard,))), strict=False))
            continue
        for key in header.tensors:
            view.locations.setdefault(key, []).append(shard)


def _first_members(members: set[str], *orders: Mapping[str, Any]) -> list[str]:
    """The members to report one by one: all of them sorted, or beyond the per-code cap the
    first ``MAX_FINDINGS_PER_CODE`` in the files' order (no sort of millions of names)."""
    if len(members) <= MAX_FINDINGS_PER_CODE:
        return sorted(members)
    candidates = (key for order in orders for key in order if key in members)
    return sorted(set(itertools.islice(candidates, 2 * MAX_FINDINGS_PER_CODE)))[:MAX_FINDINGS_PER_CODE]


def _check_ownership(view: CheckpointView, report: PreflightReport) -> None:
    # keys no shard holds are found with set operations: an index may list millions
    nowhere = view.weight_map.keys() - view.locations.keys()
    if view.broken_shards:  # keys of an unreadable shard: that shard's finding says it
        nowhere = {key for key in nowhere if view.weight_map[key] not in view.broken_shards}
    shown = _first_members(nowhere, view.weight_map)
    for key in shown:
        report.add("ownership", "key_not_in_shard", f"the index assigns {key} to {view.weight_map[key]}, but no shard holds it", file=view.weight_map[key], key=key)
    report.add_omitted("ownership", "key_not_in_shard", len(nowhere) - len(shown))
    # a key held by a shard the index does not assign it to: per shard, its keys' shards in the
    # index (one C-speed map); only a shard where they are not all this shard is looked into
    misplaced: set[str] = set()
    unlisting: list[tuple[str, SafetensorsHeader]] = []  # the shards holding a key the index does not list
    for shard, header in view.headers.items():
        assigned = list(map(view.weight_map.get, header.tensors))  # per key, its shard in the index
        if assigned.count(shard) == len(assigned):
            continue  # the common case: every key listed, and listed in this shard
        misplaced.update(itertools.compress(header.tensors, map(operator.ne, assigned, itertools.repeat(shard))))
        if None in assigned:
            unlisting.append((shard, header))
    for key in sorted(misplaced & view.weight_map.keys()):
        shard = view.weight_map[key]
        if shard in view.broken_shards or key in view.headers[shard].tensors:
            continue  # the assigned shard holds it too: a collision, reported as such
        elsewhere = view.locations[key]
        report.add("ownership", "key_in_other_shard", f"the index assigns {key} to {shard}, but it is only in {', '.join(elsewhere)}: fix the weight_map or move the tensor", file=shard, key=key)
    for shard, header in unlisting:
        unlisted = {key for key in header.tensors if key not in view.weight_map}
        shown = _first_members(unlisted, header.tensors)  # a header may hold a million phantom names
        for key in shown:
            report.add("ownership", "unlisted_key", f"{shard} holds {key}, which the index does not list", file=shard, key=key)
        report.add_omitted("ownership", "unlisted_key", len(unlisted) - len(shown))


def _check_collisions(view: CheckpointView, report: PreflightReport) -> None:
    if max(map(len, view.locations.values()), default=0) < 2:
        return
    for key, shards in view.locations.items():
        if len(shards) > 1:
            report.add("collision", "duplicate_tensor", f"{key} is in {len(shards)} shard headers ({', '.join(shards)}); exactly one may hold it", file=shards[1], key=key)


# --------------------------------------------------------------------------- config ↔ metadata


def _check_metadata_against_config(view: CheckpointView, report: PreflightReport, allow_custom_model: bool) -> None:
    if view.dims is None or not _dims_in_proportion(view, report):
        return
    dims, name = view.dims, fmt.CONFIG_FILE
    profile = view.metadata.get("model_profile")
    profile = profile if isinstance(profile, str) else None
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
    padded_h, padded_i = bounded_int(view.metadata.get("padded_hidden_size")), bounded_int(view.metadata.get("padded_intermediate_size"))
    if padded_h is None or padded_i is None:
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
    present = len(view.weight_map) + len(view.locations.keys() - view.weight_map.keys())
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


def _check_inference_config(view: CheckpointView, report: PreflightReport, config: Any) -> None:
    """NxDI's InferenceConfig must describe the checkpoint's model and build it with biases.

    It holds the padded sizes in hidden/intermediate_size and the checkpoint's in
    ``original_*``; ``attention_bias`` must be true (the same rules as for ``config.json``).
    """
    if view.dims is None:
        return
    _add_problems(report, model_config_problems(config, view.dims, check="config", what="NxDI's config", compare_dims=True), file=fmt.CONFIG_FILE)


# --------------------------------------------------------------------------- namespace, dtypes, sidecars


def _present_keys(view: CheckpointView) -> set[str]:
    return view.weight_map.keys() | view.locations.keys()


def _check_namespace(view: CheckpointView, report: PreflightReport) -> None:
    expected = view.expected()
    if expected is None:
        others = _present_keys(view)
    else:
        others = (view.weight_map.keys() - expected.keys()) | (view.locations.keys() - expected.keys())
    # names with a hint (derived, HF, legacy, stray scale) are found in one C-speed scan;
    # the rest are plain unexpected keys, reported up to the cap and counted exactly
    special = fmt.hinted_names(others)
    for key in sorted(special):
        where = view.weight_map.get(key) or (view.locations.get(key) or [None])[0]
        reason = fmt.derived_reason(key)
        foreign = fmt.foreign_name(key)
        if reason:
            report.add("namespace", "derived_key", f"{key} is {reason} at load time and must not be stored: remove it", file=where, key=key)
        elif foreign:
            hint = (_foreign_advice(view) if foreign[0] == "hf_name" else None) or foreign[1]
            report.add("namespace", foreign[0], f"{key} is not a normalized name; {hint}", file=where, key=key)
        elif fmt.is_stray_scale(key):
            report.add("sidecar", "stray_scale", f"{key} is a scale the format does not have (only the expert .scale sidecars exist): remove it", file=where, key=key)
        elif expected is not None:
            report.add("namespace", "unexpected_key", f"{key} is not part of the format: remove it", file=where, key=key)
    if expected is not None:
        plain = others - special
        shown = _first_members(plain, view.weight_map, view.locations)
        for key in shown:
            where = view.weight_map.get(key) or (view.locations.get(key) or [None])[0]
            report.add("namespace", "unexpected_key", f"{key} is not part of the format: remove it", file=where, key=key)
        report.add_omitted("namespace", "unexpected_key", len(plain) - len(shown))
    if expected is None or not expected.keys() - view.weight_map.keys() - view.locations.keys():
        return
    for key, spec in expected.items():
        if key in view.weight_map or key in view.locations:
            continue
        report.add("namespace", "missing_key", f"{key} ({spec.dtype}{list(spec.shape)}) is missing from the index and every shard", key=key)


_DTYPE, _BEGIN, _END = operator.itemgetter(1), operator.itemgetter(3), operator.itemgetter(4)  # of a TensorInfo
_DTYPE_SHAPE = operator.itemgetter(1, 2)  # (dtype, shape) of a TensorInfo
_SPEC_DTYPE_SHAPE = operator.attrgetter("dtype", "shape")  # (dtype, shape) of a TensorSpec
_EXPERT_SCALE_SUFFIXES = (f"{fmt.GATE_UP}.scale", f"{fmt.DOWN}.scale")  # fmt.is_expert_scale, at C speed


def _unique_locations(view: CheckpointView) -> bool:
    """Whether no tensor is in more than one shard header (then ``view.tensor(key)`` is its one place)."""
    return max(map(len, view.locations.values()), default=0) < 2


def _check_dtype_shape(view: CheckpointView, report: PreflightReport) -> None:
    expected = view.expected()
    if expected is None:
        return
    if _unique_locations(view):
        # the common case at C speed: every present key's (dtype, shape) as the format says
        found_types: dict[str, tuple[str, tuple[int, ...]]] = {}
        for header in view.headers.values():
            found_types.update(zip(header.tensors, map(_DTYPE_SHAPE, header.tensors.values()), strict=True))
        wanted = list(map(_SPEC_DTYPE_SHAPE, expected.values()))
        if list(map(found_types.get, expected, wanted)) == wanted:  # a missing key counts as wanted
            return
    for key, spec in expected.items():
        found = view.tensor(key)
        if found is None:
            continue
        shard, info = found
        if info.dtype != spec.dtype:
            report.add("dtype_shape", "wrong_dtype", f"{key} is {info.dtype}, the format requires {spec.dtype}", file=shard, key=key)
        if info.shape != spec.shape:
            report.add("dtype_shape", "wrong_shape", f"{key} has shape {list(info.shape)}, the format requires {list(spec.shape)}", file=shard, key=key)


def _sidecars_paired(view: CheckpointView) -> bool:
    """Whether no sidecar finding can arise, decided per shard at C speed (the common case):
    no tensor in two shards, every FP8 ``.weight`` has its scale in its own shard, and every
    expert scale has an FP8 weight in its own shard."""
    if not _unique_locations(view):
        return False
    for header in view.headers.values():
        keys = header.tensors
        fp8 = set(itertools.compress(keys, map(str.startswith, map(_DTYPE, keys.values()), itertools.repeat("F8_"))))
        weights = [key for key in fp8 if key.endswith(".weight")]
        scales = itertools.compress(keys, map(str.endswith, keys, itertools.repeat(_EXPERT_SCALE_SUFFIXES)))
        if not keys.keys() >= set(map(fmt.scale_key_for, weights)) or not fp8 >= set(map(fmt.weight_key_for, scales)):
            return False
    return True


def _check_sidecars(view: CheckpointView, report: PreflightReport) -> None:
    if _sidecars_paired(view):
        return
    # only FP8 tensors and expert scales have sidecar rules: select them cheaply, then sort
    candidates = {key for header in view.headers.values() for key, info in header.tensors.items()
                  if info.dtype.startswith("F8_") or fmt.is_expert_scale(key)}
    for key in sorted(candidates):
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
    """Counts over float32 scales: ``bad`` values are not normal, finite and > 0.

    The other counts overlap (-0.0 is both negative and zero) and only explain ``bad``.
    """

    bad: int
    negative: int
    zero: int
    non_finite: int
    subnormal: int = 0
    first_bad: int = -1

    def merge(self, other: ScaleStats, offset: int) -> ScaleStats:
        """These counts plus ``other``'s, whose values start ``offset`` values later."""
        first = self.first_bad if self.first_bad >= 0 else (other.first_bad + offset if other.first_bad >= 0 else -1)
        return ScaleStats(self.bad + other.bad, self.negative + other.negative, self.zero + other.zero,
                          self.non_finite + other.non_finite, self.subnormal + other.subnormal, first)


# A float32 is bad when its sign is set or its exponent is all zeros (zero, subnormal) or all
# ones (inf, NaN). The exponent spans the top byte's low 7 bits and the next byte's top bit,
# so each value gets a class from each byte and the two are ANDed (as big integers, one bit
# field per value): 0 = good, 1 = zero/subnormal, 2 = inf/NaN, with bit 4 added for a sign.
_TOP_CLASS = bytes((4 if b & 0x80 else 0) | (1 if b & 0x7F == 0 else 2 if b & 0x7F == 0x7F else 0) for b in range(256))
_NEXT_CLASS = bytes(4 | (1 if b < 0x80 else 2) for b in range(256))
_NOT_ZERO = bytes(1 if b else 0 for b in range(256))
_LOW_EXPONENT = bytes(1 if b in (1, 5) else 0 for b in range(256))


# the float32 bit patterns that are normal, finite and > 0: one range of 32-bit words
# (0x00800000 is the smallest normal, 0x7F7FFFFF the largest finite)
_GOOD_WORDS = (0x0080_0000, 0x7F7F_FFFF)


def loaded_numpy() -> Any:
    """numpy if this process has already imported it (NxDI's process has), else None.

    The scale check uses it to decide ordinary scales faster, but never imports it: importing
    numpy costs more (~40 ms) than it saves on the largest published scales (~10 ms)."""
    return sys.modules.get("numpy")


def scale_stats(raw: bytes | bytearray, *, numpy: Any = None) -> ScaleStats:
    """Count little-endian float32 values in ``raw`` that are not normal, finite and > 0.

    No Python loop per value: the bytes of each value are taken with stride slices, classified
    with ``bytes.translate`` tables and combined as one big-integer AND, all C loops. Ordinary
    positive scales are decided by their top byte alone: all of them in 0x01 … 0x7E is one
    stride slice, ``isascii`` (no sign bit) and two ``memchr`` scans (no 0x00, no 0x7F) — or,
    given the ``numpy`` module, a min and a max over the values as 32-bit words (no copy): all
    of them good is all words in one range. Anything else is counted as above.
    """
    count = len(raw) // 4
    if len(raw) != 4 * count:
        raw = raw[:4 * count]
    if numpy is not None:
        words = numpy.frombuffer(raw, dtype="<u4")
        if not count or (words.min() >= _GOOD_WORDS[0] and words.max() <= _GOOD_WORDS[1]):
            return ScaleStats(0, 0, 0, 0)
    top = raw[3::4]  # bytes, or a bytearray for a bytearray (no second copy)
    if top.isascii() and b"\x00" not in top and b"\x7f" not in top:
        return ScaleStats(0, 0, 0, 0)
    if not raw.translate(None, b"\x00"):  # all zero (a preallocated, never-written file)
        return ScaleStats(count, 0, count, 0, 0, 0)
    classes = (int.from_bytes(top.translate(_TOP_CLASS), "little")
               & int.from_bytes(bytes(raw[2::4]).translate(_NEXT_CLASS), "little")).to_bytes(count, "little")
    good = classes.count(0)
    low_exponent = classes.count(1) + classes.count(5)
    non_finite = classes.count(2) + classes.count(6)
    zero = 0
    if low_exponent:  # exact zeros among them: the three low bytes are zero too
        low = int.from_bytes(raw[0::4].translate(_NOT_ZERO), "little") | int.from_bytes(raw[1::4].translate(_NOT_ZERO), "little") \
            | int.from_bytes(raw[2::4].translate(_NOT_ZERO), "little")
        exponent_zero = int.from_bytes(classes.translate(_LOW_EXPONENT), "little")
        zero = (exponent_zero & ~low).bit_count()
    return ScaleStats(
        bad=count - good, negative=count - good - classes.count(1) - classes.count(2), zero=zero,
        non_finite=non_finite, subnormal=low_exponent - zero,
        first_bad=count - len(classes.lstrip(b"\x00")) if good < count else -1,
    )


# Checks whose errors make the shard headers untrustworthy as a map of the scales' bytes.
_SCALE_BLOCKERS = frozenset({"config", "index", "header", "ownership", "collision", "dtype_shape", "sidecar"})


def _scales_trusted(view: CheckpointView, report: PreflightReport) -> bool:
    """Whether the scales may be read: config, index and headers agree, and the size is bounded.

    Otherwise one finding says why they were not read (an info when other errors already make
    the checkpoint invalid; an error when the checkpoint claims more scale bytes than the
    preflight will read).
    """
    blocked = sorted({f.check for f in report.errors if f.check in _SCALE_BLOCKERS})
    if view.layout is None or view.broken_shards or blocked:
        reason = f"of the {', '.join(blocked)} errors above" if blocked else "the config and index give no usable layout"
        report.add("values", "not_checked", f"scale values were not read because {reason}: fix those first", severity=Severity.INFO)
        return False
    layout = view.layout
    total = 4 * layout.dims.num_hidden_layers * layout.dims.num_local_experts * (2 * layout.padded_intermediate_size + layout.padded_hidden_size)
    if total > MAX_SCALE_BYTES:
        report.add(
            "values", "scales_too_large",
            f"the layout implies {total:,} bytes of expert scales, above the {MAX_SCALE_BYTES:,} the preflight "
            "reads (the published profiles hold at most a few hundred MB): the scales cannot be checked",
            file=fmt.INDEX_FILE, key="metadata",
        )
        return False
    return True


def _read_scale_stats(header: SafetensorsHeader, info: TensorInfo, report: PreflightReport,
                      numpy: Any = None) -> tuple[ScaleStats, bytes]:
    """Stats of one scale tensor read in chunks (``numpy``: as for ``scale_stats``); also the
    first bad value's 4 bytes (or b"")."""
    stats = ScaleStats(0, 0, 0, 0)
    first_value = b""
    # one reused buffer, filled by readinto: no fresh allocation (and page faults) per chunk
    buffer = bytearray(min(SCALE_CHUNK_BYTES, info.nbytes))
    with open_regular(header.path, buffering=0) as handle:
        handle.seek(header.data_offset + info.begin)
        done = 0
        while done < info.nbytes:
            size = min(len(buffer), info.nbytes - done)
            got = _read_into(handle, memoryview(buffer)[:size])
            if not got:
                raise EOFError
            report.bytes_read += got
            raw = buffer if got == len(buffer) else buffer[:got]
            chunk = scale_stats(raw, numpy=numpy)
            if chunk.bad and not first_value:
                first_value = bytes(raw[4 * chunk.first_bad:4 * chunk.first_bad + 4])
            stats = stats.merge(chunk, done // 4)
            done += got
    return stats, first_value


def _read_into(handle: Any, view: memoryview) -> int:
    """Fill ``view`` from ``handle`` (short reads continued); the bytes read, fewer only at the end of the file."""
    got = 0
    while got < len(view):
        count = handle.readinto(view[got:])
        if not count:
            break
        got += count
    return got


def _check_scale_values(view: CheckpointView, report: PreflightReport) -> None:
    # only scales of the format's shape are read: a mis-shaped "scale" could be any size
    expected = view.expected() or {}
    numpy = loaded_numpy()
    for key in sorted(k for k in expected if fmt.is_expert_scale(k) and k in view.locations):
        shard, info = view.tensor(key)  # type: ignore[misc]
        spec = expected.get(key)
        if info.dtype != fmt.F32 or spec is None or info.shape != spec.shape:
            continue
        try:
            stats, first_value = _read_scale_stats(view.headers[shard], info, report, numpy)
        except EOFError:
            report.add("header", "data_beyond_file", f"{shard} ended while reading {key}", file=shard, key=key)
            continue
        except OSError as exc:
            report.add("filesystem", "unreadable", f"cannot read {key} from {shard}: {exc.strerror or exc}", file=shard, key=key)
            continue
        if stats.bad:
            (value,) = struct.unpack("<f", first_value)
            coords = _unravel(stats.first_bad, info.shape)
            report.add(
                "values", "bad_scale",
                f"{key} has {stats.bad:,} of {info.numel:,} scales that are not normal, finite and > 0 "
                f"({stats.negative:,} negative, {stats.zero:,} zero, {stats.subnormal:,} subnormal, "
                f"{stats.non_finite:,} inf/NaN); first at {list(coords)} = {value!r}",
                file=shard, key=key,
            )


def _unravel(index: int, shape: tuple[int, ...]) -> tuple[int, ...]:
    coords = []
    for dim in reversed(shape):
        coords.append(index % dim if dim else 0)
        index //= dim or 1
    return tuple(reversed(coords))


def _check_total_size(view: CheckpointView, report: PreflightReport) -> None:
    total = bounded_int(view.metadata.get("total_size"), 0, fmt.MAX_BYTE_COUNT)
    if total is None or view.broken_shards or not view.headers:
        return
    infos = list(itertools.chain.from_iterable(header.tensors.values() for header in view.headers.values()))
    actual = sum(map(_END, infos)) - sum(map(_BEGIN, infos))
    if actual != total:
        report.add("index", "total_size_mismatch", f"metadata total_size is {total:,} but the shard headers hold {actual:,} tensor bytes", file=fmt.INDEX_FILE, key="metadata.total_size")


# --------------------------------------------------------------------------- neuron_config


def check_neuron_config(view: CheckpointView, report: PreflightReport, neuron_config: Any) -> None:
    """The ``neuron_config`` checks (docs/format.md, Findings by check): what NxDI needs to run this checkpoint.

    One rule set (``nxdi_config.neuron_config_problems``) for NxDI's objects and for JSON
    (flat, or nested as NxDI saves it: then its model part is held against ``config.json``).
    """
    nc = neuron_config_view(neuron_config)
    stored = {key: view.metadata.get(key) for key in ("padded_hidden_size", "padded_intermediate_size")}
    _add_problems(report, neuron_config_problems(nc, dims=view.dims, layout=view.layout, stored_padding=stored))
    model = model_part(neuron_config)
    if model is not None and view.dims is not None and has_model_fields(model):
        # the same rules (and codes) as NxDI's InferenceConfig at load: it is one, serialized
        _add_problems(report, model_config_problems(model, view.dims, check="config", what="the NxDI config file", compare_dims=True))


def bound_config(neuron_config: Any, inference_config: Any) -> Any:
    """The one config object a report is bound to, as the loader receives it: the
    InferenceConfig (or nested mapping) when given, else the NeuronConfig; both when the
    NeuronConfig is not the one inside the InferenceConfig (no single load config matches that)."""
    if inference_config is None:
        return neuron_config
    if neuron_config is None or neuron_config is neuron_config_view(inference_config):
        return inference_config
    return (neuron_config, inference_config)
