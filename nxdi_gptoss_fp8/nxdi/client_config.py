"""The NeuronConfig a vLLM start hands NxDI, and vllm-neuron's own refusals of it.

Where vllm-neuron is installed (a serving host), it is built by vllm-neuron's own functions — the
ones its ``get_neuron_model`` calls (``_get_default_neuron_config``,
``_get_neuron_config_after_override``, ``_handle_pa_num_blocks`` from 0.2.0,
``_validate_neuron_config``), without compiling or loading — and the verdict follows that
release. Elsewhere (a CPU host) it is the package's model of them (``validate.vllm_config``),
evaluated for both releases the package is tested with (``CLIENT_RELEASES``): a rule only one of
them has is named with its release. ``ClientStart.built_by`` says which was used.
"""

from __future__ import annotations

import copy
import importlib
import importlib.metadata
import sys
from collections.abc import Mapping
from dataclasses import dataclass
from types import SimpleNamespace
from typing import Any

from ..deps import importable
from ..errors import ConfigError
from ..validate.vllm_config import (
    CLIENT_RELEASES,
    RELEASE_DIFFERENCES,
    VllmSettings,
    client_refusals,
    vllm_neuron_config,
)

__all__ = ["LOADER_MODULE", "MAX_NUM_BATCHED_TOKENS", "ClientStart", "installed_loader"]

LOADER_MODULE = "vllm_neuron.worker.neuronx_distributed_model_loader"
MAX_NUM_BATCHED_TOKENS = 131072  # vllm-neuron's platform sets it (its scheduler; chunked prefill off)


def installed_loader() -> tuple[Any, str]:
    """vllm-neuron's loader module when it can be imported here (None otherwise), and why not."""
    loaded = sys.modules.get(LOADER_MODULE)
    if loaded is not None:
        return loaded, ""
    if not importable("vllm_neuron"):
        return None, "vllm-neuron is not installed here"
    try:
        return importlib.import_module(LOADER_MODULE), ""
    except Exception as exc:  # vllm-neuron imports NxDI and vLLM at import: any failure means "not usable here"
        return None, f"vllm-neuron is installed but its loader cannot be imported ({type(exc).__name__}: {exc})"


def _release(loader: Any) -> str:
    """The installed vllm-neuron's version (its metadata), else the release its functions are."""
    try:
        return importlib.metadata.version("vllm-neuron")
    except importlib.metadata.PackageNotFoundError:
        return CLIENT_RELEASES[-1] if hasattr(loader, "_handle_pa_num_blocks") else CLIENT_RELEASES[0]


def _plain(value: Any) -> Any:
    """A value of the config vllm-neuron built, as JSON-like data (its objects as their fields)."""
    if isinstance(value, Mapping):
        return {key: _plain(item) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(item) for item in value]
    if value is None or isinstance(value, (str, int, float, bool)):
        return value
    return {key: _plain(item) for key, item in vars(value).items()} if hasattr(value, "__dict__") else str(value)


@dataclass
class ClientStart:
    """A vLLM start's own part: vLLM's settings, the ``override_neuron_config`` object, and the
    model's ``config.json``; ``built_by`` is filled in by ``neuron_config``."""

    settings: VllmSettings
    override: Mapping[str, Any] | None
    built_by: str = ""

    def neuron_config(self, environ: Mapping[str, str] | None = None) -> dict[str, Any]:
        """The NeuronConfig vllm-neuron hands NxDI; ``ConfigError`` with vllm-neuron's refusal."""
        loader, why_not = installed_loader()
        if loader is not None and hasattr(loader, "_get_default_neuron_config"):
            return self._by_client(loader)
        self.built_by = (f"the package's model of vllm-neuron {' and '.join(CLIENT_RELEASES)} ({why_not or 'not importable'}"
                         f"; they differ in {', '.join(RELEASE_DIFFERENCES)} — a refusal only one has names it: "
                         "docs/serving.md)")
        refusals = {release: client_refusals(self.settings, self.override, release) for release in CLIENT_RELEASES}
        every = [line for line in refusals[CLIENT_RELEASES[-1]] if all(line in r for r in refusals.values())]
        if every:
            raise ConfigError(f"vllm-neuron refuses this NeuronConfig: {every[0]}")
        for release, lines in refusals.items():
            if lines:
                others = ", ".join(r for r in CLIENT_RELEASES if r != release)
                raise ConfigError(f"vllm-neuron {release} refuses this NeuronConfig ({others} does not): {lines[0]}")
        return vllm_neuron_config(self.settings, self.override)

    def _by_client(self, loader: Any) -> dict[str, Any]:
        """vllm-neuron's own functions, called as ``get_neuron_model`` calls them."""
        import torch  # torch: vllm-neuron keys its dtype table by torch dtypes (installed wherever vllm-neuron is)

        release = _release(loader)
        self.built_by = f"vllm-neuron {release}'s own functions ({getattr(loader, '__file__', LOADER_MODULE)})"
        s = self.settings
        dtype = getattr(torch, str(s.torch_dtype).removeprefix("torch."), None) if s.torch_dtype else None
        blocks = s.num_gpu_blocks_override
        if blocks is not None and hasattr(loader, "_handle_pa_num_blocks"):
            blocks += 1  # 0.2.0's platform (check_and_update_config) adds the null block
        model = SimpleNamespace(dtype=dtype if isinstance(dtype, torch.dtype) else s.torch_dtype, max_model_len=s.max_model_len)
        cache = SimpleNamespace(block_size=s.block_size, enable_prefix_caching=s.enable_prefix_caching,
                                num_gpu_blocks_override=blocks)
        scheduler = SimpleNamespace(max_num_seqs=s.max_num_seqs, max_model_len=s.max_model_len,
                                    max_num_batched_tokens=MAX_NUM_BATCHED_TOKENS, chunked_prefill_enabled=False)
        parallel = SimpleNamespace(tensor_parallel_size=s.tensor_parallel_size)
        override = copy.deepcopy(dict(self.override)) if self.override is not None else None
        try:
            config = loader._get_default_neuron_config(model, cache, parallel, scheduler, None, None)
            config = loader._get_neuron_config_after_override(config, override)
            if config.get("is_block_kv_layout") and hasattr(loader, "_handle_pa_num_blocks"):
                config = loader._handle_pa_num_blocks(cache, config, override)
            config = loader._validate_neuron_config(cache, scheduler, config)
        except (AssertionError, ValueError, KeyError, TypeError, NotImplementedError, ZeroDivisionError) as exc:
            reason = " ".join(str(exc).split()) or type(exc).__name__
            raise ConfigError(f"vllm-neuron {release} refuses this NeuronConfig: {reason[:400]}") from None
        return _plain(config)
