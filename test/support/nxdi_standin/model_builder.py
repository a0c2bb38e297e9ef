"""Stand-ins of NxD's ``ModelBuilder`` (the part ``shard_weights`` / ``load_weights`` use) and of
the traced model whose ``nxd_model.initialize`` receives the weights (contract a.1, a.4).

``ShardingBuilder.shard_checkpoint(serialize_path=None)`` calls the checkpoint loader with no
arguments, as NxD does, and cuts its output into one state dict per rank of
``start_rank_id … start_rank_id + local_ranks_size - 1``; with ``serialize_path`` it saves each as
``tp{rank}_sharded_checkpoint.safetensors`` there (creating the directory). The cut is simpler than
NxD's (a tensor whose first dimension divides by tp is split on it, anything else replicated) but
has what the checks need: every rank's header is the same, its data are not.

``RecordingTracedModel().nxd_model.initialize(weights, start_rank)`` records its arguments.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any

import torch
from safetensors.torch import save_file


def rank_file(rank: int) -> str:
    return f"tp{rank}_sharded_checkpoint.safetensors"


class ShardingBuilder:
    def __init__(self, checkpoint_loader: Callable[[], dict[str, torch.Tensor]], *, tp_degree: int,
                 start_rank_id: int = 0, local_ranks_size: int | None = None,
                 fail_after_rank: int | None = None) -> None:
        self.checkpoint_loader = checkpoint_loader
        self.tp_degree = tp_degree
        self.start_rank_id = start_rank_id
        self.local_ranks_size = tp_degree if local_ranks_size is None else local_ranks_size
        self.fail_after_rank = fail_after_rank  # simulate a shard step interrupted after that rank's file
        self.loader_calls = 0

    @classmethod
    def for_app(cls, app: Any, **kwargs: Any) -> ShardingBuilder:
        nc = app.neuron_config
        return cls(app.checkpoint_loader_fn, tp_degree=nc.tp_degree, start_rank_id=nc.start_rank_id,
                   local_ranks_size=nc.local_ranks_size, **kwargs)

    def shard_rank(self, checkpoint: dict[str, torch.Tensor], rank: int) -> dict[str, torch.Tensor]:
        sharded = {}
        for name, tensor in checkpoint.items():
            if tensor.dim() and tensor.shape[0] % self.tp_degree == 0 and tensor.shape[0] >= self.tp_degree:
                tensor = tensor.chunk(self.tp_degree, dim=0)[rank]
            sharded[name] = tensor.contiguous().clone()
        return sharded

    def shard_checkpoint(self, serialize_path: str | None = None) -> list[dict[str, torch.Tensor]]:
        if serialize_path is not None and not os.path.exists(serialize_path):
            os.makedirs(serialize_path)
        self.loader_calls += 1
        checkpoint = self.checkpoint_loader()
        shards = []
        for rank in range(self.start_rank_id, self.start_rank_id + self.local_ranks_size):
            sharded = self.shard_rank(checkpoint, rank)
            if serialize_path is not None:
                save_file(sharded, os.path.join(serialize_path, rank_file(rank)))
            shards.append(sharded)
            if self.fail_after_rank == rank:
                raise RuntimeError(f"stand-in: shard step interrupted after rank {rank}")
        return shards


class _RecordingNxdModel:
    def __init__(self) -> None:
        self.calls: list[tuple[list[dict[str, torch.Tensor]], torch.Tensor]] = []

    def initialize(self, weights: list[dict[str, torch.Tensor]], start_rank_tensor: torch.Tensor) -> None:
        self.calls.append((weights, start_rank_tensor))


class RecordingTracedModel:
    """What ``torch.jit.load(model.pt)`` returns, reduced to what ``load_weights`` touches."""

    def __init__(self) -> None:
        self.nxd_model = _RecordingNxdModel()
