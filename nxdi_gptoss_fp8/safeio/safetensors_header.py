"""A strict, bounded reader of safetensors headers (stdlib only; never reads tensor data).

The safetensors libraries tolerate things a fail-closed loader must not: a JSON object with a
repeated tensor name silently keeps the last one, and nothing relates a file to the index that
names it. This reader checks, in a fixed order, and stops at the first problem of a file:

1. the 8-byte little-endian length prefix fits the file and the 100,000,000-byte cap
   (nothing is allocated from the length before that);
2. the header is UTF-8, is a JSON object, has no repeated key at any depth, no NaN/Infinity;
3. every entry has a known dtype, a shape of non-negative integers and two integer offsets,
   each written as a plain JSON integer (``-0``, ``0.0``, ``1e2`` are refused, as the
   reference parser refuses them);
4. byte size = number of elements × dtype size, and every byte count, within 0 … 2^53;
5. the offsets, sorted, start at 0, touch without gap or overlap, and end exactly at the end
   of the file.

Each failure is a ``HeaderError`` with a stable ``code`` and a message naming the tensor.
"""

from __future__ import annotations

import hashlib
import json
import math
import operator
import os
import struct
from collections.abc import Mapping
from dataclasses import dataclass, field
from itertools import chain, repeat
from typing import Any, BinaryIO, NamedTuple

from ..errors import NxdiGptossFp8Error
from ..format import DTYPE_BITS, MAX_BYTE_COUNT
from ..units import plural
from .files import FileIdentity, open_regular
from .strict_json import JsonError, NonInteger, parse_json_strict

__all__ = [
    "MAX_HEADER_SIZE", "METADATA_KEY", "PREFIX_SIZE", "HeaderError", "SafetensorsHeader",
    "TensorInfo", "parse_header_bytes", "read_header", "read_header_bytes",
]

MAX_HEADER_SIZE = 100_000_000
PREFIX_SIZE = 8
METADATA_KEY = "__metadata__"


class HeaderError(NxdiGptossFp8Error, ValueError):
    """A safetensors header that breaks the format; ``code`` names the rule it breaks.

    One of the package's errors (``NxdiGptossFp8Error``) and, as before, a ``ValueError``."""

    def __init__(self, code: str, message: str, key: str | None = None) -> None:
        super().__init__(message)
        self.code = code
        self.key = key


class TensorInfo(NamedTuple):
    """One tensor entry of a header: dtype, shape and byte range within the data section.

    Immutable; a named tuple because a header may hold a million entries and a tuple is built
    in a fraction of a frozen dataclass's time."""

    name: str
    dtype: str
    shape: tuple[int, ...]
    begin: int
    end: int

    @property
    def nbytes(self) -> int:
        return self.end - self.begin

    @property
    def numel(self) -> int:
        return math.prod(self.shape)


@dataclass(frozen=True)
class SafetensorsHeader:
    """A parsed, validated header: where the data starts and what each tensor occupies."""

    path: str
    identity: FileIdentity
    header_length: int
    header_sha256: str
    tensors: Mapping[str, TensorInfo]
    metadata: Mapping[str, str] = field(default_factory=dict)

    @property
    def data_offset(self) -> int:
        """Absolute file offset of the first data byte."""
        return PREFIX_SIZE + self.header_length

    @property
    def bytes_read(self) -> int:
        return PREFIX_SIZE + self.header_length


def _read_exact(handle: BinaryIO, size: int) -> bytes:
    chunks, remaining = [], size
    while remaining:
        chunk = handle.read(min(remaining, 1 << 24))
        if not chunk:
            break
        chunks.append(chunk)
        remaining -= len(chunk)
    return b"".join(chunks)


def read_header_bytes(handle: BinaryIO, file_size: int, *, max_header_size: int = MAX_HEADER_SIZE) -> bytes:
    """The header bytes (without the length prefix) of the safetensors file open as ``handle``
    (at its start) of ``file_size`` bytes: the one reader of a length prefix and what it covers.

    Reads the 8-byte prefix, then the header only once its length fits the cap and the file
    (nothing is allocated from the length before that). ``HeaderError`` with code ``too_short``,
    ``header_too_large`` or ``header_beyond_file`` (also for a file that shrank while read).
    """
    prefix = _read_exact(handle, PREFIX_SIZE)
    if len(prefix) < PREFIX_SIZE:
        raise HeaderError(
            "too_short", f"file is {plural(file_size, 'byte')}, shorter than the 8-byte length prefix"
        )
    (length,) = struct.unpack("<Q", prefix)
    if length > max_header_size:
        raise HeaderError(
            "header_too_large",
            f"header length {length} is above the {max_header_size}-byte limit",
        )
    if PREFIX_SIZE + length > file_size:
        raise HeaderError(
            "header_beyond_file",
            f"header length {length} runs past the end of the {file_size}-byte file "
            "(truncated or not a safetensors file)",
        )
    raw = _read_exact(handle, length)
    if len(raw) != length:
        raise HeaderError("header_beyond_file", "file shrank while its header was read")
    return raw


def read_header(path: str | os.PathLike[str], *, max_header_size: int = MAX_HEADER_SIZE) -> SafetensorsHeader:
    """Read and validate the header of the safetensors file at ``path``.

    Reads at most ``8 + header length`` bytes. Raises ``HeaderError`` for a malformed file,
    ``NotRegularFileError`` (before reading, never blocking) for a FIFO, socket, device or
    directory, and ``OSError`` when the file cannot be opened or read.
    """
    with open_regular(path) as handle:
        identity = FileIdentity.of(os.fstat(handle.fileno()))
        raw = read_header_bytes(handle, identity.size, max_header_size=max_header_size)
    return parse_header_bytes(raw, path=os.fspath(path), identity=identity)


def parse_header_bytes(raw: bytes, *, path: str, identity: FileIdentity) -> SafetensorsHeader:
    """Validate header bytes (without the length prefix) of a file of ``identity.size`` bytes."""
    if not raw.startswith(b"{"):
        raise HeaderError("invalid_json", "header does not start with '{'")
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise HeaderError("not_utf8", f"header is not UTF-8 ({exc.reason} at byte {exc.start})") from None
    data_size = identity.size - PREFIX_SIZE - len(raw)
    tensors, metadata = _parse_common(text, data_size) or _parse_by_rule(text, data_size)
    return SafetensorsHeader(
        path=path,
        identity=identity,
        header_length=len(raw),
        header_sha256=hashlib.sha256(raw).hexdigest(),
        tensors=tensors,
        metadata=metadata,
    )


def _parse_by_rule(text: str, data_size: int) -> tuple[dict[str, TensorInfo], dict[str, str]]:
    """The tensors and metadata of a header, every rule checked in order: ``HeaderError`` for
    the first one broken (``_parse_common`` returns the same result faster when none is)."""
    try:
        # headers bound their own numbers (offsets ≤ 2^53, shapes overflow-checked) and their
        # shape (entries of three fields), so no depth walk; -0 needs the per-integer hook
        document = parse_json_strict(text, what="header", mark_non_integers=True, max_int_digits=20, max_depth=None,
                                     int_hook="-0" in text)
    except JsonError as exc:
        raise HeaderError(exc.code, str(exc), exc.key) from None
    if not isinstance(document, dict):
        raise HeaderError("invalid_json", "header JSON is not an object")
    metadata = document.pop(METADATA_KEY, {})
    if not isinstance(metadata, dict) or not all(
        isinstance(key, str) and isinstance(value, str) for key, value in metadata.items()
    ):
        raise HeaderError("bad_metadata", "__metadata__ must be an object of string values")
    # each parsed entry is dropped as soon as its TensorInfo exists (memory: a header may hold
    # a million entries)
    tensors = {name: _tensor_info(name, document.pop(name), data_size) for name in list(document)}
    _check_offsets(tensors, data_size)
    return tensors, metadata


_ENTRY_ORDER = ["dtype", "shape", "data_offsets"]
_STR_LIST = {str, list}
_SCAN_JSON = json.JSONDecoder().scan_once  # (value, end) of the JSON text at an index, no hooks


def _parse_common(text: str, data_size: int) -> tuple[dict[str, TensorInfo], dict[str, str]] | None:
    """The tensors and metadata of a header that breaks no rule, decided with whole-header C
    loops (``json.loads`` without hooks, ``map``, ``set``, ``sorted``); None for anything else,
    which the rule-by-rule path then parses again and names (a well-formed header is the
    common case: this path is several times faster than the per-entry one).

    Nothing is accepted that the rule-by-rule path refuses: every value is type-checked;
    ``-0`` and ``\\u`` escapes (a lone surrogate, an escaped ``:``) go to the strict parser; and
    a repeated key is ruled out by counting: the text holds one ``:`` per key/value pair plus
    the ``:`` inside its strings (all of them keys, dtypes or metadata here), so the pairs
    written equal the entries parsed only when no key repeats at any depth.
    """
    if "-0" in text or "\\u" in text:
        return None
    try:
        document, end = _SCAN_JSON(text, 0)  # json.loads without its wrapper (whitespace regexes)
    except (ValueError, RecursionError, StopIteration):
        return None
    if type(document) is not dict or (end != len(text) and text[end:].strip(" \t\n\r")):
        return None  # not an object, or more than JSON whitespace after it (writers pad with spaces)
    pairs = len(document)
    metadata = document.pop(METADATA_KEY, {})
    in_strings = "".join(document).count(":")
    if type(metadata) is not dict or (metadata and set(map(type, metadata.values())) != {str}):
        return None
    pairs += len(metadata)
    in_strings += "".join(metadata).count(":") + "".join(metadata.values()).count(":")
    names, entries = list(document), list(document.values())
    if not entries:
        return ({}, metadata) if data_size == 0 and text.count(":") - in_strings == pairs else None
    count = len(entries)
    # every entry a dict of exactly dtype, shape, data_offsets (in the order the writers use)
    if set(map(type, entries)) != {dict} or list(chain.from_iterable(entries)) != _ENTRY_ORDER * count:
        return None
    if text.count(":") - in_strings != pairs + 3 * count:
        return None
    fields = list(chain.from_iterable(map(dict.values, entries)))
    dtypes, shapes, offsets = fields[0::3], fields[1::3], fields[2::3]
    try:
        bits = list(map(DTYPE_BITS.__getitem__, dtypes))
    except (KeyError, TypeError):  # an unknown or unhashable dtype
        return None
    # (the dtypes are strings: they are DTYPE_BITS keys)
    if set(map(type, fields)) != _STR_LIST or set(map(len, offsets)) != {2} or max(map(len, shapes)) > 8:
        return None
    dims, bounds = list(chain.from_iterable(shapes)), list(chain.from_iterable(offsets))
    if set(map(type, chain(dims, bounds))) != {int} or min(chain(dims, bounds)) < 0 or max(bounds) > MAX_BYTE_COUNT:
        return None
    size_bits = list(map(operator.mul, map(math.prod, shapes), bits))
    begins, ends = bounds[0::2], bounds[1::2]
    if max(size_bits) > 8 * MAX_BYTE_COUNT or any(map(operator.and_, size_bits, repeat(7))) \
            or list(map(operator.rshift, size_bits, repeat(3))) != list(map(operator.sub, ends, begins)):
        return None
    # sorted by (begin, end), each tensor starts where the one before ends: no gap, no overlap
    spans = list(chain.from_iterable(sorted(offsets)))
    if spans[0] != 0 or spans[-1] != data_size or spans[1:-1:2] != spans[2::2]:
        return None
    # tuple.__new__ builds each TensorInfo in C (the named tuple's own __new__ is a Python call)
    infos = map(tuple.__new__, repeat(TensorInfo), zip(names, dtypes, map(tuple, shapes), begins, ends, strict=True))
    return dict(zip(names, infos, strict=True)), metadata


def _is_int(value: Any) -> bool:
    return type(value) is int


def _not_plain(values: Any) -> list[str]:
    """The number literals in ``values`` that are not plain JSON integers (``-0``, ``1.0``, ``1e2``)."""
    return [str(v) for v in values if isinstance(v, NonInteger)] if isinstance(values, list) else []


_ENTRY_KEYS = frozenset({"dtype", "shape", "data_offsets"})
_INTS = frozenset({int})


def _tensor_info(name: str, entry: Any, data_size: int) -> TensorInfo:
    # the common case in C-speed tests; anything unusual takes the rule-by-rule path below,
    # which names the rule broken (a million-tensor header is read in seconds this way)
    if type(entry) is dict and entry.keys() == _ENTRY_KEYS:
        dtype, shape, offsets = entry["dtype"], entry["shape"], entry["data_offsets"]
        bits = DTYPE_BITS.get(dtype) if type(dtype) is str else None
        if (
            bits is not None and type(shape) is list and len(shape) <= 8 and set(map(type, shape)) <= _INTS
            and (not shape or min(shape) >= 0) and type(offsets) is list and len(offsets) == 2
            and type(offsets[0]) is int and type(offsets[1]) is int and 0 <= offsets[0] <= offsets[1] <= MAX_BYTE_COUNT
        ):
            size_bits = math.prod(shape) * bits
            if size_bits <= 8 * MAX_BYTE_COUNT and not size_bits % 8 and offsets[1] - offsets[0] == size_bits // 8 \
                    and offsets[1] <= data_size:
                return TensorInfo(name, dtype, tuple(shape), offsets[0], offsets[1])
    return _tensor_info_checked(name, entry, data_size)


def _tensor_info_checked(name: str, entry: Any, data_size: int) -> TensorInfo:
    """Every rule in order, raising ``HeaderError`` for the first one broken."""
    if not isinstance(entry, dict):
        raise HeaderError("bad_entry", f"tensor {name!r}: entry is not an object", name)
    unknown = set(entry) - {"dtype", "shape", "data_offsets"}
    missing = {"dtype", "shape", "data_offsets"} - set(entry)
    if missing or unknown:
        detail = ", ".join(
            [f"missing {sorted(missing)}"] * bool(missing) + [f"unexpected {sorted(unknown)}"] * bool(unknown)
        )
        raise HeaderError("bad_entry", f"tensor {name!r}: {detail}", name)
    dtype, shape, offsets = entry["dtype"], entry["shape"], entry["data_offsets"]
    if not isinstance(dtype, str) or dtype not in DTYPE_BITS:
        raise HeaderError("unknown_dtype", f"tensor {name!r}: unknown dtype {dtype!r}", name)
    for label, code, values in (("shape", "bad_shape", shape), ("data_offsets", "bad_offsets", offsets)):
        if _not_plain(values):
            raise HeaderError(
                code,
                f"tensor {name!r}: {label} holds {', '.join(_not_plain(values))}, not a plain JSON integer "
                "(digits only; the reference safetensors parser refuses it too)",
                name,
            )
    if not isinstance(shape, list) or not all(_is_int(dim) and dim >= 0 for dim in shape):
        raise HeaderError(
            "bad_shape", f"tensor {name!r}: shape {shape!r} is not a list of non-negative integers", name
        )
    if (
        not isinstance(offsets, list)
        or len(offsets) != 2
        or not all(_is_int(offset) and 0 <= offset <= MAX_BYTE_COUNT for offset in offsets)
    ):
        raise HeaderError(
            "bad_offsets", f"tensor {name!r}: data_offsets {offsets!r} is not two integers in 0 … 2^53", name
        )
    begin, end = offsets
    if end < begin:
        raise HeaderError("bad_offsets", f"tensor {name!r}: data_offsets end {end} < begin {begin}", name)
    bits = DTYPE_BITS[dtype]
    numel = 1
    for dim in shape:
        numel *= dim
        if numel * bits > 8 * MAX_BYTE_COUNT:
            raise HeaderError("size_overflow", f"tensor {name!r}: shape {shape} holds more than 2^53 bytes", name)
    if numel * bits % 8:
        raise HeaderError(
            "size_mismatch", f"tensor {name!r}: {numel} × {bits}-bit {dtype} is not a whole number of bytes", name
        )
    expected = numel * bits // 8
    if end - begin != expected:
        raise HeaderError(
            "size_mismatch",
            f"tensor {name!r}: {dtype}{shape} needs {plural(expected, 'byte')}, data_offsets span {end - begin}",
            name,
        )
    if end > data_size:
        raise HeaderError(
            "data_beyond_file",
            f"tensor {name!r}: data ends at {end} but the file holds {plural(max(data_size, 0), 'data byte')} "
            "(truncated or half-copied file)",
            name,
        )
    return TensorInfo(name, dtype, tuple(shape), begin, end)


def _check_offsets(tensors: Mapping[str, TensorInfo], data_size: int) -> None:
    position = 0
    previous: str | None = None
    for info in sorted(tensors.values(), key=lambda t: (t.begin, t.end)):
        if info.begin < position:
            raise HeaderError(
                "offsets_overlap", f"tensor {info.name!r} overlaps {previous!r} at data offset {info.begin}", info.name
            )
        if info.begin > position:
            raise HeaderError(
                "offsets_gap",
                f"tensor {info.name!r} starts at {info.begin}, leaving bytes {position}..{info.begin} unowned",
                info.name,
            )
        position, previous = info.end, info.name
    if position != data_size:
        raise HeaderError(
            "trailing_bytes",
            f"tensors cover {plural(position, 'data byte')} but the file holds {data_size}",
        )
