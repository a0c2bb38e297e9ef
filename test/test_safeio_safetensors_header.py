"""The strict header reader: agreement with the safetensors library on valid files, one
stable error code per rule on invalid ones, and properties over arbitrary bytes."""

from __future__ import annotations

import json
import struct
from pathlib import Path

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st
from safetensors.torch import save_file

from nxdi_gptoss_fp8.format import DTYPE_BITS
from nxdi_gptoss_fp8.safeio.files import FileIdentity
from nxdi_gptoss_fp8.safeio.safetensors_header import (
    MAX_HEADER_SIZE,
    HeaderError,
    _parse_by_rule,
    _parse_common,
    parse_header_bytes,
    read_header,
)
from nxdi_gptoss_fp8.safeio.strict_json import JsonError, parse_json_strict

TORCH_DTYPES = {
    torch.float32: "F32", torch.bfloat16: "BF16", torch.float16: "F16", torch.float8_e4m3fn: "F8_E4M3",
    torch.float8_e5m2: "F8_E5M2", torch.int64: "I64", torch.int32: "I32", torch.uint8: "U8", torch.bool: "BOOL",
}


def _file(tmp_path: Path, header: bytes | str, data: bytes = b"", *, length: int | None = None) -> Path:
    raw = header.encode() if isinstance(header, str) else header
    path = tmp_path / "x.safetensors"
    path.write_bytes(struct.pack("<Q", len(raw) if length is None else length) + raw + data)
    return path


def test_reads_what_safetensors_writes(tmp_path: Path) -> None:
    tensors = {
        "a": torch.zeros(3, 5, dtype=torch.bfloat16),
        "b": torch.ones(7, dtype=torch.float8_e4m3fn),
        "c": torch.arange(4, dtype=torch.int64),
        "empty": torch.zeros(0, 3),
    }
    save_file(tensors, str(tmp_path / "t.safetensors"), metadata={"format": "pt"})
    header = read_header(tmp_path / "t.safetensors")
    assert set(header.tensors) == set(tensors)
    assert header.metadata == {"format": "pt"}
    for name, tensor in tensors.items():
        info = header.tensors[name]
        assert info.shape == tuple(tensor.shape)
        assert info.dtype == TORCH_DTYPES[tensor.dtype]
        assert info.nbytes == tensor.numel() * tensor.element_size()
    assert header.bytes_read == header.data_offset < (tmp_path / "t.safetensors").stat().st_size


@pytest.mark.parametrize(
    ("header", "data", "length", "code"),
    [
        ("", b"", 0, "invalid_json"),
        ('{"a": 1}', b"", MAX_HEADER_SIZE + 1, "header_too_large"),
        ('{"a": 1}', b"", 2**64 - 1, "header_too_large"),
        ("{}", b"", 1000, "header_beyond_file"),
        (b'{"\xc3\x28": 1}', b"", None, "not_utf8"),
        ("[1, 2]", b"", None, "invalid_json"),
        ("{} ", b"", None, None),
        ('{"a": {"dtype": "F32", "shape": [1], "data_offsets": [0, 4]}}\x00\x00', b"\0" * 4, None, "invalid_json"),
        ('{"a": {"dtype": "F32", "shape": [1], "data_offsets": [0, 4]}, "a": {"dtype": "F32", "shape": [1], "data_offsets": [0, 4]}}', b"\0" * 4, None, "duplicate_key"),
        ('{"a": {"dtype": "F32", "shape": [1], "data_offsets": [0, 4], "dtype": "F16"}}', b"\0" * 4, None, "duplicate_key"),
        ('{"a": {"dtype": "F32", "shape": [NaN], "data_offsets": [0, 4]}}', b"\0" * 4, None, "invalid_json"),
        ('{"a": {"dtype": "Q4", "shape": [1], "data_offsets": [0, 4]}}', b"\0" * 4, None, "unknown_dtype"),
        ('{"a": {"dtype": "F32", "shape": [-1], "data_offsets": [0, 4]}}', b"\0" * 4, None, "bad_shape"),
        ('{"a": {"dtype": "F32", "shape": [true], "data_offsets": [0, 4]}}', b"\0" * 4, None, "bad_shape"),
        ('{"a": {"dtype": "F32", "shape": [1], "data_offsets": [4, 0]}}', b"\0" * 4, None, "bad_offsets"),
        ('{"a": {"dtype": "F32", "shape": [1], "data_offsets": [0]}}', b"\0" * 4, None, "bad_offsets"),
        ('{"a": {"dtype": "F32", "shape": [1]}}', b"\0" * 4, None, "bad_entry"),
        ('{"a": {"dtype": "F32", "shape": [1], "data_offsets": [0, 4], "x": 1}}', b"\0" * 4, None, "bad_entry"),
        ('{"a": 5}', b"", None, "bad_entry"),
        ('{"a": {"dtype": "F32", "shape": [2], "data_offsets": [0, 4]}}', b"\0" * 4, None, "size_mismatch"),
        ('{"a": {"dtype": "F4", "shape": [3], "data_offsets": [0, 2]}}', b"\0" * 2, None, "size_mismatch"),
        ('{"a": {"dtype": "F32", "shape": [4294967296, 4294967296, 4294967296], "data_offsets": [0, 4]}}', b"\0" * 4, None, "size_overflow"),
        ('{"a": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]}}', b"\0" * 4, None, "data_beyond_file"),
        ('{"a": {"dtype": "F32", "shape": [1], "data_offsets": [0, 4]}, "b": {"dtype": "F32", "shape": [1], "data_offsets": [2, 6]}}', b"\0" * 6, None, "offsets_overlap"),
        ('{"a": {"dtype": "F32", "shape": [1], "data_offsets": [0, 4]}, "b": {"dtype": "F32", "shape": [1], "data_offsets": [6, 10]}}', b"\0" * 10, None, "offsets_gap"),
        ('{"a": {"dtype": "F32", "shape": [1], "data_offsets": [4, 8]}}', b"\0" * 8, None, "offsets_gap"),
        ('{"a": {"dtype": "F32", "shape": [1], "data_offsets": [0, 4]}}', b"\0" * 5, None, "trailing_bytes"),
        ('{"__metadata__": {"a": 1}}', b"", None, "bad_metadata"),
        ('{"z": {"dtype": "U8", "shape": [0], "data_offsets": [0, 0]}, "y": {"dtype": "U8", "shape": [0, 4], "data_offsets": [0, 0]}}', b"", None, None),
    ],
)
def test_header_rules(tmp_path: Path, header: str | bytes, data: bytes, length: int | None, code: str | None) -> None:
    path = _file(tmp_path, header, data, length=length)
    if code is None:
        read_header(path)
        return
    with pytest.raises(HeaderError) as raised:
        read_header(path)
    assert raised.value.code == code, str(raised.value)


def test_short_file(tmp_path: Path) -> None:
    (tmp_path / "s").write_bytes(b"\x01\x02")
    with pytest.raises(HeaderError) as raised:
        read_header(tmp_path / "s")
    assert raised.value.code == "too_short"


def test_length_is_checked_before_anything_is_read(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A huge length prefix never reaches a read of that size."""
    path = _file(tmp_path, b"{}", length=2**40)
    sizes: list[int] = []
    real_open = open

    class Spy:
        def __init__(self, handle):  # type: ignore[no-untyped-def]
            self.handle = handle

        def read(self, n: int) -> bytes:
            sizes.append(n)
            return self.handle.read(n)

        def __getattr__(self, name: str):  # type: ignore[no-untyped-def]
            return getattr(self.handle, name)

        def __enter__(self):  # type: ignore[no-untyped-def]
            return self

        def __exit__(self, *exc: object) -> None:
            self.handle.close()

    # the reader opens through files.open_regular (never blocking on a FIFO): spy on what it returns
    monkeypatch.setattr("nxdi_gptoss_fp8.safeio.safetensors_header.open_regular", lambda p: Spy(real_open(p, "rb")))
    with pytest.raises(HeaderError):
        read_header(path)
    assert sizes == [8]


def test_deeply_nested_json_is_a_clean_error() -> None:
    with pytest.raises(JsonError) as raised:
        parse_json_strict("[" * 100_000 + "]" * 100_000)
    assert raised.value.code == "too_deep"


# ----------------------------------------------------------------------------- properties

dtype_names = st.sampled_from(sorted(name for name, bits in DTYPE_BITS.items() if bits % 8 == 0))
tensor_specs = st.dictionaries(
    st.text(st.characters(codec="utf-8", exclude_characters="\x00"), min_size=1, max_size=12).filter(lambda n: n != "__metadata__"),
    st.tuples(dtype_names, st.lists(st.integers(0, 5), max_size=3)),
    max_size=6,
)


def _serialize(specs: dict[str, tuple[str, list[int]]], order: list[str]) -> tuple[bytes, dict[str, tuple[int, int]]]:
    entries, offsets, position = {}, {}, 0
    for name in order:
        dtype, shape = specs[name]
        size = DTYPE_BITS[dtype] // 8
        for dim in shape:
            size *= dim
        entries[name] = {"dtype": dtype, "shape": shape, "data_offsets": [position, position + size]}
        offsets[name] = (position, position + size)
        position += size
    text = json.dumps(entries).encode()
    return struct.pack("<Q", len(text)) + text + bytes(position), offsets


@given(specs=tensor_specs, data=st.data())
def test_property_valid_headers_round_trip(specs: dict[str, tuple[str, list[int]]], data: st.DataObject) -> None:
    order = data.draw(st.permutations(sorted(specs)))
    blob, offsets = _serialize(specs, list(order))
    length = struct.unpack("<Q", blob[:8])[0]
    header = parse_header_bytes(blob[8 : 8 + length], path="p", identity=FileIdentity(0, 0, len(blob), 0, 0))
    assert {name: (info.begin, info.end) for name, info in header.tensors.items()} == offsets
    assert {name: (info.dtype, list(info.shape)) for name, info in header.tensors.items()} == specs


@given(blob=st.binary(max_size=400))
def test_property_arbitrary_bytes_never_crash(tmp_path_factory: pytest.TempPathFactory, blob: bytes) -> None:
    path = tmp_path_factory.mktemp("fuzz") / "f.safetensors"
    path.write_bytes(blob)
    try:
        read_header(path)
    except HeaderError as exc:
        assert exc.code and str(exc)


@given(specs=tensor_specs.filter(bool), data=st.data())
def test_property_mutated_headers_are_rejected_or_equivalent(specs: dict[str, tuple[str, list[int]]], data: st.DataObject) -> None:
    """Flip one byte of a valid header: either an error, or a header that still parses
    consistently (every tensor within the file, offsets tiling the data exactly)."""
    blob, _ = _serialize(specs, sorted(specs))
    length = struct.unpack("<Q", blob[:8])[0]
    position = data.draw(st.integers(8, 8 + length - 1))
    flipped = bytearray(blob)
    flipped[position] ^= data.draw(st.integers(1, 255))
    raw = bytes(flipped[8 : 8 + length])
    try:
        header = parse_header_bytes(raw, path="p", identity=FileIdentity(0, 0, len(blob), 0, 0))
    except HeaderError as exc:
        assert exc.code
        return
    covered = sorted((info.begin, info.end) for info in header.tensors.values())
    assert sum(end - begin for begin, end in covered) == len(blob) - 8 - length


def _by_rule(text: str, data_size: int) -> object:
    """What the rule-by-rule parser says: its result, or the error's (code, message)."""
    try:
        return _parse_by_rule(text, data_size)
    except HeaderError as exc:
        return (exc.code, str(exc))


# edits of a valid header's text that a fast path could get wrong: repeated keys (at the top,
# in an entry, in the metadata), colons in strings, escapes, non-integers, unusual types
_EDITS = [
    lambda t: t.replace('{"', '{"dup": 1, "dup": 2, "', 1),
    lambda t: t.replace('"dtype": ', '"dtype": "F32", "dtype": ', 1),
    lambda t: t.replace('{"', '{"__metadata__": {"a:b": "c:d", "x": "y"}, "', 1),
    lambda t: t.replace('{"', '{"__metadata__": {"k": "v", "k": "w"}, "', 1),
    lambda t: t.replace('{"', '{"__metadata__": {"k": 1}, "', 1),
    lambda t: t.replace('{"', '{"__metadata__": null, "', 1),
    lambda t: t.replace('{"', '{"__metadata__": {}, "__metadata__": {"a": "b"}, "', 1),
    lambda t: t.replace('"', '"a:b', 1),
    lambda t: t.replace('"', '"\\u0041', 1),
    lambda t: t.replace('"', '"\\u003a', 1),
    lambda t: t.replace('"shape": [', '"shape": [-0, ', 1),
    lambda t: t.replace('"data_offsets": [0', '"data_offsets": [0.0', 1),
    lambda t: t.replace('"data_offsets": [0', '"data_offsets": [false', 1),
    lambda t: t.replace('"shape": [', '"shape": [true, ', 1),
    lambda t: t.replace('"shape": [', '"shape": [1e0, ', 1),
    lambda t: t.replace('"shape": [', '"shape": [NaN, ', 1),
    lambda t: t.replace('"dtype": "', '"dtype": "X', 1),
    lambda t: t.replace('"dtype": ', '"dtype": ["F32"], "was": ', 1),
    lambda t: t.replace('"data_offsets": [', '"data_offsets": [1, ', 1),
    lambda t: t.replace('{"dtype": ', '{"shape": [], "dtype": ', 1),
    lambda t: t.replace('"shape": [', '"shape": [[1], ', 1),
    lambda t: t.replace('"shape": [', '"shape": [1, 1, 1, 1, 1, 1, 1, 1, 1, ', 1),
    lambda t: t + " \t\r\n",
    lambda t: t + "\x0b",
    lambda t: t + " {}",
    lambda t: t[:-1] + ', "x": {}}',
    lambda t: t.replace('"', '"\\"', 1),
]


@given(specs=tensor_specs, data=st.data())
def test_property_fast_path_agrees_with_the_rules(specs: dict[str, tuple[str, list[int]]], data: st.DataObject) -> None:
    """The whole-header fast path either declines (None) or returns exactly what the
    rule-by-rule parser returns; it never accepts what the rules refuse, whatever the edit."""
    blob, _ = _serialize(specs, sorted(specs))
    length = struct.unpack("<Q", blob[:8])[0]
    text = blob[8:8 + length].decode()
    data_size = len(blob) - 8 - length
    edits = data.draw(st.lists(st.sampled_from(range(len(_EDITS))), max_size=3))
    for edit in edits:
        text = _EDITS[edit](text)
    size = data_size + data.draw(st.sampled_from([0, 0, 1, -1]))
    fast = _parse_common(text, size)
    expected = _by_rule(text, size)
    if fast is not None:
        assert fast == expected
    else:  # an unedited header of a fitting file takes the fast path unless it holds escapes or -0
        assert edits or size != data_size or "\\u" in text or "-0" in text


def test_fast_path_declines_a_repeated_key_hidden_by_colons_in_strings() -> None:
    """A repeated key and one extra ':' in a name would balance a naive colon count; the count
    subtracts the colons inside strings, so the repeat is still found."""
    text = json.dumps({"a:b": {"dtype": "U8", "shape": [1], "data_offsets": [0, 1]}})
    text = text[:-1] + ', "a:b": {"dtype": "U8", "shape": [1], "data_offsets": [0, 1]}}'
    assert _parse_common(text, 1) is None
    assert _by_rule(text, 1)[0] == "duplicate_key"  # type: ignore[index]


def test_header_error_is_one_of_the_package_errors() -> None:
    from nxdi_gptoss_fp8.errors import NxdiGptossFp8Error

    with pytest.raises(NxdiGptossFp8Error) as caught:
        parse_header_bytes(b"[]", path="p", identity=FileIdentity(0, 0, 10, 0, 0))
    assert isinstance(caught.value, HeaderError) and isinstance(caught.value, ValueError)
