"""Small editing helpers for tests that break checkpoints on purpose."""

from __future__ import annotations

import json
import struct
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from safetensors import safe_open
from safetensors.torch import save_file

from nxdi_gptoss_fp8 import format as fmt

INDEX = fmt.INDEX_FILE
GATE_UP_SCALE = f"layers.0.{fmt.GATE_UP}.scale"
GATE_UP_WEIGHT = f"layers.0.{fmt.GATE_UP}.weight"
DOWN_WEIGHT = f"layers.0.{fmt.DOWN}.weight"
DOWN_SCALE = f"layers.0.{fmt.DOWN}.scale"


def read_json(path: Path) -> Any:
    return json.loads(path.read_text())


def write_json(path: Path, document: Any) -> None:
    path.write_text(json.dumps(document, indent=2))


def edit_index(ckpt: Path, change: Callable[[dict], None]) -> None:
    index = read_json(ckpt / INDEX)
    change(index)
    write_json(ckpt / INDEX, index)


def edit_config(ckpt: Path, change: Callable[[dict], None]) -> None:
    config = read_json(ckpt / fmt.CONFIG_FILE)
    change(config)
    write_json(ckpt / fmt.CONFIG_FILE, config)


def shard_of(ckpt: Path, key: str) -> str:
    return read_json(ckpt / INDEX)["weight_map"][key]


def shards(ckpt: Path) -> list[str]:
    return sorted(set(read_json(ckpt / INDEX)["weight_map"].values()))


def load_shard(ckpt: Path, shard: str) -> dict[str, torch.Tensor]:
    with safe_open(str(ckpt / shard), "pt") as handle:
        return {key: handle.get_tensor(key) for key in handle.keys()}  # noqa: SIM118


def edit_shard(ckpt: Path, shard: str, change: Callable[[dict[str, torch.Tensor]], None]) -> None:
    """Rewrite ``shard`` with safetensors after ``change`` edits its tensors (index untouched)."""
    tensors = load_shard(ckpt, shard)
    change(tensors)
    save_file(tensors, str(ckpt / shard))


def raw_header(path: Path) -> tuple[dict, bytes]:
    data = path.read_bytes()
    (length,) = struct.unpack("<Q", data[:8])
    return json.loads(data[8 : 8 + length]), data[8 + length :]


def write_raw(path: Path, header_text: bytes, payload: bytes) -> None:
    path.write_bytes(struct.pack("<Q", len(header_text)) + header_text + payload)


def edit_header(ckpt: Path, shard: str, change: Callable[[dict], None]) -> None:
    """Rewrite a shard's header JSON (data bytes kept) after ``change`` edits the dict."""
    header, payload = raw_header(ckpt / shard)
    change(header)
    write_raw(ckpt / shard, json.dumps(header).encode(), payload)


def move_tensor(ckpt: Path, key: str, to_shard: str, *, update_index: bool) -> None:
    """Move ``key`` physically to ``to_shard``; keep or update its index entry."""
    source = shard_of(ckpt, key)
    tensors = load_shard(ckpt, source)
    tensor = tensors.pop(key)
    save_file(tensors, str(ckpt / source))
    edit_shard(ckpt, to_shard, lambda t: t.__setitem__(key, tensor))
    if update_index:
        edit_index(ckpt, lambda index: index["weight_map"].__setitem__(key, to_shard))


def add_tensor(ckpt: Path, key: str, tensor: torch.Tensor, *, shard: str | None = None, list_in_index: bool = True) -> None:
    """Add a tensor to a shard (the first by default), fixing total_size if listed."""
    target = shard or shards(ckpt)[0]
    edit_shard(ckpt, target, lambda t: t.__setitem__(key, tensor))
    if list_in_index:
        def change(index: dict) -> None:
            index["weight_map"][key] = target
            index["metadata"]["total_size"] += tensor.numel() * tensor.element_size()
        edit_index(ckpt, change)


def remove_tensor(ckpt: Path, key: str, *, from_index: bool = True) -> None:
    source = shard_of(ckpt, key)
    removed = load_shard(ckpt, source)[key]
    edit_shard(ckpt, source, lambda t: t.pop(key))
    if from_index:
        def change(index: dict) -> None:
            del index["weight_map"][key]
            index["metadata"]["total_size"] -= removed.numel() * removed.element_size()
        edit_index(ckpt, change)


def replace_tensor(ckpt: Path, key: str, tensor: torch.Tensor) -> None:
    """Replace ``key`` in its shard (any dtype/shape), fixing total_size."""
    source = shard_of(ckpt, key)
    old = load_shard(ckpt, source)[key]
    edit_shard(ckpt, source, lambda t: t.__setitem__(key, tensor))
    edit_index(ckpt, lambda index: index["metadata"].__setitem__(
        "total_size", index["metadata"]["total_size"] - old.numel() * old.element_size() + tensor.numel() * tensor.element_size()))


def rename_tensor(ckpt: Path, old: str, new: str) -> None:
    source = shard_of(ckpt, old)

    def change_shard(tensors: dict[str, torch.Tensor]) -> None:
        tensors[new] = tensors.pop(old)

    def change_index(index: dict) -> None:
        index["weight_map"][new] = index["weight_map"].pop(old)

    edit_shard(ckpt, source, change_shard)
    edit_index(ckpt, change_index)
