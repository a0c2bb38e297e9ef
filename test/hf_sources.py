"""Writers of tiny synthetic HF GPT-OSS source checkpoints (MXFP4 and BF16) for converter tests.

Each source has the published repos' shape: ``config.json``, a sharded top-level HF set named by
``model.safetensors.index.json``, and an ``original/`` directory beside it holding a decoy
OpenAI-layout set whose values must never reach the output.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import torch
from safetensors.torch import save_file

from nxdi_gptoss_fp8 import format as fmt
from nxdi_gptoss_fp8.convert import SOURCE_BF16, SOURCE_MXFP4, non_expert_names, source_specs

# H ≠ I, so a missing transpose cannot hide behind a square shape.
SOURCE_DIMS = fmt.ModelDims(
    num_hidden_layers=2, num_local_experts=3, hidden_size=64, intermediate_size=96,
    head_dim=16, num_attention_heads=4, num_key_value_heads=2, vocab_size=40,
    num_experts_per_tok=2, sliding_window=8,
)
MXFP4_QUANTIZATION_CONFIG = {
    "modules_to_not_convert": ["model.layers.*.self_attn", "model.layers.*.mlp.router", "model.embed_tokens", "lm_head"],
    "quant_method": "mxfp4",
}


def source_config(dims: fmt.ModelDims, kind: str) -> dict:
    """A published-style HF config: MXFP4 ones carry the mxfp4 quantization_config."""
    config = fmt.hf_config(dims)
    del config["quantization_config"]
    config["transformers_version"] = "4.55.0"
    if kind == SOURCE_MXFP4:
        config["quantization_config"] = dict(MXFP4_QUANTIZATION_CONFIG)
    return config


def source_tensors(dims: fmt.ModelDims, kind: str, *, seed: int = 0,
                   scale_range: tuple[int, int] = (118, 124)) -> dict[str, torch.Tensor]:
    """Random values for every tensor of an HF source of ``kind``.

    MXFP4 blocks are uniform random bytes; block scales are uniform in ``scale_range``
    (a spread of at most 13 keeps every value exactly representable in E4M3).
    """
    generator = torch.Generator().manual_seed(seed)
    tensors: dict[str, torch.Tensor] = {}
    renamed = non_expert_names(dims)
    for name, spec in source_specs(dims, kind).items():
        if spec.dtypes == ("U8",) and name.endswith("_blocks"):
            tensors[name] = torch.randint(0, 256, spec.shape, dtype=torch.uint8, generator=generator)
        elif spec.dtypes == ("U8",):
            low, high = scale_range
            tensors[name] = torch.randint(low, high + 1, spec.shape, dtype=torch.uint8, generator=generator)
        elif name.endswith(("gate_up_proj", "down_proj")):
            tensors[name] = (0.02 * torch.randn(spec.shape, generator=generator)).to(torch.bfloat16)
        else:
            values = 0.05 * torch.randn(spec.shape, generator=generator)
            if "norm" in renamed.get(name, ""):
                values = 1.0 + values
            tensors[name] = values.to(torch.bfloat16)
    return tensors


def write_source(root: str | os.PathLike[str], tensors: dict[str, torch.Tensor], config: dict, *,
                 shards: int = 2, original: bool = True) -> Path:
    """Write an HF checkpoint directory: config, ``shards`` safetensors files, index, original/."""
    root = Path(root)
    root.mkdir(parents=True, exist_ok=True)
    (root / fmt.CONFIG_FILE).write_text(json.dumps(config, indent=2))
    names = sorted(tensors)
    per_shard = -(-len(names) // shards)
    weight_map = {}
    for number in range(shards):
        part = names[number * per_shard:(number + 1) * per_shard]
        file_name = f"model-{number + 1:05d}-of-{shards:05d}.safetensors"
        save_file({name: tensors[name].contiguous() for name in part}, str(root / file_name))
        weight_map.update(dict.fromkeys(part, file_name))
    total = sum(t.numel() * t.element_size() for t in tensors.values())
    (root / fmt.INDEX_FILE).write_text(json.dumps({"metadata": {"total_size": total}, "weight_map": weight_map}, indent=2))
    if original:
        write_original_decoy(root / "original", config)
    return root


def write_original_decoy(directory: Path, config: dict) -> None:
    """An OpenAI-layout set whose values would poison the output if it were ever read."""
    directory.mkdir(parents=True, exist_ok=True)
    (directory / fmt.CONFIG_FILE).write_text(json.dumps({"num_hidden_layers": config["num_hidden_layers"]}))
    save_file({"embedding.weight": torch.full((4, 4), 1e30, dtype=torch.bfloat16),
               "block.0.mlp.mlp1_weight.blocks": torch.full((4, 4), 255, dtype=torch.uint8)},
              str(directory / "model.safetensors"))
    (directory / "dtypes.json").write_text("{}")


def make_source(root: str | os.PathLike[str], kind: str = SOURCE_MXFP4, *, dims: fmt.ModelDims = SOURCE_DIMS,
                seed: int = 0, **options: object) -> Path:
    """A complete synthetic source of ``kind`` at ``root``."""
    scale_range = options.pop("scale_range", (118, 124))
    tensors = source_tensors(dims, kind, seed=seed, scale_range=scale_range)  # type: ignore[arg-type]
    return write_source(root, tensors, source_config(dims, kind), **options)  # type: ignore[arg-type]


def load_source(root: str | os.PathLike[str]) -> dict[str, torch.Tensor]:
    """Every tensor of a written source (tiny sources only)."""
    from safetensors.torch import load_file

    index = json.loads((Path(root) / fmt.INDEX_FILE).read_text())
    tensors: dict[str, torch.Tensor] = {}
    for shard in sorted(set(index["weight_map"].values())):
        tensors.update(load_file(str(Path(root) / shard)))
    return tensors


__all__ = ["SOURCE_BF16", "SOURCE_DIMS", "SOURCE_MXFP4", "load_source", "make_source", "source_config",
           "source_tensors", "write_source"]
