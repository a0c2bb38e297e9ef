"""NxDI's real ``modeling_gpt_oss`` for the ``nxdi`` tests: the installed NxDI, or the checkout
``NXDI_SRC`` points at with the Neuron-only packages stubbed; the test skips when neither is there.
Also the GPT-OSS application built from a checkpoint the way NxDI's drivers build it.
"""

from __future__ import annotations

import contextlib
import importlib.util
import json
import os
from collections.abc import Iterator, Mapping
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
from nxdi_standin import neuron_stubs

from nxdi_gptoss_fp8 import format as fmt
from nxdi_gptoss_fp8.forward.cpu_model import _environ
from nxdi_gptoss_fp8.nxdi import hook as nxdi_hook

SRC = os.environ.get("NXDI_SRC")


def nxdi_context() -> contextlib.AbstractContextManager[None]:
    """Nothing to do when NxDI is installed (and ``NXDI_SRC`` unset); else ``NXDI_SRC``'s sources on the path."""
    if importlib.util.find_spec("neuronx_distributed_inference") is not None and not SRC:
        return contextlib.nullcontext()
    if not SRC:
        pytest.skip("NxDI is not installed and NXDI_SRC is not set")
    src = os.path.join(SRC, "src")
    if not os.path.isdir(os.path.join(src, "neuronx_distributed_inference")):
        pytest.fail(f"NXDI_SRC={SRC} has no src/neuronx_distributed_inference")
    return neuron_stubs.installed(src)


@contextlib.contextmanager
def real_modeling(*, unset: tuple[str, ...] = ()) -> Iterator[ModuleType]:
    """NxDI's real ``modeling_gpt_oss`` module, with custom formats allowed and the variables
    ``unset`` removed; the environment (``CHECKPOINT_FORMAT`` included) is restored and the hook
    unregistered afterwards."""
    values: Mapping[str, str | None] = {
        # else NeuronConfig asks the hardware
        "NEURON_PLATFORM_TARGET_OVERRIDE": os.environ.get("NEURON_PLATFORM_TARGET_OVERRIDE", "trn2"),
        fmt.ALLOW_CUSTOM_ENV: "1", nxdi_hook.ENV_VAR: os.environ.get(nxdi_hook.ENV_VAR),
        **dict.fromkeys(unset),
    }
    with _environ(values), nxdi_context():
        yield __import__(nxdi_hook.MODELING_MODULE, fromlist=["NeuronGptOssForCausalLM"])
        nxdi_hook.unregister()


def gptoss_app(modeling: ModuleType, ckpt: Path, neuron_kwargs: Mapping[str, Any]) -> Any:
    """``modeling``'s GPT-OSS application for ``ckpt``: NeuronConfig from ``neuron_kwargs``, the
    model config read from ``ckpt`` the way NxDI's ``load_pretrained_config`` sets it."""
    neuron_config = modeling.GptOssNeuronConfig(**neuron_kwargs)

    def load_config(config: Any) -> None:  # what NxDI's load_pretrained_config sets
        values = json.loads((ckpt / fmt.CONFIG_FILE).read_text())
        values.pop("torch_dtype", None)
        config.__dict__.update(values)
        config._name_or_path = str(ckpt)

    return modeling.NeuronGptOssForCausalLM(str(ckpt), modeling.GptOssInferenceConfig(neuron_config, load_config=load_config))
