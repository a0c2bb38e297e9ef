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

from ..errors import ConversionError, CpuModelError, CpuModelUnavailableError

__all__ = [
    "ExpertsOnDemand", "reference_config", "reference_kinds", "reference_logits", "reference_model", "require_reference_kind",
    "source_state_dict",
]

_LAYER = re.compile(r"^model\.layers\.(\d+)\.")
_EXPERT_WEIGHTS = (".mlp.experts.gate_up_proj", ".mlp.experts.down_proj")


def _transformers() -> Any:
    try:
        import transformers
    except ImportError:
        raise CpuModelUnavailableError("needs transformers (GptOssForCausalLM) for the reference model: pip install 'transformers>=4.55,<5'") from None
    if not hasattr(transformers, "GptOssForCausalLM"):
        raise CpuModelUnavailableError(f"transformers {transformers.__version__} has no GptOssForCausalLM: install 'transformers>=4.55,<5'")
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


class ExpertsOnDemand:
    """One expert tensor of a layer (``gate_up_proj`` or ``down_proj``, [E, K, N] in float32) that
    decodes expert ``e`` when transformers indexes it (``self.gate_up_proj[e]``, its CPU path):
    the same float32 values as the whole tensor, one expert in memory at a time."""

    def __init__(self, reader: Any, source: Any, name: str) -> None:
        self.reader, self.source, self.name = reader, source, name
        self.shape = source.tensors[name][1].shape

    def __getitem__(self, expert: Any) -> Any:
        import torch

        from ..convert import mxfp4

        index = int(expert)
        if self.name.endswith("_blocks"):
            base = self.name[: -len("_blocks")]
            decoded = mxfp4.decode(self.reader.slice(self.name)[index], self.reader.slice(f"{base}_scales")[index])
            return decoded.transpose(0, 1).contiguous()  # [rows, K] → [K, rows]
        return self.reader.slice(self.name)[index].to(torch.float32)


def _read_layer(reader: Any, source: Any, names: list[str], *, on_demand: bool = False) -> dict[str, Any]:
    """float32 tensors for ``names``: MXFP4 ``_blocks`` decoded exactly (one expert at a time,
    [rows, K] → [K, rows]) under the name without the suffix, the rest widened. With
    ``on_demand``, the expert tensors are ``ExpertsOnDemand`` instead (decoded when indexed)."""
    import torch

    from ..convert import mxfp4

    state: dict[str, Any] = {}
    for name in names:
        if name.endswith("_scales"):
            continue
        base = name[: -len("_blocks")] if name.endswith("_blocks") else name
        if on_demand and base.endswith(_EXPERT_WEIGHTS):
            state[base] = ExpertsOnDemand(reader, source, name)
        elif name.endswith("_blocks"):
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

    One decoder layer's weights are in memory at a time, and of its experts one at a time: the
    model is built on the meta device with the global tensors; a forward pre-hook reads each
    layer's weights just before it runs (one forward over all tokens runs each layer once), its
    experts as ``ExpertsOnDemand`` (transformers' CPU path indexes them expert by expert); a
    forward hook frees them after."""
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
                state = {name[len(prefix):]: value
                         for name, value in _read_layer(reader, source, names, on_demand=True).items()}
                experts = {name: state.pop(name) for name in list(state) if isinstance(state[name], ExpertsOnDemand)}
                module.load_state_dict(state, strict=False, assign=True)
                for name, tensor in experts.items():  # a plain attribute: transformers only indexes it
                    owner, _, attribute = name.rpartition(".")
                    holder = module.get_submodule(owner)
                    del holder._parameters[attribute]
                    setattr(holder, attribute, tensor)
                left = [name for name, value in module.named_parameters() if value.device.type == "meta"]
                if left:
                    raise CpuModelError(f"the source has no {prefix}{left[0]} for the reference model")

            def free(module: Any, _args: Any, _output: Any) -> None:
                module.to_empty(device="meta")
                reader.release()

            hooks += [decoder.register_forward_pre_hook(load), decoder.register_forward_hook(free)]
        with torch.no_grad():
            logits = model(input_ids=torch.tensor([tokens], dtype=torch.int64)).logits[0]
    return logits[positions.start:positions.stop].float().clone()
