"""The reference side of a forward check: transformers' ``GptOssForCausalLM`` on a published
source's weights (first K layers), in float32 with eager attention.

HF MXFP4 experts are decoded exactly (``mxfp4.decode``, one expert at a time) and BF16 ones
widened to float32; only the tensors of the first ``layers`` decoder layers and the global ones
(embedding, final norm, head) are read. Requires torch and transformers (imported lazily).
"""

from __future__ import annotations

import os
import re
from typing import Any

from .. import format as fmt
from ..errors import CpuModelError
from ..safeio.json_file import read_json_file

__all__ = ["reference_config", "reference_logits", "reference_model", "source_state_dict"]

_LAYER = re.compile(r"^model\.layers\.(\d+)\.")


def _transformers() -> Any:
    try:
        import transformers
    except ImportError:
        raise CpuModelError("needs transformers (GptOssForCausalLM) for the reference model: pip install 'transformers>=4.55,<5'") from None
    if not hasattr(transformers, "GptOssForCausalLM"):
        raise CpuModelError(f"transformers {transformers.__version__} has no GptOssForCausalLM: install 'transformers>=4.55,<5'")
    return transformers


def reference_config(source_config: dict[str, Any], layers: int) -> Any:
    """transformers' GptOssConfig for the first ``layers`` layers, float32, eager attention."""
    transformers = _transformers()
    values = {key: value for key, value in source_config.items() if key not in ("quantization_config", "torch_dtype", "dtype")}
    values["num_hidden_layers"] = layers
    if isinstance(values.get("layer_types"), list):
        values["layer_types"] = values["layer_types"][:layers]
    config = transformers.GptOssConfig(**values)
    config._attn_implementation = "eager"
    return config


def source_state_dict(src: str | os.PathLike[str], layers: int) -> tuple[dict[str, Any], dict[str, Any]]:
    """(config.json, float32 transformers state dict) of the first ``layers`` layers of an HF
    MXFP4 or BF16 GPT-OSS source; other layers' tensors are never read."""
    import torch

    from ..convert import SourceReader, mxfp4, open_source

    source = open_source(src)
    if not 1 <= layers <= source.dims.num_hidden_layers:
        raise ValueError(f"layers must be 1..{source.dims.num_hidden_layers}, not {layers}")
    state: dict[str, torch.Tensor] = {}
    with SourceReader(source) as reader:
        for name in sorted(source.tensors):
            match = _LAYER.match(name)
            if (match and int(match.group(1)) >= layers) or name.endswith("_scales"):
                continue
            if name.endswith("_blocks"):
                base = name[: -len("_blocks")]
                blocks, scales = reader.slice(name), reader.slice(f"{base}_scales")
                experts, rows = source.tensors[name][1].shape[:2]
                out = torch.empty((experts, source.tensors[name][1].shape[2] * mxfp4.BLOCK_SIZE, rows))
                for expert in range(experts):  # one expert at a time: [rows, K] → [K, rows]
                    out[expert] = mxfp4.decode(blocks[expert], scales[expert]).transpose(0, 1)
                state[base] = out
            else:
                state[name] = reader.get(name).to(torch.float32)
    return source.config, state


def reference_model(source_config: dict[str, Any], state: dict[str, Any], layers: int) -> Any:
    """transformers' GptOssForCausalLM holding ``state`` (assigned, not copied)."""
    import torch

    transformers = _transformers()
    config = reference_config(source_config, layers)
    with torch.device("meta"):
        model = transformers.GptOssForCausalLM(config)
    model.load_state_dict(state, strict=True, assign=True)
    # the rotary tables are buffers computed at construction, not weights: build them for real
    rotary = type(model.model.rotary_emb)
    model.model.rotary_emb = rotary(config=config)
    return model.eval()


def reference_logits(src: str | os.PathLike[str], tokens: tuple[int, ...], positions: range, layers: int | None = None) -> Any:
    """transformers' float32 logits [len(positions), V] for ``tokens`` on the first ``layers``
    layers (default: all) of the source ``src``."""
    import torch

    if layers is None:
        layers = fmt.dims_from_config(_read_config(src)).num_hidden_layers
    config, state = source_state_dict(src, layers)
    model = reference_model(config, state, layers)
    with torch.no_grad():
        logits = model(input_ids=torch.tensor([tokens], dtype=torch.int64)).logits[0]
    return logits[positions.start:positions.stop].float().clone()


def _read_config(src: str | os.PathLike[str]) -> dict[str, Any]:
    config: dict[str, Any] = read_json_file(os.path.join(os.fspath(src), fmt.CONFIG_FILE), what=fmt.CONFIG_FILE)
    return config
