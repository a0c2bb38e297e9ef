"""Strict, bounded JSON: every refusal has its code; plain documents parse as json does."""

from __future__ import annotations

import json
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from nxdi_gptoss_fp8.safeio.strict_json import MAX_DEPTH, NXDI_CONSTANTS, JsonError, NonInteger, parse_json_strict


@pytest.mark.parametrize(("text", "code", "options"), [
    ('{"a": 1, "a": 2}', "duplicate_key", {}),
    ('{"x": {"a": 1, "b": {"a": 1, "a": 1}}}', "duplicate_key", {}),
    ('[NaN]', "invalid_json", {}),
    ('[-Infinity]', "invalid_json", {}),
    ('{"a": 1,}', "invalid_json", {}),
    ('["\\ud800"]', "invalid_json", {}),
    ("[" * (MAX_DEPTH + 1) + "]" * (MAX_DEPTH + 1), "too_deep", {}),
    ("[" * 100_000 + "]" * 100_000, "too_deep", {}),
    ('{"a": ' + "[" * 10 + "]" * 10 + "}", "too_deep", {"max_depth": 5}),
    ("[" + "1" * 20 + "]", "number_too_large", {}),
    ("[-" + "9" * 5000 + "]", "number_too_large", {}),
    ("[" + " " * 100 + "]", "too_large", {"max_bytes": 50}),
])
def test_refusals(text: str, code: str, options: dict[str, Any]) -> None:
    with pytest.raises(JsonError) as raised:
        parse_json_strict(text, **options)
    assert raised.value.code == code
    assert len(str(raised.value)) < 400


@pytest.mark.parametrize("constant", sorted(NXDI_CONSTANTS))
def test_nxdi_constants_only_when_asked(constant: str) -> None:
    """NxDI's ``json.dumps`` writes Infinity/-Infinity/NaN: read as floats only with the named option."""
    text = json.dumps({"quantize_clamp_bound": NXDI_CONSTANTS[constant]})
    assert constant in text
    with pytest.raises(JsonError, match=f"non-standard constant {constant}") as raised:
        parse_json_strict(text)
    assert raised.value.code == "invalid_json"
    (value,) = parse_json_strict(text, nxdi_constants=True).values()
    assert repr(value) == repr(NXDI_CONSTANTS[constant])


@pytest.mark.parametrize("text", ['{"a": 1, "a": Infinity}', "[infinity]", "[Inf]", "[nan]", '["x",]'])
def test_nxdi_constants_keep_every_other_rule(text: str) -> None:
    with pytest.raises(JsonError):
        parse_json_strict(text, nxdi_constants=True)


@pytest.mark.parametrize(("literal", "marked"), [("-0", True), ("0.0", True), ("-0.0", True), ("1e2", True), ("1E2", True),
                                                  ("1e400", True), ("0", False), ("-1", False), ("18446744073709551615", False)])
def test_non_integer_literals_are_kept_as_written(literal: str, marked: bool) -> None:
    (value,) = parse_json_strict(f"[{literal}]", mark_non_integers=True, max_int_digits=20)
    assert isinstance(value, NonInteger) is marked
    assert (str(value) == literal) if marked else (value == int(literal))


def test_without_marking_numbers_parse_as_json_does() -> None:
    assert parse_json_strict("[-0, 1e2, 0.5]") == [0, 100.0, 0.5]


JSON = st.recursive(
    st.none() | st.booleans() | st.integers(-(10**18), 10**18) | st.floats(allow_nan=False, allow_infinity=False) | st.text(max_size=5),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=5), inner, max_size=4),
    max_leaves=20,
)


@given(JSON)
def test_plain_documents_round_trip(document: Any) -> None:
    text = json.dumps(document)
    try:
        assert parse_json_strict(text) == json.loads(text)
    except JsonError as exc:  # only a lone surrogate in generated text, or depth
        assert exc.code in ("invalid_json", "too_deep")


def test_json_error_is_one_of_the_package_errors() -> None:
    from nxdi_gptoss_fp8.errors import NxdiGptossFp8Error

    with pytest.raises(NxdiGptossFp8Error) as caught:
        parse_json_strict('{"a": 1, "a": 2}', what="x.json")
    assert isinstance(caught.value, JsonError) and isinstance(caught.value, ValueError)
    assert caught.value.code == "duplicate_key"
