"""The reference NxDI's accuracy check compares the device with: transformers' ``GptOssForCausalLM``,
built for ``load_hf_model`` and ``goldens`` (docs/accuracy.md).

Two references, chosen explicitly (``format.REFERENCE_ENV`` / ``REFERENCE_ATTR``):

* ``dequantized``: the normalized checkpoint itself — every FP8 expert value × its row scale
  (``convert.fp8.dequantize_expertwise``), the padding cropped, gate/up brought back to
  transformers' interleaved layout (``convert.layout.interleave_chunked``), the names mapped back
  (``convert.source.non_expert_names``). The device is then measured against exactly the numbers
  it holds.
* a path to the HF source the checkpoint was converted from (MXFP4 or BF16, read as
  ``forward.reference`` reads it for ``check-forward``), accepted only when its fingerprint is the
  one the checkpoint's index records; a compressed-tensors source is refused.

The host's memory is checked first (``memory.reference_memory``), then the model is built on the
meta device and filled one decoder layer at a time, one expert at a time: never an FP8 and a
BF16 copy of the whole model at once (the checkpoint's shards are mapped, and each layer's pages
leave this process's resident set once copied). Requires torch and transformers.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import torch

from .. import format as fmt
from ..errors import ConversionError, CpuModelError
from ..units import format_bytes, plural

__all__ = ["REFERENCE_DTYPES", "ReferenceBuild", "build_reference", "dequantized_layer", "reference_dtype", "renamed_tensors"]

REFERENCE_DTYPES = {"bfloat16": torch.bfloat16, "float32": torch.float32}
_EXPERT_SHORT = ("gate_up_proj", "gate_up_proj_bias", "down_proj", "down_proj_bias")
MEMORY_FIX = ("build it on a host with that much free memory: `nxdi-gptoss-fp8 goldens` runs on any big-memory CPU "
              "host and writes the file --expected-outputs-path reads (docs/accuracy.md)")


@dataclass
class ReferenceBuild:
    """A built reference: the model, what it was built from, and what building it cost."""

    model: Any
    reference: str  # "dequantized", or the source path
    kind: str  # "dequantized", or the source's kind (hf-mxfp4, hf-bf16)
    dtype: str
    memory: str  # the need stated before building, and what the host offered
    model_bytes: int = 0
    layer_s: list[float] = field(default_factory=list)
    build_s: float = 0.0

    def to_dict(self) -> dict[str, Any]:
        return {"reference": self.reference, "kind": self.kind, "dtype": self.dtype, "memory": self.memory,
                "model_bytes": self.model_bytes, "layers": len(self.layer_s),
                "layer_s": [round(s, 4) for s in self.layer_s], "build_s": round(self.build_s, 3)}

    def describe(self) -> str:
        per_layer = sum(self.layer_s) / len(self.layer_s) if self.layer_s else 0.0
        return (f"{self.kind} reference ({self.dtype}, {format_bytes(self.model_bytes)}) built in {self.build_s:.1f} s, "
                f"{per_layer:.2f} s a layer")


def reference_dtype(value: Any) -> torch.dtype:
    """``bfloat16`` (the default: twice the FP8 bytes) or ``float32``, as a name or a torch dtype."""
    if value is None:
        return torch.bfloat16
    if isinstance(value, torch.dtype) and value in REFERENCE_DTYPES.values():
        return value
    if isinstance(value, str) and value.removeprefix("torch.") in REFERENCE_DTYPES:
        return REFERENCE_DTYPES[value.removeprefix("torch.")]
    raise ValueError(f"reference dtype {value!r} is not one of {', '.join(REFERENCE_DTYPES)}")


def _empty_model(config: Mapping[str, Any], layers: int, dtype: torch.dtype) -> Any:
    from .reference import reference_model

    model = reference_model(dict(config), {}, layers, strict=False)  # on meta; rotary tables real
    model.config.dtype = dtype
    return model


def _fill(model: Any, state: Mapping[str, torch.Tensor]) -> None:
    model.load_state_dict(state, strict=False, assign=True)


def _finished(model: Any, what: str) -> Any:
    left = [name for name, value in model.named_parameters() if value.device.type == "meta"]
    if left:
        raise CpuModelError(f"{what} gave no {left[0]} for the reference model ({plural(len(left), 'parameter')} missing)")
    return model.eval()


def renamed_tensors(stored: Mapping[str, torch.Tensor], dims: fmt.ModelDims, dtype: torch.dtype, *,
                    layer: int | None) -> dict[str, torch.Tensor]:
    """transformers' tensors that the format only renames and pads, in ``dtype`` (copies, the
    padding cropped), from the normalized tensors ``stored``: decoder layer ``layer``'s attention,
    norms and router, or (``None``) the embedding, the final norm and the head."""
    from ..convert.layout import crop_to
    from ..convert.source import non_expert_names

    unpadded = fmt.expected_namespace(fmt.Layout.unpadded(dims))
    wanted = (lambda name: name.startswith(fmt.layer_prefix(layer))) if layer is not None else (
        lambda name: not name.startswith("layers."))
    return {hf: crop_to(stored[name], unpadded[name].shape).to(dtype, copy=True)
            for hf, name in non_expert_names(dims).items() if wanted(name)}


def dequantized_layer(stored: Mapping[str, torch.Tensor], layer: int, dims: fmt.ModelDims,
                      dtype: torch.dtype) -> dict[str, torch.Tensor]:
    """transformers' tensors of decoder layer ``layer`` in ``dtype`` from the normalized tensors
    ``stored`` (NxDI names): FP8 × scale one expert at a time, padding cropped, gate/up interleaved."""
    from ..convert.fp8 import dequantize_expertwise
    from ..convert.layout import crop_to, interleave_chunked
    from ..convert.source import expert_source_name

    prefix = fmt.layer_prefix(layer)
    state = renamed_tensors(stored, dims, dtype, layer=layer)
    experts, h, i = dims.num_local_experts, dims.hidden_size, dims.intermediate_size
    gate_up, down = f"{prefix}{fmt.GATE_UP}", f"{prefix}{fmt.DOWN}"
    gate_up_out = torch.empty((experts, h, 2 * i), dtype=dtype)
    down_out = torch.empty((experts, i, h), dtype=dtype)
    for expert in range(experts):
        values = dequantize_expertwise(stored[f"{gate_up}.weight"][expert, :h], stored[f"{gate_up}.scale"][expert])
        gate_up_out[expert] = interleave_chunked(values, i)
        values = dequantize_expertwise(stored[f"{down}.weight"][expert, :i], stored[f"{down}.scale"][expert])
        down_out[expert] = values[:, :h]
        _release((stored[f"{gate_up}.weight"][expert], stored[f"{down}.weight"][expert]))  # mapped pages, once read
    biases = (interleave_chunked(stored[f"{gate_up}.bias"], i), crop_to(stored[f"{down}.bias"], (experts, h)))
    for short, value in zip(_EXPERT_SHORT, (gate_up_out, biases[0], down_out, biases[1]), strict=True):
        state[expert_source_name(layer, short)] = value.to(dtype)
    return state


def _release(tensors: Any) -> None:
    from .layer_experts import release_pages

    for tensor in tensors:
        release_pages(tensor)


def _build_dequantized(ckpt: str, dims: fmt.ModelDims, config: Mapping[str, Any], dtype: torch.dtype,
                       build: ReferenceBuild, report: Any, allow_custom_model: bool, tick: Callable[[], None]) -> Any:
    from ..convert.source import non_expert_names
    from ..loader import load_checkpoint

    stored = load_checkpoint(ckpt, None, report=report, allow_custom_model=allow_custom_model).state_dict
    model = _empty_model(config, dims.num_hidden_layers, dtype)
    global_names = {hf: name for hf, name in non_expert_names(dims).items() if not name.startswith("layers.")}
    _fill(model, renamed_tensors(stored, dims, dtype, layer=None))
    _release(stored[name] for name in global_names.values())  # copied: the embedding's and head's pages may go
    for layer in range(dims.num_hidden_layers):
        started = time.perf_counter()
        _fill(model, dequantized_layer(stored, layer, dims, dtype))
        _release(value for name, value in stored.items() if name.startswith(fmt.layer_prefix(layer)))
        build.layer_s.append(time.perf_counter() - started)
        tick()
    _release(stored.values())
    return _finished(model, ckpt)


def check_recorded_source(ckpt: str, src: str, option: str) -> Any:
    """The source at ``src`` (``convert.open_source``) when the reference can read its kind and it
    is the one ``ckpt``'s index records (its fingerprint); ``ConversionError`` (one line) otherwise."""
    from ..convert import open_source
    from ..convert.verify import recorded_source, source_mismatch_hint
    from .reference import require_reference_kind

    recorded = recorded_source(ckpt)
    if not isinstance(recorded.get("fingerprint"), dict):
        raise ConversionError(f"{ckpt}'s index records no source fingerprint, so {src} cannot be checked to be the "
                              f"source it was converted from: use {option}=dequantized, or re-convert the source")
    source = open_source(src)
    require_reference_kind(source.kind, src)
    hint = source_mismatch_hint(recorded, source, src, out=ckpt, option=option)
    if hint:
        raise ConversionError(hint.removeprefix("hint: "))
    return source


def _build_source(source: Any, dtype: torch.dtype, build: ReferenceBuild, tick: Callable[[], None]) -> Any:
    from ..convert import SourceReader
    from .reference import ExpertsOnDemand, _grouped, _read_layer

    layers = source.dims.num_hidden_layers
    globals_, by_layer = _grouped(source, layers)
    with SourceReader(source) as reader:
        model = _empty_model(source.config, layers, dtype)
        _fill(model, {name: value.to(dtype) for name, value in _read_layer(reader, source, globals_).items()})
        reader.release()
        for layer in range(layers):
            started = time.perf_counter()
            state = {}
            for name, value in _read_layer(reader, source, by_layer[layer], on_demand=True).items():
                if isinstance(value, ExpertsOnDemand):  # decoded one expert at a time into the model's dtype
                    first = value[0]
                    out = torch.empty((value.shape[0], *first.shape), dtype=dtype)
                    out[0] = first
                    for expert in range(1, value.shape[0]):
                        out[expert] = value[expert]
                    value = out
                state[name] = value.to(dtype)
            _fill(model, state)
            reader.release()
            build.layer_s.append(time.perf_counter() - started)
            tick()
    return _finished(model, source.root)


def build_reference(ckpt: str | os.PathLike[str], reference: str, *, dtype: Any = None,
                    allow_custom_model: bool = False, option: str = fmt.REFERENCE_ENV,
                    available: tuple[int | None, str] | None = None, progress: bool | None = False,
                    say: Callable[[str], None] | None = None) -> ReferenceBuild:
    """transformers' ``GptOssForCausalLM`` for the normalized checkpoint ``ckpt``: ``reference``
    is ``dequantized`` or the path of its HF source (``option`` names the setting in messages).

    Preflights ``ckpt`` (``PreflightError``); refuses (``ConversionError``, one line) a source
    that is not the recorded one or that the reference cannot read; states the memory it needs
    (``say``) and refuses (``CpuModelError``) a host that offers less. Example::

        model = build_reference("/data/gpt-oss-120b-fp8", "dequantized").model
    """
    from ..progress import Progress
    from ..validate.pipeline import preflight
    from .memory import reference_memory, require_memory

    ckpt = os.fspath(ckpt)
    torch_dtype = reference_dtype(dtype)
    report = preflight(ckpt, allow_custom_model=allow_custom_model)
    report.raise_if_failed()
    dims, config = report.view.dims, report.view.config
    source = None if reference == fmt.REFERENCE_DEQUANTIZED else check_recorded_source(ckpt, reference, option)
    need = reference_memory(dims, torch_dtype.itemsize)
    memory = require_memory(need.total, need.render(), MEMORY_FIX, available)
    if say is not None:
        say(f"reference {reference}: {memory}")
    name = str(torch_dtype).removeprefix("torch.")
    build = ReferenceBuild(None, reference, source.kind if source is not None else fmt.REFERENCE_DEQUANTIZED, name, memory,
                           model_bytes=need.model)
    started = time.perf_counter()
    with Progress(dims.num_hidden_layers, f"reference ({build.kind})", unit="layer", show=progress) as bar:
        def tick() -> None:
            bar.update(1)

        if source is None:
            build.model = _build_dequantized(ckpt, dims, config, torch_dtype, build, report, allow_custom_model, tick)
        else:
            build.model = _build_source(source, torch_dtype, build, tick)
    build.build_s = time.perf_counter() - started
    return build
