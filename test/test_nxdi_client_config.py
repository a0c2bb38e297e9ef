"""The NeuronConfig of a vLLM start: the package's model where vllm-neuron is not installed (said
so), and vllm-neuron's own functions where it is — the model held to them (marker ``client``:
``VLLM_NEURON_SRC`` at a release tag, NxDI from ``NXDI_SRC``)."""

from __future__ import annotations

import re
import sys
from collections.abc import Iterator
from types import SimpleNamespace
from typing import Any

import pytest

from nxdi_gptoss_fp8 import format as fmt
from nxdi_gptoss_fp8.errors import ConfigError
from nxdi_gptoss_fp8.nxdi import client_config
from nxdi_gptoss_fp8.nxdi.client_config import ClientStart
from nxdi_gptoss_fp8.validate.vllm_config import CLIENT_RELEASES, VllmSettings, client_refusals, vllm_neuron_config

OVERRIDE = {"quantized": True, "quantized_checkpoints_path": "/ckpt", "quantization_type": fmt.QUANTIZATION_TYPE,
            "quantization_dtype": fmt.QUANTIZATION_DTYPE, "modules_to_not_convert": ["lm_head", "self_attn"]}
# (settings, override): accepted and refused ones, prefix caching on and off, blocks, overrides
STARTS: dict[str, tuple[VllmSettings, dict[str, Any]]] = {
    "the recipe": (VllmSettings(64, 8192, 4, 8192, False, "bfloat16"), OVERRIDE),
    "prefix caching, enough blocks": (VllmSettings(2, 128, 2, 32, True, "bfloat16"), OVERRIDE),
    "prefix caching, too few blocks": (VllmSettings(2, 100, 1, 32, True, "bfloat16"), OVERRIDE),
    "pa_num_blocks alone": (VllmSettings(2, 128, 2, 32, True, "bfloat16"), {**OVERRIDE, "pa_num_blocks": 8}),
    "is_prefix_caching off": (VllmSettings(2, 128, 2, 32, True, "bfloat16"), {**OVERRIDE, "is_prefix_caching": False}),
    "quantized alone": (VllmSettings(8, 4096, 4, 4096, False, "bfloat16"), {"quantized": True}),
    "no override": (VllmSettings(1, 4096, 1, 4096, False, "float32"), {}),
}


def test_without_vllm_neuron_the_model_builds_it_and_says_so(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delitem(sys.modules, client_config.LOADER_MODULE, raising=False)
    loader, why = client_config.installed_loader()
    if loader is not None:
        pytest.skip("vllm-neuron is importable here")
    start = ClientStart(*STARTS["the recipe"])
    assert start.neuron_config() == vllm_neuron_config(*STARTS["the recipe"])
    assert "model of vllm-neuron 0.1.0 and 0.2.0" in start.built_by and why in start.built_by
    refused = ClientStart(*STARTS["prefix caching, too few blocks"])
    with pytest.raises(ConfigError, match=re.escape("vllm-neuron 0.2.0 refuses this NeuronConfig (0.1.0 does not): At least 4")):
        refused.neuron_config()


@pytest.fixture(scope="module")
def loader() -> Iterator[Any]:
    import clients
    import vllm_standin

    src = vllm_standin.source()
    if src is None:
        pytest.skip(f"{vllm_standin.SRC_ENV} is not set (a checkout of vllm-project/vllm-neuron at a release tag)")
    with clients.real_nxdi(), vllm_standin.loader(src) as module:
        yield module


@pytest.mark.client
@pytest.mark.parametrize("name", list(STARTS))
def test_the_model_is_vllm_neurons_own_functions(loader: Any, name: str) -> None:
    """The installed release's functions and the model of that release: the same refusal, or the
    same NeuronConfig on every key the model builds."""
    settings, override = STARTS[name]
    start = ClientStart(settings, override)
    release = CLIENT_RELEASES[-1] if hasattr(loader, "_handle_pa_num_blocks") else CLIENT_RELEASES[0]
    modelled = client_refusals(settings, override, release)
    try:
        built = start.neuron_config()
    except ConfigError as exc:
        assert modelled, f"vllm-neuron {release} refuses ({exc}), the model does not"
        assert f"vllm-neuron {release}" in str(exc)
        return
    assert modelled == [], f"the model refuses ({modelled}), vllm-neuron {release} does not"
    assert f"vllm-neuron {release}'s own functions" in start.built_by
    expected = vllm_neuron_config(settings, override, release)
    keys = set(expected) - {"torch_dtype", "on_device_sampling_config", "lora_config"}
    assert {key: built.get(key) for key in keys} == {key: expected[key] for key in keys}
    assert SimpleNamespace(**built).on_device_sampling_config["dynamic"] is True
