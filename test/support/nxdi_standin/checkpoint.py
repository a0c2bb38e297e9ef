"""Stand-in of ``modules/checkpoint.py``: an indexed safetensors directory is loaded whole
file by whole file; the index's ownership of keys is not checked."""

from __future__ import annotations

import json
import os

import torch
from safetensors.torch import load_file


def load_state_dict(state_dict_dir: str) -> dict[str, torch.Tensor]:
    single = os.path.join(state_dict_dir, "model.safetensors")
    if os.path.isfile(single):
        return load_file(single)
    index = os.path.join(state_dict_dir, "model.safetensors.index.json")
    if not os.path.isfile(index):
        raise FileNotFoundError(f"stand-in: neither model.safetensors nor an index in {state_dict_dir}")
    with open(index) as handle:
        weight_map = json.load(handle)["weight_map"]
    state_dict: dict[str, torch.Tensor] = {}
    for filename in set(weight_map.values()):
        part = load_file(os.path.join(state_dict_dir, filename))
        repeated = sorted(set(part) & set(state_dict))
        if repeated:  # NxDI raises a plain Exception here too
            raise Exception(f"stand-in: {filename} repeats {repeated[0]}, already loaded from another file")
        state_dict.update(part)
    return state_dict
