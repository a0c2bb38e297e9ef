"""Stand-in of ``models/config.py``: NeuronConfig pops what it knows and drops the rest with a
warning; InferenceConfig serializes attributes to JSON (``save`` / ``load``: ``neuron_config.json``) and
rebuilds NeuronConfig from them."""

from __future__ import annotations

import json
import logging
import os
from typing import Any

import torch

CONFIG_FILE = "neuron_config.json"
_DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}


def to_dict(obj: Any) -> Any:
    if type(obj) is dict:
        return {k: to_dict(v) for k, v in obj.items()}
    if type(obj) is list:
        return [to_dict(v) for v in obj]
    if isinstance(obj, torch.dtype):
        return str(obj).split(".")[1]
    if hasattr(obj, "__dict__") and not isinstance(obj, type):
        return {k: to_dict(v) for k, v in obj.__dict__.items()}
    return obj


_NEURON_CONFIG_DEFAULTS: dict[str, Any] = {
    "batch_size": 1, "tkg_batch_size": None, "cast_type": "config", "tp_degree": 1, "pp_degree": 1,
    "ep_degree": 1, "cp_degree": 1, "attention_dp_degree": 1, "world_size": None,
    "start_rank_id": 0, "local_ranks_size": None, "fused_qkv": False, "vocab_parallel": False,
    "quantized": False, "quantized_checkpoints_path": None,
    "quantization_type": "per_tensor_symmetric", "quantization_dtype": "int8",
    "modules_to_not_convert": None, "is_mxfp4_compute": False, "padded_hidden_size": None,
    "padded_intermediate_size": None, "lm_head_pad_alignment_size": 1, "is_medusa": False,
    "enable_fused_speculation": False, "quantized_mlp_kernel_enabled": False,
    "save_sharded_checkpoint": False, "skip_sharding": False, "on_cpu": False, "is_continuous_batching": False,
    "quantize_clamp_bound": float("inf"),  # NxDI's default: save() then writes the constant Infinity
}


class NeuronConfig:

    def __init__(self, **kwargs: Any) -> None:
        for name, default in _NEURON_CONFIG_DEFAULTS.items():
            setattr(self, name, kwargs.pop(name, default))
        dtype = kwargs.pop("torch_dtype", torch.bfloat16)
        self.torch_dtype = _DTYPES[dtype] if isinstance(dtype, str) else dtype
        self.logical_nc_config = int(kwargs.pop("logical_nc_config", 1))
        self.lm_head_pad = kwargs.pop("lm_head_pad", self.logical_nc_config > 1)
        if self.world_size is None:
            self.world_size = self.tp_degree * self.pp_degree * self.ep_degree
        if self.local_ranks_size is None:
            self.local_ranks_size = self.world_size
        if self.quantized and self.quantized_checkpoints_path is None:
            raise AssertionError("stand-in: quantized=True needs quantized_checkpoints_path")
        if kwargs:  # NxDI keeps going and only logs a warning about the keywords it dropped
            logging.warning("stand-in NeuronConfig dropped unknown keyword arguments: %s", sorted(kwargs))


class MoENeuronConfig(NeuronConfig):
    def __init__(self, capacity_factor: float | None = None, glu_mlp: bool = True, **kwargs: Any) -> None:
        self.capacity_factor = capacity_factor
        self.glu_mlp = glu_mlp
        self.moe_tp_degree = kwargs.pop("moe_tp_degree", 1)
        self.moe_ep_degree = kwargs.pop("moe_ep_degree", 1)
        super().__init__(**kwargs)


class InferenceConfig:
    def __init__(self, neuron_config: NeuronConfig, fused_spec_config: Any = None, load_config: Any = None,
                 metadata: dict | None = None, **kwargs: Any) -> None:
        self.neuron_config = neuron_config
        self.fused_spec_config = fused_spec_config
        if load_config is not None:
            load_config(self)
        self.metadata = metadata
        for key, value in kwargs.items():
            setattr(self, key, value)

    def to_json_string(self) -> str:
        return json.dumps(to_dict(self), indent=2, sort_keys=True)

    def save(self, model_path: str) -> None:
        os.makedirs(model_path, exist_ok=True)
        with open(os.path.join(model_path, CONFIG_FILE), "w", encoding="utf-8") as handle:
            handle.write(self.to_json_string())

    @classmethod
    def load(cls, model_path: str, **kwargs: Any) -> InferenceConfig:
        with open(os.path.join(model_path, CONFIG_FILE), encoding="utf-8") as handle:
            return cls.from_json_string(handle.read(), **kwargs)

    @classmethod
    def from_json_string(cls, json_string: str, **kwargs: Any) -> InferenceConfig:
        merged = json.loads(json_string)
        merged.update(kwargs)
        if isinstance(merged.get("neuron_config"), dict):
            merged["neuron_config"] = cls.get_neuron_config_cls()(**merged["neuron_config"])
        return cls(**merged)

    @classmethod
    def get_neuron_config_cls(cls) -> type[NeuronConfig]:
        return NeuronConfig
