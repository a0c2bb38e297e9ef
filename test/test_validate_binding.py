"""What a report is bound to: the config fingerprint (stable, total, sensitive to every field)
and the sealed ``CheckedCheckpoint`` the preflight makes."""

from __future__ import annotations

import copy
import enum
import os
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from nxdi_gptoss_fp8 import format as fmt
from nxdi_gptoss_fp8.validate.binding import NO_CONFIG, config_fingerprint
from nxdi_gptoss_fp8.validate.config import bound_config
from nxdi_gptoss_fp8.validate.pipeline import preflight


class Mode(enum.Enum):
    A = "a"
    B = "b"


def nxdi_like(**neuron: Any) -> SimpleNamespace:
    """An object shaped like NxDI's InferenceConfig: attributes, a nested NeuronConfig object."""
    nc = SimpleNamespace(tp_degree=2, quantized=True, torch_dtype="bfloat16", modules_to_not_convert=["lm_head"], **neuron)
    return SimpleNamespace(neuron_config=nc, hidden_size=64, fused_spec_config=None, _name_or_path="/x")


def test_no_config_is_none() -> None:
    assert config_fingerprint(None) == NO_CONFIG


def test_equal_configs_have_equal_fingerprints_whatever_their_key_order() -> None:
    assert config_fingerprint({"a": 1, "b": [1, 2.5]}) == config_fingerprint({"b": [1, 2.5], "a": 1})
    assert config_fingerprint(nxdi_like()) == config_fingerprint(copy.deepcopy(nxdi_like()))


@pytest.mark.parametrize(("left", "right"), [
    ({"tp_degree": 2}, {"tp_degree": 4}),
    ({"tp_degree": 2}, {"tp_degree": "2"}),
    ({"tp_degree": 1}, {"tp_degree": True}),
    ({"tp_degree": 1}, {"tp_degree": 1.0}),
    ({"x": [1, 2]}, {"x": [2, 1]}),
    ({"x": Mode.A}, {"x": Mode.B}),
    ({"x": None}, {}),
    (nxdi_like(), nxdi_like(fused_qkv=True)),
    ({"neuron_config": {"tp_degree": 2}}, {"tp_degree": 2}),
])
def test_any_difference_changes_the_fingerprint(left: Any, right: Any) -> None:
    assert config_fingerprint(left) != config_fingerprint(right)


def test_a_nested_object_field_changed_in_place_changes_the_fingerprint() -> None:
    config = nxdi_like()
    before = config_fingerprint(config)
    config.neuron_config.modules_to_not_convert.append("self_attn")
    assert config_fingerprint(config) != before


def test_hostile_configs_are_fingerprinted_without_raising() -> None:
    deep: dict[str, Any] = {}
    node = deep
    for _ in range(100_000):
        node["x"] = {}
        node = node["x"]
    cyclic: dict[str, Any] = {}
    cyclic["self"] = cyclic

    class Raises:
        @property
        def __dict__(self) -> dict:  # type: ignore[override]
            raise RuntimeError("no")

    for config in (deep, cyclic, {"n": 10 ** 5000}, {"s": "\ud800"}, Raises(), object(), {"f": float("nan")},
                   {"big": list(range(300_000))}, {(1, 2): "tuple key"}):
        assert len(config_fingerprint(config)) == 64


@given(st.recursive(st.none() | st.booleans() | st.integers() | st.floats() | st.text(),
                    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=5), inner, max_size=4),
                    max_leaves=30))
def test_fingerprint_is_total_and_deterministic(config: Any) -> None:
    assert config_fingerprint(config) == config_fingerprint(copy.deepcopy(config))


def test_bound_config_is_what_the_loader_receives() -> None:
    config = nxdi_like()
    assert bound_config(config.neuron_config, config) is config
    assert bound_config(config.neuron_config, None) is config.neuron_config
    nested = {"neuron_config": {"tp_degree": 2}, "hidden_size": 64}
    assert bound_config(nested["neuron_config"], nested) is nested
    assert bound_config(None, None) is None
    other = nxdi_like()
    assert bound_config(other.neuron_config, config) == (other.neuron_config, config)  # no single load config matches


@pytest.mark.parametrize(("kwargs", "expected"), [
    ({}, {"headers_only": False, "allow_custom_model": True, "deep": False, "verify_checksums": False}),
    ({"read_scales": False}, {"headers_only": True}),
    ({"verify_checksums": True}, {"verify_checksums": True}),
])
def test_the_binding_records_the_options(tiny_template: Path, kwargs: dict, expected: dict) -> None:
    binding = preflight(tiny_template, allow_custom_model=True, **kwargs).checked.binding  # type: ignore[union-attr]
    assert {key: getattr(binding, key) for key in expected} == expected
    assert binding.root == os.path.realpath(tiny_template) and binding.config_fingerprint == NO_CONFIG


def test_the_binding_resolves_a_linked_directory(tiny_template: Path, tmp_path: Path) -> None:
    link = tmp_path / "link"
    link.symlink_to(tiny_template)
    config = {"quantized": True, "quantization_type": fmt.QUANTIZATION_TYPE}
    binding = preflight(link, neuron_config=config, allow_custom_model=True).checked.binding  # type: ignore[union-attr]
    assert binding.root == os.path.realpath(tiny_template) and binding.config_fingerprint == config_fingerprint(config)
