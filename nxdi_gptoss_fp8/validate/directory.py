"""The ``directory`` and ``files`` checks: the directory itself, stray and nested weight files, and the
bounded reading of its JSON files.
"""

from __future__ import annotations

import functools
import hashlib
import os
import re
from typing import Any

from .. import format as fmt
from ..safeio.files import FileIdentity
from ..safeio.json_file import JsonFileError
from ..units import plural
from .findings import PreflightReport, Severity
from .view import CheckpointView

__all__ = ["NESTED_SEARCH_DEPTH", "NESTED_SEARCH_ENTRIES", "VLLM_ARTIFACTS_DIR", "VLLM_ARTIFACTS_FIX"]


# How deep and how wide the directory is searched for weight files in subdirectories: deep
# enough for vLLM's compile folder (neuron-compiled-artifacts/<hash>/weights/tpN_...), bounded by
# the entries listed, never through a link (no loop).
NESTED_SEARCH_DEPTH = 8


NESTED_SEARCH_ENTRIES = 10_000


def _check_directory(view: CheckpointView, report: PreflightReport) -> bool:
    problem = view.reader.root_problem()
    if problem is not None:
        code, message = problem
        report.add("filesystem", code, message, file=view.root)
        return False
    return True


def _json_file_finding(exc: JsonFileError, name: str, check: str) -> tuple[str, str, str]:
    """(check, code, message) of the finding for a JSON file ``read_json_file`` refused."""
    if exc.code == "not_a_file":
        return "filesystem", "not_a_file", f"{exc.cause}: {name} must be a plain file (refused before it was opened for reading)"
    if exc.code == "unreadable":
        cause = exc.cause
        return "filesystem", "unreadable", f"cannot read {name}: {getattr(cause, 'strerror', None) or cause}"
    if exc.code == "too_large":
        return check, "too_large", f"{name} is {plural(exc.size, 'byte')}, above the {exc.limit:,}-byte limit"
    if exc.code == "grew":
        return check, "too_large", f"{name} grew above the {exc.limit:,}-byte limit while it was read"
    if exc.code == "not_utf8":
        return check, "invalid_json", f"{name} is not UTF-8 text"
    return check, exc.code, str(exc)  # the strict parser's code and message


def _read_json_file(view: CheckpointView, report: PreflightReport, name: str, check: str) -> Any:
    """Read a small JSON file strictly; report and return None when that is impossible.

    A link out of the directory, a FIFO, socket, device or directory is refused before it is
    opened (``filesystem``); the size is checked on the opened file before it is read.
    """
    try:
        target = view.reader.link_outside(name)
    except OSError as exc:
        report.add("filesystem", "unreadable", f"cannot read {name}: {exc.strerror or exc}", file=name)
        return None
    if target is not None:
        report.add("filesystem", "link_outside", f"{name} is a link to {target}, outside the checkpoint directory: copy the file in instead", file=name)
        return None

    def count_and_bind(raw: bytes, identity: FileIdentity) -> None:
        report.bytes_read += len(raw)
        view.json_files[name] = (identity, hashlib.sha256(raw).hexdigest())

    try:
        document = view.reader.read_json(name, what=name, on_read=count_and_bind)
    except JsonFileError as exc:
        report.add(*_json_file_finding(exc, name, check), file=name, key=exc.key)
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
        entries = sorted(view.reader.listing())
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


# where vllm-neuron (0.2.x) compiles when NEURON_COMPILED_ARTIFACTS is unset: inside the model
# directory, deleted and compiled again at every start
VLLM_ARTIFACTS_DIR = "neuron-compiled-artifacts"
VLLM_ARTIFACTS_FIX = ("vLLM compiled into the checkpoint because NEURON_COMPILED_ARTIFACTS was unset (and deletes "
                      "and recompiles it at every start): export NEURON_COMPILED_ARTIFACTS=DIR on persistent storage "
                      "outside the checkpoint, then remove this folder (nxdi-gptoss-fp8 doctor checks the settings)")


def _check_nested_weight_files(view: CheckpointView, report: PreflightReport) -> None:
    """Warn about weight files in subdirectories (the published repos ship ``original/``), and
    about vLLM's compile folder (``neuron-compiled-artifacts/``) wherever it sits, with or without
    weight files yet.

    They are never read, but a tool pointed at the directory may pick them up. The search is
    bounded: ``NESTED_SEARCH_DEPTH`` levels, ``NESTED_SEARCH_ENTRIES`` entries, no links followed.
    """
    found: dict[str, list[str]] = {}
    artifacts: list[str] = []
    for name, is_dir in view.reader.scan(NESTED_SEARCH_DEPTH, NESTED_SEARCH_ENTRIES):
        if is_dir:
            if os.path.basename(name) == VLLM_ARTIFACTS_DIR:
                artifacts.append(name)
        elif os.sep in name and name.lower().endswith(fmt.WEIGHT_FILE_SUFFIXES):
            found.setdefault(_nested_owner(name), []).append(name)
    for directory in artifacts:
        if directory not in found and not any(owner.startswith(directory + os.sep) for owner in found):
            report.add("filesystem", "nested_weight_files", f"{directory}/ is the folder vLLM compiles into: "
                       f"{VLLM_ARTIFACTS_FIX}", file=directory, severity=Severity.WARNING)
    for directory, names in sorted(found.items()):
        shown = ", ".join(sorted(names)[:5]) + (f" and {len(names) - 5} more" if len(names) > 5 else "")
        fix = VLLM_ARTIFACTS_FIX if os.path.basename(directory) == VLLM_ARTIFACTS_DIR else "move it out"
        report.add(
            "filesystem", "nested_weight_files",
            f"{directory}/ holds weight files ({shown}); they are not part of this checkpoint and are "
            f"never read, but a second weight set beside it is easy to load by mistake: {fix}",
            file=directory, severity=Severity.WARNING,
        )


def _nested_owner(name: str) -> str:
    """The folder a nested weight file is reported under: the outermost ``neuron-compiled-artifacts``
    on its path (vLLM's compile folder, at any depth), else its top-level folder."""
    parts = name.split(os.sep)
    if VLLM_ARTIFACTS_DIR in parts[:-1]:
        return os.sep.join(parts[:parts.index(VLLM_ARTIFACTS_DIR) + 1])
    return parts[0]
