"""The NeuronConfig vllm-neuron builds: its defaults from vLLM's settings, then the
``override_neuron_config`` object of vLLM's ``--additional-config`` over them.

What the validator reads when ``validate --neuron-config`` is given vLLM's ``--additional-config``
JSON, and what ``doctor`` checks a ``vllm serve`` command's NeuronConfig with (its command line is
read by ``nxdi.vllm_command``). The vLLM half of ``nxdi_config``'s knowledge. Stdlib only; nothing
is imported from vLLM or vllm-neuron.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

__all__ = ["CLIENT_RELEASES", "RELEASE_DIFFERENCES", "VLLM_OVERRIDE_KEY", "VllmSettings", "client_refusals",
           "neuron_config_from_override", "vllm_neuron_config"]

CLIENT_RELEASES = ("0.1.0", "0.2.0")  # the vllm-neuron releases modelled here (support.VLLM_NEURON_RUN_AGAINST)
# where the two releases differ, as the start sees it (doctor names them on a host without vllm-neuron)
RELEASE_DIFFERENCES = {
    "model lookup": "0.1.0 maps GptOssForCausalLM to NxDI's gpt_oss itself; 0.2.0 finds it only through this "
                    "package's entry point (VLLM_PLUGINS must not leave it out)",
    "blocks": "0.2.0 refuses a prefix-caching NeuronConfig with fewer KV blocks than max_model_len needs "
              "(\"At least N blocks are required\") and pa_num_blocks without --num-gpu-blocks-override; 0.1.0 does not",
    "quantization": "0.2.0 fills in quantization_type / quantization_dtype (per_tensor_symmetric / int8) when the override "
                    "sets quantized alone and checks the checkpoint (save_quantized_state_dict) before compiling",
    "lora": "0.1.0 refuses any lora_modules key in override_neuron_config",
}

VLLM_OVERRIDE_KEY = "override_neuron_config"  # the only key vllm-neuron reads (not "override-neuron-config")


@dataclass(frozen=True)
class VllmSettings:
    """What vllm-neuron's ``_get_default_neuron_config`` reads from vLLM's configs, as vLLM and
    vllm-neuron's platform set them (``check_and_update_config``: chunked prefill off, 32
    sequences when ``--max-num-seqs`` is not given, ``block_size = max_model_len`` without prefix
    caching; vLLM turns prefix caching on unless told otherwise)."""

    tensor_parallel_size: Any = 1
    max_model_len: Any = None
    max_num_seqs: Any = 32
    block_size: Any = 32
    enable_prefix_caching: bool = True
    torch_dtype: Any = None
    num_gpu_blocks_override: Any = None


def vllm_neuron_config(settings: VllmSettings, override: Mapping[str, Any] | None,
                       release: str = CLIENT_RELEASES[-1]) -> dict[str, Any]:
    """The NeuronConfig attributes vllm-neuron hands NxDI (``get_neuron_model``): its defaults
    from vLLM's settings, then ``override_neuron_config`` over them, with ``quantization_type`` /
    ``quantization_dtype`` filled in as ``per_tensor_symmetric`` / ``int8`` when the override sets
    ``quantized`` without them (``release`` 0.2.0 does it; 0.1.0 leaves them out, and NxDI's
    NeuronConfig defaults give the same values; 0.2.0's platform also adds the null block to
    ``--num-gpu-blocks-override``). Objects vllm-neuron builds (``OnDeviceSamplingConfig``) are
    their fields here; ``test_nxdi_client_config`` holds this to vllm-neuron's own functions."""
    batch_size = settings.max_num_seqs
    seq_len = settings.max_model_len
    blocks = settings.num_gpu_blocks_override
    if type(blocks) is int and release != CLIENT_RELEASES[0]:
        blocks += 1  # 0.2.0's platform adds the null block to --num-gpu-blocks-override
    if blocks is None and all(type(v) is int and v > 0 for v in (seq_len, settings.block_size, batch_size)):
        blocks = (seq_len // settings.block_size) * batch_size
    config: dict[str, Any] = {
        "tp_degree": settings.tensor_parallel_size, "ctx_batch_size": 1, "batch_size": batch_size,
        "max_context_length": seq_len, "seq_len": seq_len, "enable_bucketing": True,
        "is_continuous_batching": type(batch_size) is int and batch_size > 1, "quantized": False,
        "torch_dtype": settings.torch_dtype, "padding_side": "right",
        "on_device_sampling_config": {"dynamic": True, "deterministic": False}, "lora_config": None,
        "pa_num_blocks": blocks, "pa_block_size": settings.block_size,
        "is_block_kv_layout": settings.enable_prefix_caching, "is_prefix_caching": settings.enable_prefix_caching,
    }
    override = dict(override or {})
    config.update(override)
    for key in ("text_neuron_config", "vision_neuron_config"):
        config.pop(key, None)
    if "quantized" in override and release != CLIENT_RELEASES[0]:  # 0.1.0 leaves them to NxDI's defaults (the same)
        config["quantization_type"] = override.get("quantization_type", "per_tensor_symmetric")
        config["quantization_dtype"] = override.get("quantization_dtype", "int8")
        config["quantized_checkpoints_path"] = override.get("quantized_checkpoints_path")
    return config


def _ints(*values: Any) -> bool:
    return all(type(v) is int and v > 0 for v in values)


def client_refusals(settings: VllmSettings, override: Mapping[str, Any] | None, release: str) -> list[str]:
    """What vllm-neuron ``release`` refuses in the NeuronConfig it builds from ``settings`` and
    ``override`` before NxDI sees it (``get_neuron_model``: ``_handle_pa_num_blocks``,
    ``_validate_neuron_config``, 0.1.0's LoRA check), each one line with its fix; empty: none."""
    override = dict(override or {})
    config = vllm_neuron_config(settings, override, release)
    refusals = []
    if release == CLIENT_RELEASES[0] and "lora_modules" in override:
        refusals.append("multi-LoRA is not supported on the Neuron plugin (lora_modules in override_neuron_config): "
                        "remove lora_modules")
    user_blocks = settings.num_gpu_blocks_override
    if release != CLIENT_RELEASES[0] and config.get("is_block_kv_layout"):
        if user_blocks is not None and "pa_num_blocks" in override and override["pa_num_blocks"] != user_blocks:
            refusals.append(f"pa_num_blocks ({override['pa_num_blocks']!r}) must equal --num-gpu-blocks-override "
                            f"({user_blocks}): set them to the same value")
        elif user_blocks is None and "pa_num_blocks" in override:
            refusals.append(f"pa_num_blocks ({override['pa_num_blocks']!r}) in override_neuron_config needs "
                            "--num-gpu-blocks-override set to the same value")
    if settings.enable_prefix_caching and not (config.get("is_prefix_caching") and config.get("is_block_kv_layout")):
        refusals.append("prefix caching is on but override_neuron_config turns is_prefix_caching or is_block_kv_layout "
                        "off (vllm-neuron asserts both): remove them from the override, or pass --no-enable-prefix-caching")
    if release != CLIENT_RELEASES[0] and config.get("is_block_kv_layout") and not refusals and _ints(
            settings.max_model_len, settings.block_size, settings.max_num_seqs):
        required = math.ceil(settings.max_model_len / settings.block_size) * settings.max_num_seqs
        effective = user_blocks if user_blocks is not None else config.get("pa_num_blocks")
        if type(effective) is int and effective < required:
            refusals.append(f"At least {required} blocks are required for max_model_len {settings.max_model_len}, but "
                            f"only {effective} blocks are available (block size {settings.block_size}, "
                            f"{settings.max_num_seqs} sequences): use a --max-model-len that --block-size divides, "
                            "raise --num-gpu-blocks-override, or pass --no-enable-prefix-caching")
    return refusals


def neuron_config_from_override(document: Mapping[str, Any]) -> dict[str, Any]:
    """``--additional-config``'s JSON (``{"override_neuron_config": {...}}``) as the NeuronConfig
    vllm-neuron builds from it with vLLM's default settings (what ``validate --neuron-config``
    checks for a file in that form)."""
    override = document.get(VLLM_OVERRIDE_KEY)
    return vllm_neuron_config(VllmSettings(), override if isinstance(override, Mapping) else None)
