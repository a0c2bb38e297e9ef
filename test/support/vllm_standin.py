"""Just enough of vLLM to run the NxDI-backed vllm-neuron's own model loader from a checkout.

``VLLM_NEURON_SRC`` points at a checkout of vllm-project/vllm-neuron at a release tag; the
loader (``vllm_neuron/worker/neuronx_distributed_model_loader.py``) is imported from it unchanged.
What it imports from vLLM is stood in here, minimally, with the fields it reads: the config
classes, ``LogitsProcessor``, ``Sampler``, ``SamplerOutput``. ``serve(argv)`` is what ``vllm serve``
does before the loader, for the flags the vLLM recipe (docs/serving.md) uses: the engine's argument parsing,
vLLM loading its general plugins (our entry point, by the name ``setup.py`` declares), the HF
config read with transformers, and vllm-neuron's platform defaults (``check_and_update_config``:
chunked prefill off, ``max_num_batched_tokens`` 131072, ``block_size = max_model_len`` without
prefix caching); then the runner's ``get_neuron_model`` call with the same arguments.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib.util
import json
import os
import re
import sys
import types
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

SRC_ENV = "VLLM_NEURON_SRC"
LOADER = "vllm_neuron.worker.neuronx_distributed_model_loader"
REPO = Path(__file__).resolve().parents[2]


@dataclass
class ModelConfig:
    model: str
    hf_config: Any
    dtype: Any
    max_model_len: int


@dataclass
class CacheConfig:
    block_size: int
    enable_prefix_caching: bool = False
    num_gpu_blocks_override: int | None = None


@dataclass
class ParallelConfig:
    tensor_parallel_size: int = 1


@dataclass
class SchedulerConfig:
    max_num_seqs: int
    max_model_len: int
    max_num_batched_tokens: int
    chunked_prefill_enabled: bool = False


@dataclass
class SpeculativeConfig:
    num_speculative_tokens: int = 0


class LogitsProcessor(torch.nn.Module):
    def __init__(self, vocab_size: int, logits_as_input: bool = False) -> None:
        super().__init__()
        self.vocab_size = vocab_size


class Sampler(torch.nn.Module):
    pass


@dataclass
class SamplerOutput:
    sampled_token_ids: Any = None


def _modules() -> dict[str, types.ModuleType]:
    modules: dict[str, types.ModuleType] = {}
    contents: dict[str, dict[str, Any]] = {
        "vllm": {}, "vllm.config": {"ModelConfig": ModelConfig, "CacheConfig": CacheConfig, "ParallelConfig": ParallelConfig,
                                    "SchedulerConfig": SchedulerConfig, "SpeculativeConfig": SpeculativeConfig},
        "vllm.model_executor": {}, "vllm.model_executor.layers": {},
        "vllm.model_executor.layers.logits_processor": {"LogitsProcessor": LogitsProcessor},
        "vllm.model_executor.layers.sampler": {"Sampler": Sampler},  # 0.1.0
        "vllm.v1": {}, "vllm.v1.outputs": {"SamplerOutput": SamplerOutput}, "vllm.v1.sample": {},
        "vllm.v1.sample.sampler": {"Sampler": Sampler},  # 0.2.0
    }
    for name, attrs in contents.items():
        module = types.ModuleType(name)
        module.__path__ = []  # type: ignore[attr-defined]
        module.__dict__.update(attrs)
        modules[name] = module
    return modules


@contextlib.contextmanager
def loader(src: str) -> Iterator[types.ModuleType]:
    """vllm-neuron's own loader module from ``src``, with vLLM stood in; ``sys.modules`` restored after."""
    before = dict(sys.modules)
    package = Path(src) / "vllm_neuron"
    if not (package / "worker" / "neuronx_distributed_model_loader.py").is_file():
        raise FileNotFoundError(f"{SRC_ENV}={src} has no vllm_neuron/worker/neuronx_distributed_model_loader.py")
    sys.modules.update(_modules())
    for name, path in (("vllm_neuron", package), ("vllm_neuron.worker", package / "worker")):
        module = types.ModuleType(name)  # the packages without their __init__ (platform registration)
        module.__path__ = [str(path)]  # type: ignore[attr-defined]
        sys.modules[name] = module
    try:
        spec = importlib.util.spec_from_file_location(LOADER, package / "worker" / "neuronx_distributed_model_loader.py")
        assert spec is not None and spec.loader is not None
        module = importlib.util.module_from_spec(spec)
        sys.modules[LOADER] = module
        spec.loader.exec_module(module)
        yield module
    finally:
        for name in set(sys.modules) - set(before):
            if name.startswith(("vllm", "vllm_neuron")):
                del sys.modules[name]
        sys.modules.update({k: v for k, v in before.items() if k.startswith(("vllm", "vllm_neuron"))})


def _entry_point() -> Any:
    """Our ``vllm.general_plugins`` entry point, by the name ``setup.py`` declares."""
    text = (REPO / "setup.py").read_text()
    match = re.search(r'"vllm\.general_plugins":\s*\[\s*"[^"=]+?\s*=\s*([\w.]+):(\w+)"', text)
    assert match, "setup.py declares no vllm.general_plugins entry point"
    return getattr(importlib.import_module(match.group(1)), match.group(2))


def entry_point_name() -> str:
    """The name ``setup.py`` gives our ``vllm.general_plugins`` entry point (what ``VLLM_PLUGINS`` lists)."""
    match = re.search(r'"vllm\.general_plugins":\s*\[\s*"([^"=]+?)\s*=', (REPO / "setup.py").read_text())
    assert match, "setup.py declares no vllm.general_plugins entry point"
    return match.group(1)


def plugin_allowed(name: str) -> bool:
    """vLLM's ``load_general_plugins`` filter: every plugin when ``VLLM_PLUGINS`` is unset, else
    only those its comma-separated value names, exactly."""
    allowed = os.environ.get("VLLM_PLUGINS")
    return allowed is None or name in allowed.split(",")


def _flexible(argv: Sequence[str]) -> list[str]:
    """What vLLM's ``FlexibleArgumentParser`` does to the words first: ``_`` → ``-`` in a long
    option's name (up to its first ``.``, before any ``=``)."""
    words = []
    for word in argv:
        if word.startswith("--"):
            name, eq, value = word.partition("=")
            head, dot, tail = name.partition(".")
            word = head.replace("_", "-") + dot + tail + eq + value
        words.append(word)
    return words


def parse_serve(argv: Sequence[str]) -> argparse.Namespace:
    """``vllm serve``'s arguments, for the flags the recipe uses (the same names and defaults)."""
    parser = argparse.ArgumentParser(prog="vllm serve")
    parser.add_argument("model_tag", nargs="?")  # `vllm serve MODEL`; the api_server module takes --model only
    parser.add_argument("--model")
    parser.add_argument("--tensor-parallel-size", "-tp", type=int, default=1)
    parser.add_argument("--trust-remote-code", action="store_true")
    parser.add_argument("--max-model-len", type=int)
    parser.add_argument("--max-num-seqs", type=int)
    parser.add_argument("--dtype", default="auto")
    parser.add_argument("--enable-prefix-caching", action=argparse.BooleanOptionalAction, default=True)
    parser.add_argument("--block-size", type=int)
    parser.add_argument("--additional-config", type=json.loads, default={})
    parser.add_argument("--port", type=int)
    args = parser.parse_args(_flexible(argv))
    if args.model_tag is not None:  # the positional wins, as `vllm serve` has it
        args.model = args.model_tag
    if args.model is None:
        parser.error("no model")
    return args


def serve(loader_module: types.ModuleType, argv: Sequence[str], *, plugins: bool = True) -> Any:
    """``vllm serve ARGV`` up to and including the model load; returns the loaded NeuronCausalLM."""
    from transformers import AutoConfig

    if plugins and plugin_allowed(entry_point_name()):
        _entry_point()()  # vLLM's load_general_plugins() in this process
    args = parse_serve(argv)
    hf_config = AutoConfig.from_pretrained(args.model)  # a Hub id would be looked up by transformers
    max_model_len = args.max_model_len or hf_config.max_position_embeddings
    model_config = ModelConfig(args.model, hf_config, args.dtype if args.dtype != "auto" else hf_config.torch_dtype,
                               max_model_len)
    # vllm-neuron's platform: its scheduler, chunked prefill off, block size = max_model_len w/o prefix caching
    cache_config = CacheConfig(block_size=args.block_size or 32, enable_prefix_caching=args.enable_prefix_caching)
    if not cache_config.enable_prefix_caching:
        cache_config.block_size = max_model_len
    scheduler_config = SchedulerConfig(max_num_seqs=args.max_num_seqs or 32, max_model_len=max_model_len,
                                       max_num_batched_tokens=131072, chunked_prefill_enabled=False)
    return loader_module.get_neuron_model(
        model_config, cache_config=cache_config, parallel_config=ParallelConfig(args.tensor_parallel_size),
        scheduler_config=scheduler_config, lora_serving_config=None, speculative_config=None,
        additional_config=args.additional_config)


def source() -> str | None:
    value = os.environ.get(SRC_ENV)
    return value or None


__all__ = ["LOADER", "SRC_ENV", "entry_point_name", "loader", "parse_serve", "plugin_allowed", "serve", "source"]
