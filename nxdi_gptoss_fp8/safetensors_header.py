"""A strict, bounded reader of safetensors headers (stdlib only; never reads tensor data).

The safetensors libraries tolerate things a fail-closed loader must not: a JSON object with a
repeated tensor name silently keeps the last one, and nothing relates a file to the index that
names it. This reader checks, in a fixed order, and stops at the first problem of a file:

1. the 8-byte little-endian length prefix fits the file and the 100,000,000-byte cap
   (nothing is allocated from the length before that);
2. the header is UTF-8, is a JSON object, has no repeated key at any depth, no NaN/Infinity;
3. every entry has a known dtype, a shape of non-negative integers and two integer offsets;
4. byte size = number of elements × dtype size (computed with an explicit overflow bound);
5. the offsets, sorted, start at 0, touch without gap or overlap, and end exactly at the end
   of the file.

Each failure is a ``HeaderError`` with a stable ``code`` and a message naming the tensor.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import struct
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, BinaryIO

from .format import DTYPE_BITS

MAX_HEADER_SIZE = 100_000_000
PREFIX_SIZE = 8
METADATA_KEY = "__metadata__"
_U64_LIMIT = 2**64


class HeaderError(ValueError):
    """A safetensors header that breaks the format; ``code`` names the rule it breaks."""

    def __init__(self, code: str, message: str, key: str | None = None) -> None:
        super().__init__(message)
        self.code = code
        self.key = key


@dataclass(frozen=True)
class TensorInfo:
    """One tensor entry of a header: dtype, shape and byte range within the data section."""

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
class FileIdentity:
    """What identifies one version of a file: device, inode, size, modification and change time.

    ``ctime_ns`` is what an in-place edit cannot hide: ``os.utime`` can put the modification
    time back, but it sets the change time to now (only the kernel writes it).
    """

    device: int
    inode: int
    size: int
    mtime_ns: int
    ctime_ns: int

    @classmethod
    def of(cls, stat: os.stat_result) -> FileIdentity:
        return cls(stat.st_dev, stat.st_ino, stat.st_size, stat.st_mtime_ns, stat.st_ctime_ns)

    def changes_since(self, before: FileIdentity) -> list[str]:
        """In words, how this identity differs from ``before`` (empty when it is the same file version)."""
        changes = []
        if (self.device, self.inode) != (before.device, before.inode):
            changes.append(f"device/inode {before.device}/{before.inode} → {self.device}/{self.inode} (the file was replaced)")
        if self.size != before.size:
            what = "truncated" if self.size < before.size else "grown"
            changes.append(f"size {before.size:,} → {self.size:,} bytes ({what})")
        if self.mtime_ns != before.mtime_ns:
            changes.append("modification time changed (rewritten in place)")
        if self.ctime_ns != before.ctime_ns:
            changes.append("change time changed (written, renamed, linked or its times reset)")
        return changes


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


def _reject_constant(name: str) -> Any:
    raise HeaderError("invalid_json", f"header JSON contains the non-standard constant {name}")


def parse_json_strict(text: str, *, what: str = "header") -> Any:
    """Parse JSON refusing repeated keys in any object and NaN/Infinity.

    Raises ``HeaderError`` with code ``duplicate_key``, ``invalid_json`` or ``too_deep``.
    """

    def pairs_hook(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
        result: dict[str, Any] = {}
        for key, value in pairs:
            if key in result:
                raise HeaderError("duplicate_key", f"{what} JSON repeats the key {key!r}", key)
            result[key] = value
        return result

    try:
        document = json.loads(text, object_pairs_hook=pairs_hook, parse_constant=_reject_constant)
        if "\\u" in text:
            # only a \u escape can smuggle in a lone UTF-16 surrogate, which no file name or
            # output stream can encode (strict JSON parsers reject it too)
            json.dumps(document, ensure_ascii=False).encode("utf-8")
        return document
    except HeaderError:
        raise
    except RecursionError:
        raise HeaderError("too_deep", f"{what} JSON is nested too deeply to be valid") from None
    except UnicodeEncodeError:
        raise HeaderError("invalid_json", f"{what} JSON escapes a lone UTF-16 surrogate, which is not text") from None
    except ValueError as exc:  # JSONDecodeError, or an integer literal beyond Python's digit limit
        raise HeaderError("invalid_json", f"{what} is not valid JSON: {exc}") from None


def _read_exact(handle: BinaryIO, size: int) -> bytes:
    chunks, remaining = [], size
    while remaining:
        chunk = handle.read(min(remaining, 1 << 24))
        if not chunk:
            break
        chunks.append(chunk)
        remaining -= len(chunk)
    return b"".join(chunks)


def read_header(path: str | os.PathLike[str], *, max_header_size: int = MAX_HEADER_SIZE) -> SafetensorsHeader:
    """Read and validate the header of the safetensors file at ``path``.

    Reads at most ``8 + header length`` bytes. Raises ``HeaderError`` for a malformed file and
    ``OSError`` when the file cannot be opened or read.
    """
    with open(path, "rb") as handle:
        identity = FileIdentity.of(os.fstat(handle.fileno()))
        prefix = _read_exact(handle, PREFIX_SIZE)
        if len(prefix) < PREFIX_SIZE:
            raise HeaderError(
                "too_short", f"file is {identity.size} bytes, shorter than the 8-byte length prefix"
            )
        (length,) = struct.unpack("<Q", prefix)
        if length > max_header_size:
            raise HeaderError(
                "header_too_large",
                f"header length {length} is above the {max_header_size}-byte limit",
            )
        if PREFIX_SIZE + length > identity.size:
            raise HeaderError(
                "header_beyond_file",
                f"header length {length} runs past the end of the {identity.size}-byte file "
                "(truncated or not a safetensors file)",
            )
        raw = _read_exact(handle, length)
    if len(raw) != length:
        raise HeaderError("header_beyond_file", "file shrank while its header was read")
    return parse_header_bytes(raw, path=os.fspath(path), identity=identity)


def parse_header_bytes(raw: bytes, *, path: str, identity: FileIdentity) -> SafetensorsHeader:
    """Validate header bytes (without the length prefix) of a file of ``identity.size`` bytes."""
    if not raw.startswith(b"{"):
        raise HeaderError("invalid_json", "header does not start with '{'")
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise HeaderError("not_utf8", f"header is not UTF-8 ({exc.reason} at byte {exc.start})") from None
    document = parse_json_strict(text)
    if not isinstance(document, dict):
        raise HeaderError("invalid_json", "header JSON is not an object")
    metadata = document.pop(METADATA_KEY, {})
    if not isinstance(metadata, dict) or not all(
        isinstance(key, str) and isinstance(value, str) for key, value in metadata.items()
    ):
        raise HeaderError("bad_metadata", "__metadata__ must be an object of string values")
    data_size = identity.size - PREFIX_SIZE - len(raw)
    tensors = {name: _tensor_info(name, entry, data_size) for name, entry in document.items()}
    _check_offsets(tensors, data_size)
    return SafetensorsHeader(
        path=path,
        identity=identity,
        header_length=len(raw),
        header_sha256=hashlib.sha256(raw).hexdigest(),
        tensors=tensors,
        metadata=metadata,
    )


def _is_int(value: Any) -> bool:
    return type(value) is int


def _tensor_info(name: str, entry: Any, data_size: int) -> TensorInfo:
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
    if not isinstance(shape, list) or not all(_is_int(dim) and dim >= 0 for dim in shape):
        raise HeaderError(
            "bad_shape", f"tensor {name!r}: shape {shape!r} is not a list of non-negative integers", name
        )
    if (
        not isinstance(offsets, list)
        or len(offsets) != 2
        or not all(_is_int(offset) and 0 <= offset < _U64_LIMIT for offset in offsets)
    ):
        raise HeaderError(
            "bad_offsets", f"tensor {name!r}: data_offsets {offsets!r} is not two non-negative integers", name
        )
    begin, end = offsets
    if end < begin:
        raise HeaderError("bad_offsets", f"tensor {name!r}: data_offsets end {end} < begin {begin}", name)
    bits = DTYPE_BITS[dtype]
    numel = 1
    for dim in shape:
        numel *= dim
        if numel * bits > 8 * _U64_LIMIT:
            raise HeaderError("size_overflow", f"tensor {name!r}: shape {shape} overflows 64 bits", name)
    if numel * bits % 8:
        raise HeaderError(
            "size_mismatch", f"tensor {name!r}: {numel} × {bits}-bit {dtype} is not a whole number of bytes", name
        )
    expected = numel * bits // 8
    if end - begin != expected:
        raise HeaderError(
            "size_mismatch",
            f"tensor {name!r}: {dtype}{shape} needs {expected} bytes, data_offsets span {end - begin}",
            name,
        )
    if end > data_size:
        raise HeaderError(
            "data_beyond_file",
            f"tensor {name!r}: data ends at {end} but the file holds {max(data_size, 0)} data bytes "
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
            f"tensors cover {position} data bytes but the file holds {data_size}",
        )
