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
        raise FileNotFoundError(f"Can not find model.safetensors or index in {state_dict_dir}")
    with open(index) as handle:
        weight_map = json.load(handle)["weight_map"]
    state_dict: dict[str, torch.Tensor] = {}
    for filename in set(weight_map.values()):
        part = load_file(os.path.join(state_dict_dir, filename))
        for key in part:
            if key in state_dict:
                raise Exception(f"Found value overriden for key {key} from file {filename}")
        state_dict.update(part)
    return state_dict
