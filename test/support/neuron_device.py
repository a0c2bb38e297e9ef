"""The Neuron compiler and device, stood in minimally for the client tests.

NxDI's ``NeuronApplicationBase`` compiles through NxD's ``ModelBuilder`` (``trace()`` gives the
traced model NxDI ``torch.jit.save``s as ``COMPILED/model.pt``; ``shard_checkpoint()`` calls the
application's ``checkpoint_loader_fn`` and shards the weights per rank, writing
``weights/tp{rank}_sharded_checkpoint.safetensors`` when given a path) and loads by
``torch.jit.load``ing ``model.pt`` and handing the weights to ``nxd_model.initialize``. Here:

* ``ModelBuilder`` takes NxD's arguments; ``trace()`` returns a ``TracedModel``;
  ``shard_checkpoint()`` calls the checkpoint loader exactly once per call, as NxD does, and gives
  every local rank the whole state dict (tp 1 is the faithful case; no tensor is split);
* ``torch.jit.save`` / ``torch.jit.load`` of a ``TracedModel`` write and read a small JSON file;
  ``load`` of a missing file raises torch's own ``ValueError`` ("The provided filename ... does not
  exist"), which is what vllm-neuron's ``except (FileNotFoundError, ValueError)`` meets on a first start;
* ``nxd_model.initialize(weights, start_rank)`` records the weights (``DEVICE.loads``);
  ``forward`` (NxDI's warmup) returns nothing.

NxDI's own code runs unchanged around these: its config save/load, ``compile``, ``load``,
``load_weights``, ``shard_weights``, and the hook's wrappers on them.
"""

from __future__ import annotations

import contextlib
import json
import os
import types
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import torch

MARKER = "neuron-device-standin traced model"


@dataclass
class Device:
    loads: list[list[dict[str, torch.Tensor]]] = field(default_factory=list)  # one per initialize()
    traces: int = 0
    checkpoint_loads: int = 0


DEVICE = Device()


class _NxdModel:
    def initialize(self, weights: list[dict[str, torch.Tensor]], start_rank: torch.Tensor) -> None:
        DEVICE.loads.append(weights)

    def forward(self, *args: Any, **kwargs: Any) -> None:
        return None


class TracedModel:
    def __init__(self, tags: list[str]) -> None:
        self.tags = tags
        self.nxd_model = _NxdModel()


class ModelBuilder:
    """NxD's ``ModelBuilder``: the arguments NxDI passes, ``add``, ``trace``, ``shard_checkpoint``."""

    def __init__(self, *, router: Any, tp_degree: int, checkpoint_loader: Any, compiler_workdir: str,
                 start_rank_id: int = 0, local_ranks_size: int | None = None, **_: Any) -> None:
        self.tp_degree = tp_degree
        self.checkpoint_loader = checkpoint_loader
        self.compiler_workdir = compiler_workdir
        self.start_rank_id = start_rank_id or 0
        self.local_ranks_size = local_ranks_size or tp_degree
        self.tags: list[str] = []

    def add(self, key: str, **_: Any) -> ModelBuilder:
        self.tags.append(key)
        return self

    def trace(self, initialize_model_weights: bool = False, dry_run: bool = False, **_: Any) -> TracedModel:
        DEVICE.traces += 1
        return TracedModel(list(self.tags))

    def shard_checkpoint(self, serialize_path: str | None = None) -> list[dict[str, torch.Tensor]]:
        from safetensors.torch import save_file

        DEVICE.checkpoint_loads += 1
        state_dict = self.checkpoint_loader()
        ranks = range(self.start_rank_id, self.start_rank_id + self.local_ranks_size)
        if serialize_path is None:
            return [state_dict for _ in ranks]
        os.makedirs(serialize_path, exist_ok=True)
        for rank in ranks:
            tensors = {key: tensor.contiguous() for key, tensor in state_dict.items()}
            save_file(tensors, os.path.join(serialize_path, f"tp{rank}_sharded_checkpoint.safetensors"))
        return []


@contextlib.contextmanager
def installed(application_base: Any) -> Iterator[Device]:
    """Stand the compiler and device in for NxDI's ``application_base`` module; restored after."""
    real_save, real_load = torch.jit.save, torch.jit.load

    def save(obj: Any, f: Any, *args: Any, **kwargs: Any) -> None:
        if not isinstance(obj, TracedModel):
            return real_save(obj, f, *args, **kwargs)
        with open(f, "w") as handle:
            json.dump({"marker": MARKER, "tags": obj.tags}, handle)
        return None

    def load(f: Any, *args: Any, **kwargs: Any) -> Any:
        if isinstance(f, (str, os.PathLike)) and not os.path.exists(f):
            raise ValueError(f"The provided filename {f} does not exist")  # torch.jit.load's own error
        try:
            with open(f) as handle:
                data = json.load(handle)
        except (UnicodeDecodeError, json.JSONDecodeError):
            return real_load(f, *args, **kwargs)
        if not isinstance(data, dict) or data.get("marker") != MARKER:
            return real_load(f, *args, **kwargs)
        return TracedModel(data["tags"])

    saved_builder, saved_hlo_utils = application_base.ModelBuilder, application_base.hlo_utils
    DEVICE.loads.clear()
    DEVICE.traces = DEVICE.checkpoint_loads = 0
    application_base.ModelBuilder = ModelBuilder
    # NxD's trace.hlo_utils: shard_weights reads this constant (NxD 0.18 gives it this value)
    application_base.hlo_utils = types.SimpleNamespace(NXD_LAYOUT_TRANSFORMATION_OPTIONS="NXD_LAYOUT_TRANSFORMATION_OPTIONS")
    torch.jit.save, torch.jit.load = save, load
    try:
        yield DEVICE
    finally:
        application_base.ModelBuilder, application_base.hlo_utils = saved_builder, saved_hlo_utils
        torch.jit.save, torch.jit.load = real_save, real_load


__all__ = ["DEVICE", "Device", "ModelBuilder", "TracedModel", "installed"]
