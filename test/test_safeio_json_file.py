"""The one bounded JSON-file reader: every refusal a ``JsonFileError`` with the step's code."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from nxdi_gptoss_fp8.errors import NotRegularFileError, NxdiGptossFp8Error
from nxdi_gptoss_fp8.safeio import json_file
from nxdi_gptoss_fp8.safeio.files import FileIdentity
from nxdi_gptoss_fp8.safeio.json_file import MAX_JSON_FILE_BYTES, JsonFileError, read_json_file
from nxdi_gptoss_fp8.safeio.strict_json import JsonError


def test_the_limit_is_64_mib() -> None:
    assert MAX_JSON_FILE_BYTES == 64 * 1024 * 1024


def test_reads_a_json_file_and_hands_its_bytes_and_identity_to_on_read(tmp_path: Path) -> None:
    path = tmp_path / "config.json"
    path.write_bytes(b'{"a": [1, 2], "b": "c"}')
    seen: list[tuple[bytes, FileIdentity]] = []
    assert read_json_file(path, what="config.json", on_read=lambda raw, identity: seen.append((raw, identity))) == {
        "a": [1, 2], "b": "c"}
    ((raw, identity),) = seen
    assert raw == path.read_bytes()
    assert identity == FileIdentity.of(os.stat(path))


def _fifo(path: Path) -> None:
    os.mkfifo(path)


def _directory(path: Path) -> None:
    path.mkdir()


def _sparse_above_limit(path: Path) -> None:
    path.write_bytes(b"{}")
    os.truncate(path, MAX_JSON_FILE_BYTES + 1)  # sparse: nothing on disk


@pytest.mark.parametrize(("make", "code", "cause", "words"), [
    (_fifo, "not_a_file", NotRegularFileError, "a FIFO (named pipe), not a regular file"),
    (_directory, "not_a_file", NotRegularFileError, "a directory, not a regular file"),
    (lambda p: None, "unreadable", FileNotFoundError, "cannot read"),
    (_sparse_above_limit, "too_large", type(None), f"{MAX_JSON_FILE_BYTES + 1:,} bytes, above the {MAX_JSON_FILE_BYTES:,}-byte limit"),
    (lambda p: p.write_bytes(b'{"k": "\xff"}'), "not_utf8", UnicodeDecodeError, "x.json is not UTF-8 text"),
    (lambda p: p.write_bytes(b'{"k": 1, "k": 2}'), "duplicate_key", JsonError, "x.json JSON repeats the key 'k'"),
    (lambda p: p.write_bytes(b'{"k": NaN}'), "invalid_json", JsonError, "non-standard constant NaN"),
    (lambda p: p.write_bytes(b"[" * 100 + b"]" * 100), "too_deep", JsonError, "nested more than"),
    (lambda p: p.write_bytes(b"{"), "invalid_json", JsonError, "x.json is not valid JSON"),
])
def test_every_refusal_names_its_step(tmp_path: Path, make: Any, code: str, cause: type, words: str) -> None:
    path = tmp_path / "x.json"
    make(path)
    seen: list[bytes] = []
    with pytest.raises(JsonFileError) as caught:
        read_json_file(path, what="x.json", on_read=lambda raw, identity: seen.append(raw))
    error = caught.value
    assert error.code == code and isinstance(error.cause, cause) and words in str(error)
    assert isinstance(error, NxdiGptossFp8Error)
    assert error.not_read == (code in ("not_a_file", "unreadable"))
    assert error.oversized == (code == "too_large")
    assert bool(seen) == (code not in ("not_a_file", "unreadable", "too_large"))  # nothing read before that
    if code == "duplicate_key":
        assert error.key == "k"


def test_nxdi_constants_pass_through_to_the_parser(tmp_path: Path) -> None:
    path = tmp_path / "neuron_config.json"
    path.write_bytes(b'{"neuron_config": {"quantize_clamp_bound": Infinity}}')
    with pytest.raises(JsonFileError, match="non-standard constant Infinity"):
        read_json_file(path, what="neuron_config.json")
    assert read_json_file(path, what="neuron_config.json", nxdi_constants=True) == {"neuron_config": {"quantize_clamp_bound": float("inf")}}


def test_a_smaller_limit_is_kept(tmp_path: Path) -> None:
    path = tmp_path / "x.json"
    path.write_bytes(b'{"k": "' + b"v" * 100 + b'"}')
    with pytest.raises(JsonFileError) as caught:
        read_json_file(path, what="x.json", max_bytes=100)
    assert caught.value.code == "too_large" and caught.value.size == 109 and caught.value.limit == 100
    assert read_json_file(path, what="x.json", max_bytes=109) == {"k": "v" * 100}


def test_a_file_growing_while_it_is_read_is_refused_after_on_read(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "x.json"
    path.write_bytes(b"[" + b"1," * 60 + b"1]")
    # the size fstat saw before the read: smaller than what the read then returns (an appending writer)
    monkeypatch.setattr(json_file.FileIdentity, "of", classmethod(
        lambda cls, st: cls(st.st_dev, st.st_ino, 10, st.st_mtime_ns, st.st_ctime_ns)))
    seen: list[int] = []
    with pytest.raises(JsonFileError) as caught:
        read_json_file(path, what="x.json", max_bytes=50, on_read=lambda raw, identity: seen.append(len(raw)))
    assert caught.value.code == "grew" and caught.value.oversized and seen == [51]
    assert "grew above the 50-byte limit while it was read" in str(caught.value)


def _text(size: int) -> st.SearchStrategy[str]:
    return st.text(st.characters(blacklist_categories=("Cs",)), max_size=size)  # no lone surrogates: not text


_json = st.recursive(
    st.none() | st.booleans() | st.integers(-(10**18), 10**18) | _text(20),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(_text(8), inner, max_size=4),
    max_leaves=20,
)


@given(_json)
def test_what_json_dumps_wrote_reads_back(tmp_path_factory: pytest.TempPathFactory, document: Any) -> None:
    path = tmp_path_factory.mktemp("j") / "x.json"
    path.write_text(json.dumps(document), encoding="utf-8")
    assert read_json_file(path, what="x.json") == document
