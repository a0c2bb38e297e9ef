"""Stand-in of ``models/application_base.py``: the application base class with the loader
entry points NxDI's GPT-OSS class inherits (contract a.2, a.3, a.5)."""

from __future__ import annotations

import os
import warnings
from typing import Any

import torch
from safetensors.torch import save_file

from .checkpoint import load_state_dict
from .config import InferenceConfig


class NeuronApplicationBase(torch.nn.Module):
    _STATE_DICT_MODEL_PREFIX = "model."
    _NEW_STATE_DICT_MODEL_PREFIX = ""
    _FUSED_PREFIX = ""

    def __init__(self, model_path: str, config: InferenceConfig | None = None, neuron_config: Any = None) -> None:
        super().__init__()
        if neuron_config is not None:
            config.neuron_config = neuron_config  # type: ignore[union-attr]
        self.config = config
        self.neuron_config = config.neuron_config  # type: ignore[union-attr]
        self.fused_spec_config = getattr(config, "fused_spec_config", None)
        self.model_path = model_path

    def checkpoint_loader_fn(self, mmap: bool = False) -> dict[str, torch.Tensor]:
        model_path = getattr(self.config, "_name_or_path", None)
        if model_path is None or not os.path.exists(model_path):
            model_path = self.model_path
        if self.config.neuron_config.quantized:
            model_path = self.config.neuron_config.quantized_checkpoints_path
            if not os.path.exists(model_path):
                raise FileNotFoundError(f"Quantized checkpoint file not found: {model_path}")

        def _cast_helper(_model_sd: dict[str, torch.Tensor]) -> None:
            for name, param in _model_sd.items():
                if torch.is_floating_point(param) and param.dtype not in [torch.float8_e4m3fn]:
                    current_dtype = self.neuron_config.torch_dtype
                    if name.endswith("scale"):
                        warnings.warn(f"Found {param.dtype} scales, skip converting to {current_dtype}", stacklevel=2)
                    elif param.dtype != current_dtype:
                        warnings.warn(f"Found {param.dtype} weights in checkpoint: {name}. Will convert to {current_dtype}", stacklevel=2)
                        _model_sd[name] = param.to(current_dtype)

        if self.config.neuron_config.enable_fused_speculation:
            spec = self.fused_spec_config
            self.__class__._FUSED_PREFIX = "draft_model"
            model_sd = self.get_state_dict(spec.draft_model_path, spec.draft_config)
            self.__class__._FUSED_PREFIX = "target_model"
            model_sd.update(self.get_state_dict(model_path, self.config))
        else:
            model_sd = self.get_state_dict(model_path, self.config)
        if self.neuron_config.torch_dtype != torch.float32 and self.neuron_config.cast_type == "config":
            _cast_helper(model_sd)
        return model_sd

    @classmethod
    def get_state_dict(cls, model_name_or_path: str, config: InferenceConfig) -> dict:
        if os.path.isdir(model_name_or_path):
            model_sd = load_state_dict(model_name_or_path)
        elif os.path.isfile(model_name_or_path):
            model_sd = torch.load(model_name_or_path)
        else:
            model_sd = cls.load_hf_model(model_name_or_path).state_dict()
        for param_name in list(model_sd.keys()):
            updated = param_name
            if param_name.startswith(cls._STATE_DICT_MODEL_PREFIX):
                updated = param_name.replace(cls._STATE_DICT_MODEL_PREFIX, cls._NEW_STATE_DICT_MODEL_PREFIX, 1)
            if param_name.endswith(".weight_scale"):
                updated = updated.replace(".weight_scale", ".scale")
            if updated != param_name:
                model_sd[updated] = model_sd.pop(param_name)
        model_sd = cls.convert_hf_to_neuron_state_dict(model_sd, config)
        if getattr(config, "tie_word_embeddings", False):
            cls.update_state_dict_for_tied_weights(model_sd)
        if cls._FUSED_PREFIX != "":
            for param_name in list(model_sd.keys()):
                model_sd[f"{cls._FUSED_PREFIX}.{param_name}"] = model_sd.pop(param_name)
        return model_sd

    @staticmethod
    def convert_hf_to_neuron_state_dict(state_dict: dict, config: InferenceConfig) -> dict:
        return state_dict

    @classmethod
    def save_quantized_state_dict(cls, model_path: str, config: InferenceConfig) -> None:
        quantized = cls.generate_quantized_state_dict(model_path, config)
        target = config.neuron_config.quantized_checkpoints_path
        if os.path.isdir(target):
            save_file({k: v.contiguous() for k, v in quantized.items()}, os.path.join(target, "model.safetensors"))
        else:
            torch.save(quantized, target)

    @classmethod
    def generate_quantized_state_dict(cls, model_path: str, config: InferenceConfig) -> dict:
        hf_model = cls.load_hf_model(model_path)
        return {k: v.to(torch.int8) if v.is_floating_point() else v for k, v in hf_model.state_dict().items()}

    @staticmethod
    def load_hf_model(model_path: str) -> Any:
        raise NotImplementedError("load_hf_model is not implemented")

    @staticmethod
    def update_state_dict_for_tied_weights(state_dict: dict) -> None:
        raise NotImplementedError("State-dict update not implemented")
