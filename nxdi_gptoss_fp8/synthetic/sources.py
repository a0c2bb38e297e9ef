"""Writers of synthetic GPT-OSS checkpoints: HF sources (MXFP4, BF16), compressed-tensors FP8
sources (as llm-compressor writes them) and NxDI's legacy FP8.

Requires torch. The one place tests, benchmarks, ``make-tiny`` and ``selfcheck`` get a source
checkpoint from. An HF source has the published repos' shape: ``config.json``, a sharded
top-level HF set named by ``model.safetensors.index.json`` and, by default, an ``original/``
directory beside it holding a decoy OpenAI-layout set whose values must never reach a converted
output. A legacy source holds the weights of a normalized checkpoint in NxDI's ``block.N`` layout
with FP8 experts and per-(expert, row) scales.

Every writer writes its directory whole (``output_target.staged_output``): into a hidden work
folder, moved into place at the end; an existing non-empty directory is replaced only with
``overwrite=True`` and only when it is recognized as an earlier source of the same kind
(anything else is refused, never emptied); a failure leaves nothing behind.
"""

from __future__ import annotations

import json
import math
import os
import re
from pathlib import Path

import torch
from safetensors.torch import save as _serialize

from .. import format as fmt
from ..convert import (
    SOURCE_BF16,
    SOURCE_COMPRESSED_TENSORS,
    SOURCE_MXFP4,
    SPLIT_HALVES,
    SPLIT_INTERLEAVED,
    non_expert_names,
    source_specs,
)
from ..convert.fp8 import FP8_DTYPE
from ..convert.mxfp4 import BLOCK_SIZE
from ..machine import current_umask
from ..output_target.install import staged_output
from ..output_target.rule import SOURCE
from .tiny_stdlib import SOURCE_DIMS, check_seed, count_problems, dims_problems

MXFP4_QUANTIZATION_CONFIG = {
    "modules_to_not_convert": ["model.layers.*.self_attn", "model.layers.*.mlp.router", "model.embed_tokens", "lm_head"],
    "quant_method": "mxfp4",
}
# E8M0 block-scale exponents (inclusive): a spread of at most 13 keeps every converted value
# exactly representable in E4M3 (the converter tests' default).
EXACT_SCALE_RANGE = (118, 124)
# the exponents of published checkpoints' neighbourhood (2^-9 … 2^0), which NxDI's HF path decodes
REALISTIC_SCALE_RANGE = (118, 127)
# ``shards=PER_LAYER``: the embedding, then one shard per decoder layer, then the final norm and head
PER_LAYER = "per-layer"
_LAYER = re.compile(r"(?:^|\.)(?:layers|block)\.(\d+)\.")


def source_config(dims: fmt.ModelDims, kind: str) -> dict:
    """A published-style HF config: MXFP4 ones carry the mxfp4 quantization_config."""
    config = fmt.hf_config(dims)
    del config["quantization_config"]
    config["transformers_version"] = "4.55.0"
    if kind == SOURCE_MXFP4:
        config["quantization_config"] = dict(MXFP4_QUANTIZATION_CONFIG)
    return config


def source_tensors(dims: fmt.ModelDims, kind: str, *, seed: int = 0,
                   scale_range: tuple[int, int] = EXACT_SCALE_RANGE) -> dict[str, torch.Tensor]:
    """Random values for every tensor of an HF source of ``kind``.

    MXFP4 blocks are uniform random bytes; block scales are uniform in ``scale_range`` (inclusive);
    norms are near 1, everything else BF16 normals of a trained model's magnitude.
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


def shard_groups(names: list[str], shards: int | str) -> list[list[str]]:
    """``names`` split into ``shards`` consecutive runs of the sorted names, or by layer (``PER_LAYER``)."""
    names = sorted(names)
    if shards != PER_LAYER:
        if not isinstance(shards, int) or shards < 1:
            raise ValueError(f"shards must be a positive int or {PER_LAYER!r}, not {shards!r}")
        per_shard = -(-len(names) // shards)
        return [names[number * per_shard:(number + 1) * per_shard] for number in range(shards)]
    layers = {name: int(match.group(1)) for name in names if (match := _LAYER.search(name))}
    last = max(layers.values(), default=-1) + 1

    def place(name: str) -> int:
        if name in layers:
            return layers[name] + 1
        return 0 if "embed" in name else last + 1

    groups: dict[int, list[str]] = {}
    for name in names:
        groups.setdefault(place(name), []).append(name)
    return [groups[key] for key in sorted(groups)]


def save_file(tensors: dict[str, torch.Tensor], path: str, metadata: dict[str, str] | None = None) -> None:
    """safetensors' serialization written with Python's own file calls, so a full disk is an
    ``OSError`` naming the file, with the file mode every other file gets (0666 less the umask;
    safetensors' ``save_file`` creates its files 0600, which would make a source only its writer
    can read)."""
    data = _serialize(tensors, metadata=metadata)
    with open(path, "wb") as handle:
        handle.write(data)
    os.chmod(path, 0o666 & ~current_umask())


def write_indexed(root: str | os.PathLike[str], tensors: dict[str, torch.Tensor], config: dict, *,
                  shards: int | str = 2, overwrite: bool = False) -> Path:
    """Write ``config.json``, the shards ``model-0000N-of-0000M.safetensors`` and the index,
    whole (``overwrite``: an earlier source of the kind these tensors make may be replaced)."""
    with staged_output(root, overwrite=overwrite, kind=SOURCE) as work:
        _write_indexed(Path(work), tensors, config, shards=shards)
    return Path(root)


def _write_indexed(root: Path, tensors: dict[str, torch.Tensor], config: dict, *, shards: int | str) -> None:
    (root / fmt.CONFIG_FILE).write_text(json.dumps(config, indent=2))
    groups = shard_groups(list(tensors), shards)
    weight_map = {}
    for number, part in enumerate(groups, start=1):
        file_name = f"model-{number:05d}-of-{len(groups):05d}.safetensors"
        save_file({name: tensors[name].contiguous() for name in part}, str(root / file_name))
        weight_map.update(dict.fromkeys(part, file_name))
    total = sum(t.numel() * t.element_size() for t in tensors.values())
    (root / fmt.INDEX_FILE).write_text(json.dumps({"metadata": {"total_size": total}, "weight_map": weight_map}, indent=2))


def write_source(root: str | os.PathLike[str], tensors: dict[str, torch.Tensor], config: dict, *,
                 shards: int | str = 2, original: bool = True, overwrite: bool = False, kind: str = SOURCE) -> Path:
    """Write an HF checkpoint directory whole: config, sharded safetensors, index, and the
    original/ decoy (``overwrite``: an earlier source of ``kind`` may be replaced)."""
    with staged_output(root, overwrite=overwrite, kind=kind) as work:
        _write_indexed(Path(work), tensors, config, shards=shards)
        if original:
            _write_original_decoy(Path(work) / "original", config)
    return Path(root)


def _write_original_decoy(directory: Path, config: dict) -> None:
    """An OpenAI-layout set whose values would poison the output if it were ever read."""
    directory.mkdir()
    (directory / fmt.CONFIG_FILE).write_text(json.dumps({"num_hidden_layers": config["num_hidden_layers"]}))
    save_file({"embedding.weight": torch.full((4, 4), 1e30, dtype=torch.bfloat16),
               "block.0.mlp.mlp1_weight.blocks": torch.full((4, 4), 255, dtype=torch.uint8)},
              str(directory / "model.safetensors"))
    (directory / "dtypes.json").write_text("{}")


def check_source_dims(dims: fmt.ModelDims, kind: str) -> None:
    """``ValueError`` naming every reason ``convert`` would refuse a source of ``kind`` with these
    dimensions, or the result would not be a valid checkpoint (``tiny_stdlib.dims_problems``: the
    format's bounds, whole MXFP4 blocks), or the source is not tiny (``tiny_stdlib.count_problems``,
    counted on the source's own tensors); before any tensor is made."""
    problems = dims_problems(dims, block=BLOCK_SIZE if kind == SOURCE_MXFP4 else None)
    if not problems:
        specs = source_specs(dims, kind, {"expert_names": "mlp.experts."})
        size = sum(math.prod(spec.shape) * fmt.DTYPE_BITS[spec.dtypes[0]] // 8 for spec in specs.values())
        problems = count_problems(len(specs), size, "a tiny source")
    if problems:
        raise ValueError("; ".join(problems))


def make_source(root: str | os.PathLike[str], kind: str = SOURCE_MXFP4, *, dims: fmt.ModelDims = SOURCE_DIMS,
                seed: int = 0, scale_range: tuple[int, int] = EXACT_SCALE_RANGE, shards: int | str = 2,
                original: bool = True, overwrite: bool = False) -> Path:
    """A complete synthetic source of ``kind`` at ``root`` (compressed-tensors: variant A, see
    ``make_compressed_tensors_source``); ``overwrite`` replaces an earlier source of ``kind`` only."""
    if kind == SOURCE_COMPRESSED_TENSORS:
        return make_compressed_tensors_source(root, dims=dims, seed=seed, shards=shards if isinstance(shards, int) else 3,
                                              overwrite=overwrite)
    check_source_dims(dims, kind)
    tensors = source_tensors(dims, kind, seed=check_seed(seed), scale_range=scale_range)
    return write_source(root, tensors, source_config(dims, kind), shards=shards, original=original,
                        overwrite=overwrite, kind=kind)


# --------------------------------------------------------------------------- compressed-tensors FP8 (llm-compressor)

OCP_FP8_MAX = 448.0
COMPRESSED_TENSORS_VERSION = "0.12.2"


def _fp8_args(strategy: str, dynamic: bool, observer: str | None) -> dict:
    return {"actorder": None, "block_structure": None, "dynamic": dynamic, "group_size": None, "num_bits": 8,
            "observer": observer, "observer_kwargs": {}, "strategy": strategy, "symmetric": True, "type": "float"}


def compressed_tensors_config(dims: fmt.ModelDims, *, transformers_version: str = "4.57.1",
                              ignore: list[str] | None = None) -> dict:
    """config.json of an FP8_DYNAMIC GPT-OSS checkpoint as llm-compressor saves it: the BF16
    config plus ``quantization_config`` (attention, router and lm_head ignored by name)."""
    config = source_config(dims, SOURCE_BF16)
    config["transformers_version"] = transformers_version
    config["torch_dtype"] = "bfloat16"
    if ignore is None:
        ignore = [f"model.layers.{layer}.{module}" for layer in range(dims.num_hidden_layers)
                  for module in ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "self_attn.o_proj",
                                 "mlp.router")] + ["lm_head"]
    config["quantization_config"] = {
        "config_groups": {"group_0": {
            "format": "float-quantized", "input_activations": _fp8_args("token", True, None),
            "output_activations": None, "targets": ["Linear"], "weights": _fp8_args("channel", False, "minmax"),
        }},
        "format": "float-quantized", "global_compression_ratio": None, "ignore": ignore, "kv_cache_scheme": None,
        "quant_method": "compressed-tensors", "quantization_status": "compressed", "sparsity_config": {},
        "transform_config": {}, "version": COMPRESSED_TENSORS_VERSION,
    }
    return config


def quantize_fp8_channel(weight: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """compressed-tensors' FP8 channel quantization of ``weight`` [out, in]: scale ``amax / 448``
    per row in the weight's dtype (BF16), ``q = clamp(w / scale, ±448)`` as OCP E4M3."""
    amax = weight.float().abs().amax(dim=1, keepdim=True)
    scale = torch.clamp(amax / OCP_FP8_MAX, min=torch.finfo(torch.float32).eps).to(weight.dtype)
    q = (weight.float() / scale.float()).clamp(-OCP_FP8_MAX, OCP_FP8_MAX).to(FP8_DTYPE)
    return q, scale


def compressed_tensors_tensors(hf_bf16: dict[str, torch.Tensor], dims: fmt.ModelDims, *,
                               split: str = SPLIT_INTERLEAVED, nested: bool = False) -> dict[str, torch.Tensor]:
    """The tensors of an HF BF16 source linearized and quantized the way llm-compressor does:
    per-expert ``{gate,up,down}_proj.{weight, weight_scale, bias}`` (``experts.experts.E`` names
    when ``nested``), gate/up taken as even/odd columns of ``gate_up_proj`` or, for
    ``split="halves"`` (llm-compressor 0.12–0.13), as its column halves; the rest unchanged."""
    tensors = {name: value for name, value in hf_bf16.items() if ".mlp.experts." not in name}
    i = dims.intermediate_size
    for layer in range(dims.num_hidden_layers):
        fused = f"model.layers.{layer}.mlp.experts."
        gate_up, gate_up_bias = hf_bf16[fused + "gate_up_proj"], hf_bf16[fused + "gate_up_proj_bias"]
        down, down_bias = hf_bf16[fused + "down_proj"], hf_bf16[fused + "down_proj_bias"]
        for expert in range(dims.num_local_experts):
            if split == SPLIT_HALVES:
                gate, up = gate_up[expert][:, :i], gate_up[expert][:, i:]
                gate_b, up_b = gate_up_bias[expert][:i], gate_up_bias[expert][i:]
            else:
                gate, up = gate_up[expert][:, 0::2], gate_up[expert][:, 1::2]
                gate_b, up_b = gate_up_bias[expert][0::2], gate_up_bias[expert][1::2]
            prefix = f"{fused}{'experts.' if nested else ''}{expert}."
            for proj, weight, bias in (("gate_proj", gate, gate_b), ("up_proj", up, up_b),
                                       ("down_proj", down[expert], down_bias[expert])):
                q, scale = quantize_fp8_channel(weight.t().contiguous())
                tensors[f"{prefix}{proj}.weight"] = q
                tensors[f"{prefix}{proj}.weight_scale"] = scale
                tensors[f"{prefix}{proj}.bias"] = bias.clone()
    return tensors


def write_transformers_shards(root: str | os.PathLike[str], tensors: dict[str, torch.Tensor], config: dict, *,
                              shards: int = 3, overwrite: bool = False, kind: str = SOURCE) -> Path:
    """Write a checkpoint the way transformers' ``save_pretrained`` does, whole: ``config.json``,
    ``model-0000k-of-0000n.safetensors`` (metadata ``{"format": "pt"}``) and an index with
    ``total_parameters``/``total_size`` — or one ``model.safetensors`` for ``shards=1``. Every
    ``weight_scale`` goes to the last shard, so weights and their scales sit in different files.
    ``overwrite``: an earlier source of ``kind`` may be replaced."""
    with staged_output(root, overwrite=overwrite, kind=kind) as work:
        _write_transformers_shards(Path(work), tensors, config, shards=shards)
    return Path(root)


def _write_transformers_shards(root: Path, tensors: dict[str, torch.Tensor], config: dict, *, shards: int) -> None:
    (root / fmt.CONFIG_FILE).write_text(json.dumps(config, indent=2, sort_keys=True))
    if shards == 1:
        save_file({n: t.contiguous() for n, t in tensors.items()}, str(root / "model.safetensors"), metadata={"format": "pt"})
        return
    scales = sorted(name for name in tensors if name.endswith(".weight_scale"))
    groups = [*shard_groups([name for name in tensors if name not in set(scales)], shards - 1), scales]
    weight_map = {}
    for number, part in enumerate(groups, start=1):
        file_name = f"model-{number:05d}-of-{len(groups):05d}.safetensors"
        save_file({name: tensors[name].contiguous() for name in part}, str(root / file_name), metadata={"format": "pt"})
        weight_map.update(dict.fromkeys(part, file_name))
    metadata = {"total_parameters": sum(t.numel() for t in tensors.values()),
                "total_size": sum(t.numel() * t.element_size() for t in tensors.values())}
    (root / fmt.INDEX_FILE).write_text(json.dumps({"metadata": metadata, "weight_map": weight_map}, indent=2,
                                                  sort_keys=True))


def make_compressed_tensors_source(root: str | os.PathLike[str], *, dims: fmt.ModelDims = SOURCE_DIMS, seed: int = 0,
                                   split: str = SPLIT_INTERLEAVED, nested: bool = False,
                                   transformers_version: str = "4.57.1", shards: int = 3,
                                   overwrite: bool = False) -> Path:
    """A synthetic compressed-tensors FP8_DYNAMIC GPT-OSS source at ``root``, derived from the
    HF BF16 source of the same ``seed``. Variants: A (default: ``experts.E``, even/odd,
    transformers 4.x), B (``nested=True``), C (``split="halves"``, transformers 5.x), D
    (even/odd, transformers 5.x). ``overwrite`` replaces an earlier compressed-tensors source only."""
    check_source_dims(dims, SOURCE_COMPRESSED_TENSORS)
    tensors = compressed_tensors_tensors(source_tensors(dims, SOURCE_BF16, seed=check_seed(seed)), dims, split=split,
                                         nested=nested)
    return write_transformers_shards(root, tensors, compressed_tensors_config(dims, transformers_version=transformers_version),
                                     shards=shards, overwrite=overwrite, kind=SOURCE_COMPRESSED_TENSORS)


def load_source(root: str | os.PathLike[str]) -> dict[str, torch.Tensor]:
    """Every tensor of a written source (tiny sources only)."""
    from safetensors.torch import load_file

    index = json.loads((Path(root) / fmt.INDEX_FILE).read_text())
    tensors: dict[str, torch.Tensor] = {}
    for shard in sorted(set(index["weight_map"].values())):
        tensors.update(load_file(str(Path(root) / shard)))
    return tensors


# --------------------------------------------------------------------------- NxDI's legacy FP8 layout


def _interleave(chunked: torch.Tensor) -> torch.Tensor:
    """[gate | up] halves along dim 1 → rows alternating gate, up (the OpenAI layout)."""
    bits = chunked.view({1: torch.uint8, 2: torch.int16, 4: torch.int32}[chunked.element_size()])
    gate, up = bits.chunk(2, dim=1)
    return torch.stack([gate, up], dim=2).flatten(1, 2).view(chunked.dtype)


def legacy_fp8_tensors(normalized: str | os.PathLike[str]) -> dict[str, torch.Tensor]:
    """The weights of the normalized checkpoint ``normalized`` under NxDI's legacy ``block.N`` names,
    FP8 experts with per-(expert, row) scales ``mlp1_scale`` [E, 2I, 1] / ``mlp2_scale`` [E, H, 1]."""
    from ..loader import load_state_dict

    sd = load_state_dict(str(normalized), allow_custom_model=True)
    layers = json.loads((Path(normalized) / fmt.CONFIG_FILE).read_text())["num_hidden_layers"]
    t = {"embedding.weight": sd["embed_tokens.weight"], "unembedding.weight": sd["lm_head.weight"], "norm.scale": sd["norm.weight"]}
    for layer in range(layers):
        n, b = f"layers.{layer}.", f"block.{layer}."
        t |= {
            b + "attn.norm.scale": sd[n + "input_layernorm.weight"], b + "mlp.norm.scale": sd[n + "post_attention_layernorm.weight"],
            b + "attn.qkv.weight": torch.cat([sd[n + f"self_attn.{p}_proj.weight"] for p in "qkv"]),
            b + "attn.qkv.bias": torch.cat([sd[n + f"self_attn.{p}_proj.bias"] for p in "qkv"]),
            b + "attn.sinks": sd[n + "self_attn.learned_sinks.sink"],
            b + "attn.out.weight": sd[n + "self_attn.o_proj.weight"], b + "attn.out.bias": sd[n + "self_attn.o_proj.bias"],
            b + "mlp.gate.weight": sd[n + "feed_forward.moe.router.linear_router.weight"],
            b + "mlp.gate.bias": sd[n + "feed_forward.moe.router.linear_router.bias"],
            b + "mlp.mlp1_weight": _interleave(sd[n + f"{fmt.GATE_UP}.weight"].transpose(1, 2)),
            b + "mlp.mlp1_scale": _interleave(sd[n + f"{fmt.GATE_UP}.scale"].transpose(1, 2)),
            b + "mlp.mlp1_bias": _interleave(sd[n + f"{fmt.GATE_UP}.bias"]),
            b + "mlp.mlp2_weight": sd[n + f"{fmt.DOWN}.weight"].transpose(1, 2),
            b + "mlp.mlp2_scale": sd[n + f"{fmt.DOWN}.scale"].transpose(1, 2),
            b + "mlp.mlp2_bias": sd[n + f"{fmt.DOWN}.bias"],
        }
    return t


def write_legacy_fp8(out: str | os.PathLike[str], normalized: str | os.PathLike[str], *,
                     shards: int | str = 2, overwrite: bool = False) -> Path:
    """A legacy FP8 checkpoint at ``out`` holding the weights of ``normalized``, with its config
    (``overwrite``: an earlier legacy FP8 checkpoint may be replaced)."""
    config = json.loads((Path(normalized) / fmt.CONFIG_FILE).read_text())
    tensors = legacy_fp8_tensors(normalized)
    with staged_output(out, overwrite=overwrite, kind="nxdi-legacy-fp8") as work:
        _write_indexed(Path(work), tensors, config, shards=shards)
    return Path(out)


__all__ = ["EXACT_SCALE_RANGE", "PER_LAYER", "REALISTIC_SCALE_RANGE", "SOURCE_BF16", "SOURCE_COMPRESSED_TENSORS",
           "SOURCE_DIMS", "SOURCE_MXFP4", "compressed_tensors_config", "compressed_tensors_tensors",
           "legacy_fp8_tensors", "load_source", "make_compressed_tensors_source", "make_source",
           "quantize_fp8_channel", "shard_groups", "source_config", "source_tensors", "write_indexed",
           "write_legacy_fp8", "write_source", "write_transformers_shards"]
