"""The reference side of a forward check: transformers' ``GptOssForCausalLM`` on a published
source's weights (first K layers), in float32 with eager attention.

HF MXFP4 experts are decoded exactly (``mxfp4.decode``, one expert at a time) and BF16 ones
widened to float32; only the tensors of the first ``layers`` decoder layers and the global ones
(embedding, final norm, head) are read, one layer at a time. Other source kinds (a
compressed-tensors FP8 checkpoint) are refused before anything is read. Requires torch and
transformers (imported lazily).
"""

from __future__ import annotations

import os
import re
from typing import Any

from ..errors import ConversionError, CpuModelError

__all__ = [
    "reference_config", "reference_kinds", "reference_logits", "reference_model", "require_reference_kind",
    "source_state_dict",
]

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


def reference_kinds() -> tuple[str, ...]:
    """The source kinds the reference reads: HF MXFP4 (decoded exactly) and HF BF16."""
    from ..convert import SOURCE_BF16, SOURCE_MXFP4

    return (SOURCE_MXFP4, SOURCE_BF16)


def require_reference_kind(kind: str, src: str | os.PathLike[str]) -> None:
    """Raise ``ConversionError`` (one line) unless the reference can read a source of ``kind``."""
    if kind not in reference_kinds():
        raise ConversionError(
            f"{os.fspath(src)} is a {kind} source: the reference model reads only the published HF weights "
            f"({' or '.join(reference_kinds())}); pass --source the HF GPT-OSS checkpoint the model was published as "
            "(for a compressed-tensors conversion, the HF checkpoint it was quantized from)")


def _read_layer(reader: Any, source: Any, names: list[str]) -> dict[str, Any]:
    """float32 tensors for ``names``: MXFP4 ``_blocks`` decoded exactly (one expert at a time,
    [rows, K] → [K, rows]) under the name without the suffix, the rest widened."""
    import torch

    from ..convert import mxfp4

    state: dict[str, Any] = {}
    for name in names:
        if name.endswith("_scales"):
            continue
        if name.endswith("_blocks"):
            base = name[: -len("_blocks")]
            blocks, scales = reader.slice(name), reader.slice(f"{base}_scales")
            experts, rows = source.tensors[name][1].shape[:2]
            out = torch.empty((experts, source.tensors[name][1].shape[2] * mxfp4.BLOCK_SIZE, rows))
            for expert in range(experts):
                out[expert] = mxfp4.decode(blocks[expert], scales[expert]).transpose(0, 1)
            state[base] = out
        else:
            state[name] = reader.get(name).to(torch.float32)
    return state


def _grouped(source: Any, layers: int) -> tuple[list[str], dict[int, list[str]]]:
    """The source's global tensor names, and its tensor names of each of the first ``layers`` layers."""
    globals_, by_layer = [], {layer: [] for layer in range(layers)}
    for name in sorted(source.tensors):
        match = _LAYER.match(name)
        if match is None:
            globals_.append(name)
        elif int(match.group(1)) < layers:
            by_layer[int(match.group(1))].append(name)
    return globals_, by_layer


def source_state_dict(src: str | os.PathLike[str], layers: int) -> tuple[dict[str, Any], dict[str, Any]]:
    """(config.json, float32 transformers state dict) of the first ``layers`` layers of an HF
    MXFP4 or BF16 GPT-OSS source; other layers' tensors are never read."""
    from ..convert import SourceReader, open_source

    source = open_source(src)
    require_reference_kind(source.kind, src)
    if not 1 <= layers <= source.dims.num_hidden_layers:
        raise ValueError(f"layers must be 1..{source.dims.num_hidden_layers}, not {layers}")
    globals_, by_layer = _grouped(source, layers)
    with SourceReader(source) as reader:
        state = _read_layer(reader, source, globals_ + [name for names in by_layer.values() for name in names])
    return source.config, state


def reference_model(source_config: dict[str, Any], state: dict[str, Any], layers: int, *, strict: bool = True) -> Any:
    """transformers' GptOssForCausalLM holding ``state`` (assigned, not copied); with ``strict``
    False, what ``state`` lacks stays on the meta device."""
    import torch

    transformers = _transformers()
    config = reference_config(source_config, layers)
    with torch.device("meta"):
        model = transformers.GptOssForCausalLM(config)
    model.load_state_dict(state, strict=strict, assign=True)
    # the rotary tables are buffers computed at construction, not weights: build them for real
    rotary = type(model.model.rotary_emb)
    model.model.rotary_emb = rotary(config=config)
    return model.eval()


def reference_logits(src: str | os.PathLike[str], tokens: tuple[int, ...], positions: range, layers: int | None = None) -> Any:
    """transformers' float32 logits [len(positions), V] for ``tokens`` on the first ``layers``
    layers (default: all) of the source ``src``.

    One decoder layer's weights are in memory at a time: the model is built on the meta device
    with the global tensors, and a forward pre-hook reads each layer's weights just before it
    runs (one forward over all tokens runs each layer once); a forward hook frees them after."""
    import torch

    from ..convert import SourceReader, open_source

    source = open_source(src)
    require_reference_kind(source.kind, src)
    if layers is None:
        layers = source.dims.num_hidden_layers
    if not 1 <= layers <= source.dims.num_hidden_layers:
        raise ValueError(f"layers must be 1..{source.dims.num_hidden_layers}, not {layers}")
    globals_, by_layer = _grouped(source, layers)
    with SourceReader(source) as reader:
        model = reference_model(source.config, _read_layer(reader, source, globals_), layers, strict=False)
        reader.release()
        hooks = []
        for index, decoder in enumerate(model.model.layers):
            prefix = f"model.layers.{index}."

            def load(module: Any, _args: Any, names: list[str] = by_layer[index], prefix: str = prefix) -> None:
                state = {name[len(prefix):]: value for name, value in _read_layer(reader, source, names).items()}
                reader.release()
                module.load_state_dict(state, strict=True, assign=True)

            def free(module: Any, _args: Any, _output: Any) -> None:
                module.to_empty(device="meta")

            hooks += [decoder.register_forward_pre_hook(load), decoder.register_forward_hook(free)]
        with torch.no_grad():
            logits = model(input_ids=torch.tensor([tokens], dtype=torch.int64)).logits[0]
    return logits[positions.start:positions.stop].float().clone()
