"""Stand-in of ``models/gpt_oss/modeling_gpt_oss.py``: the GPT-OSS configs and application class.

The conversion dispatch reads ``CHECKPOINT_FORMAT`` at call time exactly like NxDI (lower-cased,
default "hf"; only "hf" takes the HF branch). Each branch records its call in ``CALLS`` and
adds the runtime entries both real branches add, so tests can see which one ran.
"""

from __future__ import annotations

import os
from typing import Any

import torch

from .application_base import NeuronApplicationBase
from .config import InferenceConfig, MoENeuronConfig, NeuronConfig

CALLS: list[tuple[str, int]] = []  # (branch, id of the state dict it was given)


def get_lm_head_pad_config(vocab_size: int, tp_degree: int, lm_head_pad_alignment_size: int = 1,
                           skip_lm_head_pad: bool = False) -> tuple[bool, int]:
    """(pad?, alignment): pad unless asked not to or the vocabulary already divides evenly."""
    divides = vocab_size % (tp_degree * lm_head_pad_alignment_size) == 0
    return (False, 1) if skip_lm_head_pad or divides else (True, lm_head_pad_alignment_size)


class GptOssNeuronConfig(MoENeuronConfig):
    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)


class GptOssInferenceConfig(InferenceConfig):
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        if not hasattr(self, "original_hidden_size"):
            self.original_hidden_size = self.hidden_size
        if not hasattr(self, "original_intermediate_size"):
            self.original_intermediate_size = self.intermediate_size
        nc = self.neuron_config
        self.hidden_size = nc.padded_hidden_size or self.hidden_size
        self.intermediate_size = nc.padded_intermediate_size or self.intermediate_size

    @classmethod
    def get_neuron_config_cls(cls) -> type[NeuronConfig]:
        return GptOssNeuronConfig


def _runtime_entries(state_dict: dict, config: InferenceConfig) -> None:
    nc = config.neuron_config
    for layer in range(config.num_hidden_layers):
        state_dict[f"layers.{layer}.self_attn.rank_util.rank"] = torch.arange(0, nc.tp_degree, dtype=torch.int32)
    state_dict["rank_util.rank"] = torch.arange(0, nc.tp_degree, dtype=torch.int32)


class NeuronGptOssForCausalLM(NeuronApplicationBase):
    _model_cls = object

    @staticmethod
    def load_hf_model(model_path: str, **kwargs: Any) -> Any:
        if os.environ.get("CHECKPOINT_FORMAT", "hf").lower() != "hf":
            raise AssertionError("stand-in: an HF model loads only with CHECKPOINT_FORMAT=hf")
        raise FileNotFoundError(f"stand-in: no Hugging Face model at {model_path}")

    @staticmethod
    def convert_hf_to_neuron_state_dict(state_dict: dict, config: InferenceConfig) -> dict:
        # like NxDI: read at call time, lower-cased, no stripping; only "hf" takes the HF branch,
        # and the helpers are reached through the class by name (a subclass cannot override them)
        branch = "hf" if os.environ.get("CHECKPOINT_FORMAT", "hf").lower() == "hf" else "legacy"
        helper = {"hf": "_convert_hf_format_state_dict", "legacy": "_convert_neuron_format_state_dict"}[branch]
        return getattr(NeuronGptOssForCausalLM, helper)(state_dict, config)

    @staticmethod
    def _convert_hf_format_state_dict(state_dict: dict, config: InferenceConfig) -> dict:
        CALLS.append(("hf", id(state_dict)))
        _runtime_entries(state_dict, config)
        return state_dict

    @staticmethod
    def _convert_neuron_format_state_dict(state_dict: dict, config: InferenceConfig) -> dict:
        CALLS.append(("legacy", id(state_dict)))
        _runtime_entries(state_dict, config)
        return state_dict

    @staticmethod
    def update_state_dict_for_tied_weights(state_dict: dict) -> None:
        pass

    @classmethod
    def get_config_cls(cls) -> type[InferenceConfig]:
        return GptOssInferenceConfig
