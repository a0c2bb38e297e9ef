"""Stand-in of ``models/application_base.py``: the application base class with the loader
entry points NxDI's GPT-OSS class inherits (contract a.2, a.3, a.5), and the pre-sharded weights
path: ``shard_weights`` / ``load_weights`` with NxDI's signatures and rules (a.1)."""

from __future__ import annotations

import os
import warnings
from typing import Any

import torch
from safetensors.torch import load_file, save_file

from .checkpoint import load_state_dict
from .config import InferenceConfig
from .model_builder import ShardingBuilder


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
        self._builder: ShardingBuilder | None = None
        self.traced_model: Any = None

    def get_builder(self, debug: bool = False) -> ShardingBuilder:
        if self._builder is None:
            self._builder = ShardingBuilder.for_app(self)
        return self._builder

    def shard_weights(self, compiled_model_path: str, debug: bool = False, pre_shard_weights_hook: Any = None) -> None:
        """Writes ``<compiled>/weights/tp{rank}_sharded_checkpoint.safetensors`` through the builder
        only when ``save_sharded_checkpoint`` and not ``skip_sharding`` (contract a.1)."""
        sharded_checkpoint_dir = os.path.join(os.path.join(os.path.normpath(compiled_model_path), ""), "weights/")
        if pre_shard_weights_hook:
            pre_shard_weights_hook(self)
        if self.neuron_config.skip_sharding or not self.neuron_config.save_sharded_checkpoint:
            return
        self.get_builder(debug).shard_checkpoint(serialize_path=sharded_checkpoint_dir)

    def load_weights(self, compiled_model_path: str, start_rank_id: int | None = None,
                     local_ranks_size: int | None = None) -> None:
        """Pre-sharded: a bare ``load_file`` per rank; else the builder shards now (calling the
        loader); then ``traced_model.nxd_model.initialize(weights, start_rank)``."""
        compiled_model_path = os.path.join(os.path.normpath(compiled_model_path), "")
        if self.traced_model is None:
            raise ValueError("Model is not loaded")
        if start_rank_id is None:
            start_rank_id = self.neuron_config.start_rank_id
        if local_ranks_size is None:
            local_ranks_size = self.neuron_config.local_ranks_size
        if self.neuron_config.save_sharded_checkpoint:
            weights = [load_file(os.path.join(compiled_model_path, f"weights/tp{rank}_sharded_checkpoint.safetensors"))
                       for rank in range(start_rank_id, start_rank_id + local_ranks_size)]
        else:
            weights = self.get_builder().shard_checkpoint()
        self.traced_model.nxd_model.initialize(weights, torch.tensor([start_rank_id], dtype=torch.int32))

    def checkpoint_loader_fn(self, mmap: bool = False) -> dict[str, torch.Tensor]:
        """Picks the directory (config's own dir, else model_path; quantized → the quantized
        path), loads through ``get_state_dict`` (twice, prefixed, under fused speculation) and
        applies the cast rule (see ``_cast_to_runtime_dtype``). ``mmap`` is accepted, unused."""
        nc = self.config.neuron_config
        config_dir = getattr(self.config, "_name_or_path", None)
        source = config_dir if config_dir is not None and os.path.exists(config_dir) else self.model_path
        if nc.quantized:
            source = nc.quantized_checkpoints_path
            if not os.path.exists(source):
                raise FileNotFoundError(f"stand-in: no quantized checkpoint at {source}")
        if nc.enable_fused_speculation:
            draft = self.fused_spec_config
            type(self)._FUSED_PREFIX = "draft_model"
            state = self.get_state_dict(draft.draft_model_path, draft.draft_config)
            type(self)._FUSED_PREFIX = "target_model"
            state.update(self.get_state_dict(source, self.config))
        else:
            state = self.get_state_dict(source, self.config)
        if nc.torch_dtype != torch.float32 and nc.cast_type == "config":
            self._cast_to_runtime_dtype(state, nc.torch_dtype)
        return state

    @staticmethod
    def _cast_to_runtime_dtype(state: dict[str, torch.Tensor], dtype: torch.dtype) -> None:
        """NxDI's rule: floating tensors other than e4m3fn FP8 go to ``dtype`` (a copy and a
        warning each), except names ending in "scale", which are left as they are (warned)."""
        for key in list(state):
            tensor = state[key]
            if not torch.is_floating_point(tensor) or tensor.dtype == torch.float8_e4m3fn:
                continue
            if key.endswith("scale"):
                warnings.warn(f"stand-in cast rule keeps scale {key} ({tensor.dtype})", stacklevel=2)
            elif tensor.dtype != dtype:
                warnings.warn(f"stand-in cast rule casts {key} from {tensor.dtype} to {dtype}", stacklevel=2)
                state[key] = tensor.to(dtype)

    @classmethod
    def get_state_dict(cls, model_name_or_path: str, config: InferenceConfig) -> dict:
        """Directory → whole-file indexed load; file → ``torch.load``; else the HF model. Then one
        leading ``model.`` stripped, ``.weight_scale`` → ``.scale``, the class's conversion, tied
        weights, and the fused-speculation prefix."""
        if os.path.isdir(model_name_or_path):
            raw = load_state_dict(model_name_or_path)
        elif os.path.isfile(model_name_or_path):
            raw = torch.load(model_name_or_path)
        else:
            raw = cls.load_hf_model(model_name_or_path).state_dict()
        renamed: dict[str, torch.Tensor] = {}
        for key, tensor in raw.items():
            new_key = key
            if new_key.startswith(cls._STATE_DICT_MODEL_PREFIX):
                new_key = cls._NEW_STATE_DICT_MODEL_PREFIX + new_key[len(cls._STATE_DICT_MODEL_PREFIX):]
            if new_key.endswith(".weight_scale"):
                new_key = new_key[: -len(".weight_scale")] + ".scale"
            renamed[new_key] = tensor
        converted = cls.convert_hf_to_neuron_state_dict(renamed, config)
        if getattr(config, "tie_word_embeddings", False):
            cls.update_state_dict_for_tied_weights(converted)
        if cls._FUSED_PREFIX:
            converted = {f"{cls._FUSED_PREFIX}.{key}": tensor for key, tensor in converted.items()}
        return converted

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
        model = cls.load_hf_model(model_path)
        return {key: t.to(torch.int8) if t.is_floating_point() else t for key, t in model.state_dict().items()}

    @staticmethod
    def load_hf_model(model_path: str) -> Any:
        raise NotImplementedError("stand-in: the base class loads no HF model")

    @staticmethod
    def update_state_dict_for_tied_weights(state_dict: dict) -> None:
        raise NotImplementedError("stand-in: the base class ties no weights")
