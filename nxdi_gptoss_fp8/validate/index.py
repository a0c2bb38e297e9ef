"""The ``index`` checks: ``model.safetensors.index.json``, its weight map and metadata fields."""

from __future__ import annotations

import re
from typing import Any

from .. import format as fmt
from .. import other_formats
from ..padding import TARGETS, target_problems
from ..units import plural
from .directory import _read_json_file, _shard_name_problem
from .findings import MAX_FINDINGS_PER_CODE, PreflightReport
from .foreign import _foreign_advice
from .nxdi_config import bounded_int, describe
from .shards import _first_members
from .view import CheckpointView

__all__ = []


_SHA256_HEX = re.compile(r"^[0-9a-f]{64}$")


def _check_index(view: CheckpointView, report: PreflightReport) -> None:
    name = fmt.INDEX_FILE
    if not view.reader.exists(name):
        hint = ""
        if view.reader.exists("model.safetensors"):
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
        more = f" (and {plural(count - 1, 'more key')})" if count > 1 else ""
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
            f"this is a Hugging Face index: {other_formats.convert_advice(view.root)} (an HF MXFP4 checkpoint also loads "
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
            expected = "an object" if kind is dict else "a string"
            report.add("index", "wrong_metadata_type", f"metadata field {key!r} is a {type(metadata[key]).__name__}, expected {expected}", file=name, key=f"metadata.{key}")
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
    _check_target(report, metadata)
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


def _check_target(report: PreflightReport, metadata: dict[str, Any]) -> None:
    """``metadata.target`` (optional: checkpoints written before it have none) names a known
    conversion target whose padded sizes the index records."""
    target = metadata.get("target")
    if type(target) is not str:
        return
    hidden, intermediate = metadata.get("padded_hidden_size"), metadata.get("padded_intermediate_size")
    if target not in TARGETS:
        report.add("index", "unknown_target", f"{target_problems(target, 0, 0)[0][:300]}: convert again with a known "
                   "--target, or remove the field", file=fmt.INDEX_FILE, key="metadata.target")
    elif type(hidden) is int and type(intermediate) is int and (problems := target_problems(target, hidden, intermediate)):
        report.add("index", "target_mismatch", f"{problems[0]}: the index contradicts itself; convert again with "
                   f"--target {target}", file=fmt.INDEX_FILE, key="metadata.target")
