"""NxDI's model in CPU mode with one decoder layer's expert weights in memory at a time.

In CPU mode NxDI builds every expert linear in float32 (4 bytes per weight, for every layer at
once) before NxD's quantization ``convert()`` replaces them by FP8 ones, and then holds every
layer's FP8 experts (twice while loading: NxD's sharded copy and the parameter). At gpt-oss-20b
shapes that is about 3 GiB per layer; one gpt-oss-120b layer alone is 12.7 GB of float32.
Here, for one application object and one run:

* the expert linears are built on the ``meta`` device (no storage; NxD supports it and skips
  their initialisation), so ``convert()`` makes meta FP8 modules; their small tensors (scales,
  biases) get real storage and are loaded by ``to_cpu()`` as before;
* the expert weights are taken out of the state dict NxDI's ``checkpoint_loader_fn`` returns
  (views into the checkpoint's mapped shards: no copy) and kept aside;
* a forward pre-hook on each decoder layer shards that layer's weights with NxD's own
  ``shard_children`` (as ``get_sharded_checkpoint`` would) and puts them in; a forward hook
  takes them out again and drops the mapped pages from this process's resident set (they stay
  in the page cache).

So memory holds one layer's experts whatever the number of layers; each forward of a layer
costs one copy of its FP8 weights from the page cache. Every tensor given storage is checked to
be loaded: a key NxDI's loader does not provide is an error, not an uninitialised weight.
"""

from __future__ import annotations

import contextlib
import ctypes
import mmap
import re
import sys
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from ..errors import CpuModelError
from ..machine import file_mapped
from ..units import plural

__all__ = ["HeldWeight", "LayerExperts", "expert_linears_on_meta", "quantized_one_layer_at_a_time", "release_pages"]

_LAYER = re.compile(r"^layers\.(\d+)\.")
_MADV_DONTNEED = 4


@contextlib.contextmanager
def expert_linears_on_meta() -> Iterator[None]:
    """While NxDI builds its model, NxD's expert linears (``ExpertFused{Column,Row}ParallelLinear``)
    are created on the ``meta`` device instead of the CPU."""
    import torch
    from neuronx_distributed.modules.moe import moe_parallel_layers as layers

    classes = (layers.ExpertFusedColumnParallelLinear, layers.ExpertFusedRowParallelLinear)
    originals = {cls: cls.__init__ for cls in classes}

    def on_meta(init: Any) -> Any:
        def build(self: Any, *args: Any, **kwargs: Any) -> None:
            device = kwargs.get("device")
            if device is None or torch.device(device).type == "cpu":
                kwargs["device"] = torch.device("meta")
            init(self, *args, **kwargs)

        return build

    for cls, init in originals.items():
        cls.__init__ = on_meta(init)
    try:
        yield
    finally:
        for cls, init in originals.items():
            cls.__init__ = init


@dataclass
class HeldWeight:
    """One expert weight kept out of the model: its module, key, meta parameter and checkpoint tensor."""

    module: Any
    name: str
    key: str
    meta: Any
    tensor: Any = None


@dataclass
class LayerExperts:
    """The expert weights of one built model, put in and taken out one decoder layer at a time."""

    root: Any
    held: dict[str, HeldWeight] = field(default_factory=dict)
    materialized: list[str] = field(default_factory=list)
    hooks: list[Any] = field(default_factory=list)

    @classmethod
    def prepare(cls, root: Any) -> LayerExperts:
        """Give every meta tensor of ``root`` but the expert weights storage (NaN-filled until
        loaded); record the expert weights to hold back."""
        import torch

        experts = cls(root)
        for module_name, module in root.named_modules():
            for name, param in list(module.named_parameters(recurse=False)):
                if param.device.type != "meta":
                    continue
                key = f"{module_name}.{name}" if module_name else name
                if name == "weight" and _LAYER.match(key):
                    # out of the module while to_cpu() shards and loads: NxD's quantized layers
                    # look their weight up in the state dict and refuse a missing one
                    experts.held[key] = HeldWeight(module, name, key, module._parameters.pop(name))
                    continue
                real = torch.empty(param.shape, dtype=param.dtype, device="cpu")
                real.view(torch.uint8).fill_(0xFF)  # NaN in every float dtype, FP8 included
                replacement = torch.nn.Parameter(real, requires_grad=False)
                replacement.__dict__.update(param.__dict__)
                module._parameters[name] = replacement
                experts.materialized.append(key)
        for module_name, module in root.named_modules():
            for name, buffer in module.named_buffers(recurse=False):
                if buffer.device.type == "meta":
                    raise CpuModelError(f"NxDI's model has a buffer {module_name}.{name} on the meta device: "
                                        "it cannot be built one layer at a time")
        return experts

    def take_from(self, state_dict: dict[str, Any]) -> None:
        """Move the held keys' tensors out of NxDI's loaded ``state_dict``."""
        missing = [key for key in self.held if key not in state_dict]
        if missing:
            raise CpuModelError(f"NxDI's loader gave no {missing[0]} ({plural(len(missing), 'expert weight')} missing)")
        for key, weight in self.held.items():
            weight.tensor = state_dict.pop(key)

    def check_loadable(self, state_dict: dict[str, Any]) -> None:
        """Every tensor given storage must be in the state dict ``to_cpu()`` loads."""
        missing = [key for key in self.materialized if key not in state_dict]
        if missing:
            raise CpuModelError(f"NxDI's loader gave no {missing[0]}: it would stay uninitialised "
                                f"({plural(len(missing), 'tensor')} missing)")

    def install(self, layers: Any, rank: int, tp_degree: int, dtype: Any) -> None:
        """Forward hooks on each decoder layer of ``layers`` (NxDI's ``model.layers``); the held
        weights go back into their modules on the meta device (computing with one fails loudly)."""
        by_layer: dict[int, list[HeldWeight]] = {}
        for key, weight in self.held.items():
            weight.module._parameters[weight.name] = weight.meta
            match = _LAYER.match(key)
            assert match is not None
            by_layer.setdefault(int(match.group(1)), []).append(weight)
        if set(by_layer) - set(range(len(layers))):
            raise CpuModelError(f"expert weights of layers {sorted(set(by_layer) - set(range(len(layers))))} "
                                f"have no decoder layer among the model's {len(layers)}")
        for index, weights in by_layer.items():
            def put_in(_module: Any, _args: Any, weights: list[HeldWeight] = weights) -> None:
                for weight in weights:
                    _swap_in(weight, rank, tp_degree, dtype)

            def take_out(_module: Any, _args: Any, _output: Any, weights: list[HeldWeight] = weights) -> None:
                for weight in weights:
                    weight.module._parameters[weight.name] = weight.meta
                    release_pages(weight.tensor)

            self.hooks += [layers[index].register_forward_pre_hook(put_in),
                           layers[index].register_forward_hook(take_out)]

    def remove(self) -> None:
        for hook in self.hooks:
            hook.remove()
        self.hooks.clear()


@contextlib.contextmanager
def quantized_one_layer_at_a_time(app: Any, tp_degree: int) -> Iterator[None]:
    """While ``app.to_cpu()`` runs in this context: each wrapper's module is built through NxDI's
    ``DecoderModelInstance.load_module()`` (NxD's quantization ``convert()``, which to_cpu skips)
    with the expert linears on meta; the expert weights are taken out of what
    ``checkpoint_loader_fn`` returns; every other tensor given storage must be loaded (and its
    mapped pages are dropped once copied). On leaving, the per-layer hooks are installed."""
    import torch
    from neuronx_distributed_inference.models.model_wrapper import DecoderModelInstance

    originals = [(wrapper, wrapper.model_cls) for wrapper in app.models]
    built: list[LayerExperts] = []

    def build(model_cls: type) -> Any:
        def make(config: Any) -> Any:
            instance = DecoderModelInstance(model_cls, config)
            with expert_linears_on_meta():
                instance.load_module()
            experts = LayerExperts.prepare(instance.module)
            built.append(experts)
            load = instance.module.load_state_dict

            def load_checked(state_dict: Any, *args: Any, **kwargs: Any) -> Any:
                experts.check_loadable(state_dict)
                result = load(state_dict, *args, **kwargs)
                for tensor in state_dict.values():  # copied into the parameters: drop the mapped pages
                    release_pages(tensor)
                return result

            instance.module.load_state_dict = load_checked
            return instance.module

        return make

    def loader(*args: Any, **kwargs: Any) -> Any:
        state_dict = type(app).checkpoint_loader_fn(app, *args, **kwargs)
        if built:  # to_cpu builds a module, then loads its weights
            built[-1].take_from(state_dict)
        return state_dict

    for wrapper, model_cls in originals:
        wrapper.model_cls = build(model_cls)
    app.checkpoint_loader_fn = loader
    try:
        yield
        rank = torch.distributed.get_rank() if torch.distributed.is_initialized() else 0
        for experts in built:
            dtype = getattr(getattr(experts.root, "config", None), "torch_dtype", None)
            experts.install(experts.root.layers, rank, tp_degree, dtype)
            del experts.root.load_state_dict
    finally:
        for wrapper, model_cls in originals:
            wrapper.model_cls = model_cls
        del app.checkpoint_loader_fn


def _swap_in(weight: HeldWeight, rank: int, tp_degree: int, dtype: Any) -> None:
    """Shard the weight for this rank with NxD's ``shard_children`` (what ``get_sharded_checkpoint``
    does for every parameter) and make it the module's parameter."""
    import torch
    from neuronx_distributed.trace.trace import shard_children

    # shard_children reads the sharding attributes of the module's parameter (the meta one) and
    # looks up every parameter of the module: the others (loaded, sharded already) step aside
    params = weight.module._parameters
    order = list(params)
    others = {name: params.pop(name) for name in order if name != weight.name}
    params[weight.name] = weight.meta
    checkpoint = {weight.name: weight.tensor}
    try:
        shard_children(weight.module, checkpoint, "", dtype, rank, tp_degree)
    finally:
        restored = {**others, weight.name: weight.meta}
        params.clear()
        params.update({name: restored[name] for name in order})
    local = checkpoint[weight.name].contiguous()
    if local.data_ptr() != weight.tensor.data_ptr():
        release_pages(weight.tensor)  # copied: the mapped pages need not stay while the layer runs  # as load_state_dict would leave it: the layout decides the rounding order
    if local.dtype != weight.meta.dtype:
        raise CpuModelError(f"{weight.key} is {local.dtype} in the checkpoint; NxDI's module holds {weight.meta.dtype}")
    replacement = torch.nn.Parameter(local, requires_grad=False)
    replacement.__dict__.update(weight.meta.__dict__)
    weight.module._parameters[weight.name] = replacement


def release_pages(tensor: Any) -> None:
    """Drop the whole pages of a file-mapped tensor from this process's resident set (``madvise
    MADV_DONTNEED``); nothing writes to them, and they fault back in from the page cache. Only
clean pages of a file may be dropped and read again: anonymous memory is left alone."""
    if tensor is None or not sys.platform.startswith("linux") or tensor.numel() == 0:
        return
    start = tensor.data_ptr()
    end = start + tensor.numel() * tensor.element_size()
    first, last = -(-start // mmap.PAGESIZE) * mmap.PAGESIZE, end // mmap.PAGESIZE * mmap.PAGESIZE
    if last > first and file_mapped(first):
        ctypes.CDLL(None, use_errno=True).madvise(ctypes.c_void_p(first), ctypes.c_size_t(last - first),
                                                  ctypes.c_int(_MADV_DONTNEED))
