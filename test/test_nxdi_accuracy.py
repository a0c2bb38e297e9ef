"""The hooked ``load_hf_model`` (``nxdi.accuracy``) on the NxDI stand-in: which reference it builds,
from which setting, with which checkpoint and dtype, and its one-line refusals."""

from __future__ import annotations

from collections.abc import Iterator
from types import SimpleNamespace
from typing import Any

import nxdi_standin
import pytest

from nxdi_gptoss_fp8 import format as fmt
from nxdi_gptoss_fp8.errors import CheckpointFormatError, ConfigError, LoadError
from nxdi_gptoss_fp8.forward import hf_reference
from nxdi_gptoss_fp8.nxdi import hook as nxdi_hook


@pytest.fixture
def nxdi(monkeypatch: pytest.MonkeyPatch) -> Iterator[SimpleNamespace]:
    monkeypatch.delenv(nxdi_hook.ENV_VAR, raising=False)
    monkeypatch.delenv(fmt.REFERENCE_ENV, raising=False)
    with nxdi_standin.installed() as modules:
        nxdi_hook.register()
        yield modules


@pytest.fixture
def built(monkeypatch: pytest.MonkeyPatch) -> list[dict[str, Any]]:
    """``build_reference`` recording its arguments instead of building."""
    calls: list[dict[str, Any]] = []

    def record(ckpt: str, reference: str, **kwargs: Any) -> Any:
        calls.append({"ckpt": ckpt, "reference": reference, **kwargs})
        return SimpleNamespace(model=f"model of {reference}", describe=lambda: "built")

    monkeypatch.setattr(hf_reference, "build_reference", record)
    return calls


def app(nxdi: SimpleNamespace, **neuron_config: Any) -> Any:
    modeling = nxdi.modeling_gpt_oss
    def load(config: Any) -> None:
        config.hidden_size, config.intermediate_size = 64, 64

    config = modeling.GptOssInferenceConfig(modeling.GptOssNeuronConfig(**neuron_config), load_config=load)
    return modeling.NeuronGptOssForCausalLM("/model/path", config)


def test_unset_it_refuses_in_one_line_naming_the_variable(nxdi: SimpleNamespace, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(nxdi_hook.ENV_VAR, "normalized_fp8")
    for call in (nxdi.modeling_gpt_oss.NeuronGptOssForCausalLM.load_hf_model, app(nxdi).load_hf_model):
        with pytest.raises(LoadError, match=f"no Hugging Face model.*{fmt.REFERENCE_ENV}=dequantized") as caught:
            call("/model/path")
        assert "\n" not in str(caught.value) and "docs/accuracy.md" in str(caught.value)


@pytest.mark.parametrize("value", ["dequantised", "bf16", "yes"])
def test_a_value_that_is_no_reference_is_refused(nxdi: SimpleNamespace, monkeypatch: pytest.MonkeyPatch, value: str) -> None:
    monkeypatch.setenv(nxdi_hook.ENV_VAR, "normalized_fp8")
    monkeypatch.setenv(fmt.REFERENCE_ENV, value)
    with pytest.raises(ConfigError, match=f"^{fmt.REFERENCE_ENV}='{value}' is not a reference"):
        app(nxdi).load_hf_model("/model/path")


def test_the_environment_chooses_and_the_dtype_follows_the_neuron_config(
        nxdi: SimpleNamespace, monkeypatch: pytest.MonkeyPatch, built: list[dict[str, Any]]) -> None:
    monkeypatch.setenv(nxdi_hook.ENV_VAR, "normalized_fp8")
    monkeypatch.setenv(fmt.REFERENCE_ENV, "/data/models/gpt-oss-120b")
    model = app(nxdi, torch_dtype="float32", quantized_checkpoints_path="/ckpt").load_hf_model("/model/path")
    assert model == "model of /data/models/gpt-oss-120b"
    assert built[-1]["ckpt"] == "/ckpt" and built[-1]["dtype"] == "float32"
    nxdi.modeling_gpt_oss.NeuronGptOssForCausalLM.load_hf_model("/model/path", torch_dtype="bfloat16")  # no instance
    assert built[-1]["ckpt"] == "/model/path" and built[-1]["dtype"] == "bfloat16"


def test_the_neuron_config_key_is_kept_and_chooses(nxdi: SimpleNamespace, built: list[dict[str, Any]]) -> None:
    instance = app(nxdi, checkpoint_format="normalized_fp8", **{fmt.REFERENCE_ATTR: "dequantized"})
    assert getattr(instance.config.neuron_config, fmt.REFERENCE_ATTR) == "dequantized"  # NxDI would drop it
    assert instance.load_hf_model(instance.model_path) == "model of dequantized"
    assert built[-1]["reference"] == "dequantized"


def test_the_environment_and_the_config_must_agree(nxdi: SimpleNamespace, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(fmt.REFERENCE_ENV, "/src")
    instance = app(nxdi, checkpoint_format="normalized_fp8", **{fmt.REFERENCE_ATTR: "dequantized"})
    with pytest.raises(ConfigError, match="contradicts"):
        instance.load_hf_model(instance.model_path)


def test_outside_normalized_mode_nxdis_own_method_runs(nxdi: SimpleNamespace, monkeypatch: pytest.MonkeyPatch,
                                                        built: list[dict[str, Any]]) -> None:
    monkeypatch.setenv(fmt.REFERENCE_ENV, "dequantized")
    with pytest.raises(FileNotFoundError, match="stand-in"):
        app(nxdi).load_hf_model("/some/hf/model")
    monkeypatch.setenv(nxdi_hook.ENV_VAR, "normalised-fp8")
    with pytest.raises(CheckpointFormatError):
        app(nxdi).load_hf_model("/some/hf/model")
    assert built == []


def test_unregister_restores_nxdis_static_method(nxdi: SimpleNamespace) -> None:
    cls = nxdi.modeling_gpt_oss.NeuronGptOssForCausalLM
    assert type(cls.__dict__["load_hf_model"]).__name__ == "ConfigAwareStaticMethod"
    nxdi_hook.unregister()
    assert type(cls.__dict__["load_hf_model"]) is staticmethod
