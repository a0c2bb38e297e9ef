"""Bounded property tests (CI) of the header reader, the index parser and the whole preflight
on mutated small checkpoints: bit flips, truncations, insertions and overwrites. The
invariants are spelled out in ``fuzz_targets``; ``scripts/fuzz_preflight.py`` runs the same
targets for millions of inputs."""

from __future__ import annotations

import json
import struct
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from fuzz_targets import (
    FuzzBase,
    flip_bit,
    header_end,
    insert,
    overwrite,
    run_header_reader,
    run_preflight,
    truncate,
)
from hypothesis import given, settings
from hypothesis import strategies as st

from nxdi_gptoss_fp8 import format as fmt
from nxdi_gptoss_fp8.validate.pipeline import preflight

TIME_LIMIT_S = 5.0


@pytest.fixture(scope="session")
def base(tmp_path_factory: pytest.TempPathFactory) -> FuzzBase:
    return FuzzBase.create(tmp_path_factory.mktemp("fuzz"))


def mutations(header_bias: bool = True) -> st.SearchStrategy[list[tuple[str, int, int, bytes]]]:
    """Lists of (operation, position, bit, bytes); positions are reduced modulo a limit later."""
    op = st.tuples(
        st.sampled_from(["flip", "truncate", "insert", "overwrite"]),
        st.integers(0, 1 << 20),
        st.integers(0, 7),
        st.binary(min_size=1, max_size=12) | st.sampled_from([b"\x00", b" ", b"{", b"}", b'"', b",", b"\\u0000", b"1e999"]),
    )
    return st.lists(op, min_size=1, max_size=4)


def mutate(data: bytes, ops: list[tuple[str, int, int, bytes]], near_header: bool) -> bytes:
    for name, position, bit, chunk in ops:
        limit = header_end(data) + 8 if near_header else len(data) + 1
        position %= max(limit, 1)
        if name == "flip":
            data = flip_bit(data, 8 * position + bit)
        elif name == "truncate":
            data = truncate(data, position)
        elif name == "insert":
            data = insert(data, position, chunk)
        else:
            data = overwrite(data, position, chunk)
    return data


def timed(run: object) -> None:
    started = time.perf_counter()
    run()  # type: ignore[operator]
    assert time.perf_counter() - started < TIME_LIMIT_S


@given(st.binary(max_size=512))
def test_header_reader_on_arbitrary_bytes(base: FuzzBase, data: bytes) -> None:
    path = base.scratch / "arbitrary.safetensors"
    path.write_bytes(data)
    timed(lambda: run_header_reader(path))


@given(st.data(), mutations(), st.booleans())
def test_header_reader_on_mutated_shards(base: FuzzBase, data: st.DataObject, ops: list, near_header: bool) -> None:
    shard = data.draw(st.sampled_from(base.shards))
    path = base.scratch / "mutated.safetensors"
    path.write_bytes(mutate(base.files[shard], ops, near_header))
    timed(lambda: run_header_reader(path))


ENTRY = st.fixed_dictionaries({
    "dtype": st.sampled_from(["BF16", "F32", "F8_E4M3", "F4", "F6_E2M3", "U8", "X"]) | st.integers(),
    "shape": st.lists(st.integers(-1, 40), max_size=3) | st.none(),
    "data_offsets": st.lists(st.integers(-1, 200), min_size=0, max_size=3),
})


@given(st.dictionaries(st.text(max_size=6), ENTRY, max_size=5), st.integers(0, 256), st.booleans())
def test_header_reader_on_generated_headers(base: FuzzBase, entries: dict, data_size: int, tidy: bool) -> None:
    if tidy:  # make most of them contiguous so acceptance is exercised too
        position = 0
        for entry in entries.values():
            if isinstance(entry["shape"], list) and entry["dtype"] in fmt.DTYPE_BITS and all(d >= 0 for d in entry["shape"]):
                numel = 1
                for dim in entry["shape"]:
                    numel *= dim
                size = numel * fmt.DTYPE_BITS[entry["dtype"]] // 8
                entry["data_offsets"] = [position, position + size]
                position += size
        data_size = position
    text = json.dumps(entries).encode()
    path = base.scratch / "generated.safetensors"
    path.write_bytes(struct.pack("<Q", len(text)) + text + bytes(data_size))
    timed(lambda: run_header_reader(path))


@given(mutations(), st.booleans())
def test_index_parser_on_mutated_index(base: FuzzBase, ops: list, near_header: bool) -> None:
    original = base.files[fmt.INDEX_FILE]
    timed(lambda: run_preflight(base, fmt.INDEX_FILE, mutate(original, ops, near_header=False)))


@given(st.text(max_size=200))
def test_index_parser_on_arbitrary_text(base: FuzzBase, text: str) -> None:
    timed(lambda: run_preflight(base, fmt.INDEX_FILE, text.encode("utf-8", "surrogatepass")))


@settings(max_examples=200)
@given(st.data(), mutations(), st.booleans(), st.booleans(), st.booleans())
def test_whole_preflight_on_mutated_checkpoints(base: FuzzBase, data: st.DataObject, ops: list, near_header: bool,
                                                deep: bool, verify: bool) -> None:
    name = data.draw(st.sampled_from(base.names))
    content = mutate(base.files[name], ops, near_header and name in base.headers)
    timed(lambda: run_preflight(base, name, content, deep=deep, verify_checksums=verify))


# ------------------------------------------------------------- the invariant, made concrete


def _respelled(raw: bytes) -> bytes:
    """The same header re-spelled: keys reversed, spaces after separators, same length cap."""
    (length,) = struct.unpack("<Q", raw[:8])
    document = json.loads(raw[8:8 + length])
    text = json.dumps(dict(reversed(list(document.items()))), separators=(", ", ": ")).encode()
    return struct.pack("<Q", len(text)) + text + raw[8 + length:]


def test_a_respelled_header_may_pass_and_only_checksums_tell(base: FuzzBase) -> None:
    """Header bytes changed, meaning unchanged: ok without hashing, caught with it."""
    shard = max(base.shards, key=lambda name: len(base.headers[name]))
    respelled = _respelled(base.files[shard])
    assert respelled != base.files[shard]
    assert run_preflight(base, shard, respelled) == "ok"
    assert run_preflight(base, shard, respelled, verify_checksums=True) == "integrity.digest_mismatch"


def _edit_header(raw: bytes, edit: Callable[[dict[str, Any]], None]) -> bytes:
    (length,) = struct.unpack("<Q", raw[:8])
    document = json.loads(raw[8:8 + length])
    edit(document)
    text = json.dumps(document).encode()
    return struct.pack("<Q", len(text)) + text + raw[8 + length:]


Q_PROJ, O_PROJ = "layers.0.self_attn.q_proj.weight", "layers.0.self_attn.o_proj.weight"  # [16, 32] and [32, 16]


def test_a_header_that_declares_other_shapes_never_passes(base: FuzzBase) -> None:
    """Same byte size, transposed shape: still a different tensor."""
    shard = next(s for s in base.shards if Q_PROJ in base.headers[s])
    transposed = _edit_header(base.files[shard], lambda doc: doc[Q_PROJ].update(shape=doc[Q_PROJ]["shape"][::-1]))
    assert run_preflight(base, shard, transposed) == "dtype_shape.wrong_shape"


def test_swapped_byte_ranges_are_seen_only_by_the_digests(base: FuzzBase) -> None:
    """The documented limit of a header-only verdict: two equal-size tensors trade bytes."""
    shard = next(s for s in base.shards if Q_PROJ in base.headers[s])

    def swap(doc: dict[str, Any]) -> None:
        doc[Q_PROJ]["data_offsets"], doc[O_PROJ]["data_offsets"] = doc[O_PROJ]["data_offsets"], doc[Q_PROJ]["data_offsets"]

    swapped = _edit_header(base.files[shard], swap)
    assert run_preflight(base, shard, swapped) == "ok"
    assert run_preflight(base, shard, swapped, verify_checksums=True) == "integrity.digest_mismatch"


def test_fuzz_base_is_pristine_after_the_properties(base: FuzzBase) -> None:
    for name, content in base.files.items():
        assert (base.work / name).read_bytes() == content
    assert preflight(base.work, allow_custom_model=True, deep=True, verify_checksums=True).ok


def test_mutation_helpers() -> None:
    assert flip_bit(b"\x00\x00", 9) == b"\x00\x02"
    assert truncate(b"abcd", 10) == b"abc" and truncate(b"abcd", 1) == b"a"
    assert insert(b"abcd", 2, b"XY") == b"abXYcd"
    assert overwrite(b"abcd", 3, b"XY") == b"abcXY"
    assert header_end(struct.pack("<Q", 4) + b"{}  xx") == 12
    assert header_end(b"\x01") == 1


def test_base_files_exist(base: FuzzBase) -> None:
    assert set(base.names) == {p.name for p in Path(base.pristine).iterdir()}
    assert len(base.shards) >= 3


# ------------------------------------------------- never raises: mutated JSON values, numbers included

NUMBERS = st.one_of(
    st.integers(-(2**70), 2**70),
    st.sampled_from([0, -1, 1, 2**31, 2**31 + 1, 2**53, 2**53 + 1, 2**63, 2**64, 10**30, 10**4299]),
    st.floats(allow_nan=False, allow_infinity=False),
)
VALUES = st.recursive(
    st.none() | st.booleans() | NUMBERS | st.text(max_size=8),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=6), inner, max_size=3),
    max_leaves=8,
)
NEURON_KEYS = ["quantized", "quantization_dtype", "quantization_type", "tp_degree", "moe_ep_degree", "moe_tp_degree",
               "padded_hidden_size", "padded_intermediate_size", "modules_to_not_convert", "fused_qkv",
               "quantized_mlp_kernel_enabled", "activation_quantization_type", "hybrid_sharding_config", "tp_degre"]
CONFIG_KEYS = [*fmt.ModelDims.__dataclass_fields__, "num_experts", "experts_per_token", "attention_bias",
               "original_hidden_size", "original_intermediate_size", "model_type", "architectures", "quantization_config"]
METADATA_KEYS = [*fmt.REQUIRED_METADATA, "shard_sha256", "source"]
# number literals as the raw header text may hold them (not all are plain JSON integers)
LITERALS = st.sampled_from(["-0", "0.0", "-0.0", "1e2", "1E2", "1e400", "18446744073709551616", "9007199254740993",
                            "1" + "0" * 30, "1" + "0" * 5000, "-1", "64"])


def _never_raises(base: FuzzBase, neuron_config: Any = None) -> None:
    try:
        report = preflight(base.work, allow_custom_model=True, neuron_config=neuron_config)
    except Exception as exc:  # the property: preflight never raises, on any input
        raise AssertionError(f"preflight raised {type(exc).__name__}: {exc}") from exc
    report.render_text()
    json.loads(report.to_json())
    for finding in report.findings:
        assert len(finding.message) < 2000, finding.code


@given(st.dictionaries(st.sampled_from(CONFIG_KEYS), VALUES, min_size=1, max_size=4),
       st.dictionaries(st.sampled_from(METADATA_KEYS), VALUES, max_size=3),
       st.none() | st.dictionaries(st.sampled_from(NEURON_KEYS), VALUES, max_size=5), st.booleans())
def test_preflight_never_raises_on_mutated_json_values(base: FuzzBase, config: dict, metadata: dict,
                                                      neuron_config: dict | None, nested: bool) -> None:
    document = json.loads(base.files[fmt.CONFIG_FILE])
    document.update(config)
    index = json.loads(base.files[fmt.INDEX_FILE])
    index["metadata"].update(metadata)
    if nested and neuron_config is not None:
        neuron_config = {**document, "neuron_config": neuron_config}
    try:
        base.put(fmt.CONFIG_FILE, json.dumps(document).encode())
        base.put(fmt.INDEX_FILE, json.dumps(index).encode())
        timed(lambda: _never_raises(base, neuron_config))
    finally:
        base.restore(fmt.CONFIG_FILE)
        base.restore(fmt.INDEX_FILE)


@given(st.data(), st.sampled_from(["shape", "data_offsets"]), LITERALS)
def test_preflight_never_raises_on_header_number_literals(base: FuzzBase, data: st.DataObject, field: str, literal: str) -> None:
    shard = data.draw(st.sampled_from(base.shards))
    raw = base.files[shard]
    (length,) = struct.unpack("<Q", raw[:8])
    text = raw[8:8 + length].decode()
    position = data.draw(st.sampled_from([i for i in range(len(text)) if text.startswith(f'"{field}":[', i)]))
    start = position + len(field) + 4
    end = start + len(text[start:]) - len(text[start:].lstrip("0123456789"))
    mutated = (text[:start] + literal + text[end:]).encode()
    try:
        base.put(shard, struct.pack("<Q", len(mutated)) + mutated + raw[8 + length:])
        timed(lambda: _never_raises(base))
        if literal not in text[start:end] and not literal.isdigit():
            report = preflight(base.work, allow_custom_model=True)
            assert not report.ok and any(f.code in ("header.bad_shape", "header.bad_offsets") for f in report.errors)
    finally:
        base.restore(shard)
