"""NxDI's configuration, read one way: NxDI objects at load, JSON in the command line.

NxDI hands the hook an ``InferenceConfig`` (model fields as attributes, the ``NeuronConfig`` in
``.neuron_config``); the command line reads the same thing from JSON, flat (NeuronConfig
attributes only) or nested as NxDI saves ``neuron_config.json`` (model fields at the top,
``neuron_config`` inside). ``config_attr`` reads either; the rules below (docs/format.md, Findings by
check: the ``config`` and ``neuron_config`` rows) are one function each, applied to both, and return
``Problem`` values that the preflight turns into findings (the config.json field rule, over
``format``'s field tables: ``config_fields``). Stdlib only.

Every number from a config is bounded before arithmetic or a message uses it: dimension-like
fields to 1 … 2^31 (``bounded_int``), and values are shown with ``describe`` (a huge integer
is never converted to text).
"""

from __future__ import annotations

import difflib
import os
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from .. import format as fmt
from ..errors import ConfigError, LoadError
from ..safeio.json_file import MAX_JSON_FILE_BYTES, JsonFileError, read_json_file
from ..safeio.strict_json import JsonError
from ..units import plural
from .vllm_config import VLLM_OVERRIDE_KEY

__all__ = [
    "BOOLEAN_NEURON_CONFIG_KEYS", "KNOWN_NEURON_CONFIG_KEYS", "MAX_CONFIG_FILE_SIZE",
    "MAX_EXCLUSION_WORK", "SWITCH_OFF", "SWITCH_ON", "Problem", "bounded_int", "config_attr",
    "describe", "has_model_fields", "load_choices", "model_config_problems", "model_part",
    "neuron_config_problems", "neuron_config_view", "parse_load_mode", "parse_reference", "parse_switch", "parse_verify_at_load",
    "read_config_file", "reference_choice", "switch_from_env", "unknown_key_problems",
]

# NxD's substring rule costs (paths × entries); real configs have a handful of entries
MAX_EXCLUSION_WORK = 2_000_000
MAX_NEAREST_SEARCHES = 100  # unknown keys given a "did you mean" (a JSON may hold thousands)

# The attributes NxDI 0.9's NeuronConfig, MoENeuronConfig and GptOssNeuronConfig take (their
# keyword arguments), plus this package's own opt-in. A JSON key outside this set is dropped by
# NxDI with only a log line, so the preflight warns and names the nearest known key.
KNOWN_NEURON_CONFIG_KEYS: frozenset[str] = frozenset(["activation_quantization_type", "allow_input_truncation", "apply_seq_ids_mask", "async_mode", "attention_dp_degree", "attention_dtype", "attn_block_cte_nki_kernel_enabled", "attn_block_tkg_nki_kernel_cache_update", "attn_block_tkg_nki_kernel_cascaded_attention", "attn_block_tkg_nki_kernel_disable_gpsimd_sb2sb", "attn_block_tkg_nki_kernel_enabled", "attn_block_tkg_nki_kernel_use_online_softmax", "attn_cls", "attn_kernel_enabled", "attn_tkg_builtin_kernel_enabled", "attn_tkg_nki_kernel_enabled", "batch_size", "bucket_n_active_tokens", "buckets", "cast_type", "cc_pipeline_tiling_factor", "chunked_prefill_config", "context_encoding_buckets", "cp_degree", "ctx_batch_size", "disable_argmax_kernel", "disable_kv_cache_tiling", "disable_numeric_cc_token", "dma_order_config", "draft_model_modules_to_not_convert", "eagle_rolling_buffer_kernel_enabled", "enable_bucketing", "enable_cte_modular_flow", "enable_eagle_draft_input_norm", "enable_eagle_speculation", "enable_fused_speculation", "enable_long_context_mode", "enable_output_completion_notifications", "enable_spill_reload_dge", "enable_token_tree", "enable_ve_data_parallel", "ep_degree", "ep_dispatch_cc_option", "expert_mlp_nki_kernel_enabled", "flash_decoding_enabled", "fused_qkv", "fused_rmsnorm_skip_gamma", "is_block_kv_layout", "is_chunked_prefill", "is_continuous_batching", "is_eagle3", "is_eagle_draft", "is_full_model_shuffled", "is_hidden_dim_shuffled", "is_intermediate_dim_shuffled", "is_medusa", "is_mxfp4_compute", "is_prefill_stage", "is_prefix_caching", "k_cache_transposed", "kv_cache_batch_size", "kv_cache_padding_size", "kv_cache_quant", "kv_cache_tiling", "kv_cache_update_with_kernel", "kv_quant_config", "layer_boundary_markers", "lm_head_pad", "lm_head_pad_alignment_size", "local_ranks_size", "logical_nc_config", "logical_neuron_cores", "lora_config", "max_batch_size", "max_context_length", "max_length", "max_new_tokens", "medusa_speculation_length", "medusa_tree", "mlp_cp_degree", "mlp_kernel_enabled", "mlp_kernel_fuse_residual_add", "mlp_tkg_nki_kernel_enabled", "modules_to_not_convert", "moe_fused_nki_kernel_enabled", "n_active_tokens", "n_positions", "num_medusa_heads", "on_cpu", "on_device_sampling_config", "out_proj_kernel_enabled", "output_logits", "overrides_torch_dtype", "pa_block_size", "pa_num_blocks", "padded_hidden_size", "padded_intermediate_size", "padding_side", "pp_degree", "pre_rope_rmsnorm", "prefix_buckets", "qk_layernorm", "qkv_cte_nki_kernel_fuse_rope", "qkv_kernel_enabled", "qkv_kernel_fuse_residual_add", "qkv_kernel_nbsd_layout", "qkv_nki_kernel_enabled", "quantization_block_axis", "quantization_block_size", "quantization_dtype", "quantization_scale_dtype", "quantization_type", "quantize_clamp_bound", "quantized", "quantized_checkpoints_path", "quantized_mlp_kernel_enabled", "rmsnorm_quantize_kernel_enabled", "router_topk_nki_kernel_enabled", "rpl_reduce_dtype", "save_sharded_checkpoint", "scratchpad_page_size", "seq_len", "seq_len_threshold_for_cc_tiling", "sequence_parallel_enabled", "shared_mlp_nki_kernel_enabled", "skip_sharding", "skip_warmup", "spec_batch_size", "speculation_length", "start_rank_id", "strided_context_parallel_kernel_enabled", "switch_cc", "target", "tensor_capture_config", "tensor_replacement_config", "tile_cc", "tkg_batch_size", "token_generation_batches", "token_generation_buckets", "token_tree_config", "torch_dtype", "tp_degree", "vocab_parallel", "weight_gather_seq_len_threshold", "weights_to_skip_layout_optimization", "windowed_context_encoding_size", "world_size", "blockwise_matmul_config", "capacity_factor", "disable_normalize_top_k_affinities", "early_expert_affinity_modulation", "fused_shared_experts", "gate_clamp_lower_limit", "gate_clamp_upper_limit", "glu_mlp", "glu_type", "hidden_act_bias", "hidden_act_scaling_factor", "hybrid_sharding_config", "moe_ep_degree", "moe_mask_padded_tokens", "moe_tp_degree", "normalize_top_k_affinities", "return_expert_index", "return_router_logits", "router_act_fn", "router_config", "router_dtype", "shared_experts_sequence_parallel_enabled", "transpose_shared_experts_weights", "up_clamp_lower_limit", "up_clamp_upper_limit", "use_index_calc_kernel", "sliding_window_attention_dp_degree", "checkpoint_format"]) | {
    # this package's own load options, which the hook reads from the NeuronConfig
    fmt.VERIFY_AT_LOAD_ATTR, fmt.LOAD_MODE_ATTR, fmt.REFERENCE_ATTR,
}


# The NeuronConfig attributes NxDI 0.9 takes as on/off switches (False or True by default). NxDI
# keeps whatever a JSON file holds, and tests it for truth: "false" is on. Each must be a JSON
# boolean (neuron_config.not_boolean).
BOOLEAN_NEURON_CONFIG_KEYS: frozenset[str] = frozenset(["allow_input_truncation", "apply_seq_ids_mask", "async_mode", "attn_block_cte_nki_kernel_enabled", "attn_block_tkg_nki_kernel_cache_update", "attn_block_tkg_nki_kernel_cascaded_attention", "attn_block_tkg_nki_kernel_disable_gpsimd_sb2sb", "attn_block_tkg_nki_kernel_enabled", "attn_block_tkg_nki_kernel_use_online_softmax", "attn_tkg_builtin_kernel_enabled", "attn_tkg_nki_kernel_enabled", "bucket_n_active_tokens", "disable_argmax_kernel", "disable_kv_cache_tiling", "disable_normalize_top_k_affinities", "disable_numeric_cc_token", "eagle_rolling_buffer_kernel_enabled", "early_expert_affinity_modulation", "enable_bucketing", "enable_cte_modular_flow", "enable_eagle_draft_input_norm", "enable_eagle_speculation", "enable_fused_speculation", "enable_output_completion_notifications", "enable_spill_reload_dge", "enable_ve_data_parallel", "flash_decoding_enabled", "fused_qkv", "fused_rmsnorm_skip_gamma", "fused_shared_experts", "is_block_kv_layout", "is_continuous_batching", "is_eagle3", "is_eagle_draft", "is_full_model_shuffled", "is_medusa", "is_mxfp4_compute", "is_prefix_caching", "k_cache_transposed", "kv_cache_quant", "layer_boundary_markers", "lm_head_pad", "mlp_kernel_enabled", "mlp_kernel_fuse_residual_add", "mlp_tkg_nki_kernel_enabled", "moe_mask_padded_tokens", "on_cpu", "out_proj_kernel_enabled", "output_logits", "overrides_torch_dtype", "pre_rope_rmsnorm", "qk_layernorm", "qkv_cte_nki_kernel_fuse_rope", "qkv_kernel_enabled", "qkv_kernel_fuse_residual_add", "qkv_kernel_nbsd_layout", "qkv_nki_kernel_enabled", "quantized", "quantized_mlp_kernel_enabled", "return_expert_index", "return_router_logits", "rmsnorm_quantize_kernel_enabled", "save_sharded_checkpoint", "sequence_parallel_enabled", "shared_experts_sequence_parallel_enabled", "skip_sharding", "skip_warmup", "strided_context_parallel_kernel_enabled", "switch_cc", "transpose_shared_experts_weights", "use_index_calc_kernel", "vocab_parallel"])


@dataclass(frozen=True)
class Problem:
    """One rule broken by a config: becomes a finding (``check``.``reason``) of the preflight."""

    check: str
    reason: str
    message: str
    key: str | None = None
    warning: bool = False


def config_attr(source: Any, name: str, default: Any = None) -> Any:
    """Attribute ``name`` of an NxDI config object, or key ``name`` of a mapping standing in for one."""
    if isinstance(source, Mapping):
        return source.get(name, default)
    return getattr(source, name, default)


def neuron_config_view(neuron_config: Any) -> Any:
    """The NeuronConfig attributes of whatever the caller passed: an object, a flat mapping, one
    nested under ``"neuron_config"`` as NxDI saves it, or vLLM's ``--additional-config`` JSON
    (``{"override_neuron_config": {...}}``: the NeuronConfig vllm-neuron builds from it with
    vLLM's default settings, ``vllm_config.neuron_config_from_override``)."""
    if isinstance(neuron_config, Mapping):
        inner = neuron_config.get("neuron_config")
        if isinstance(inner, Mapping):
            return inner
        if isinstance(neuron_config.get(VLLM_OVERRIDE_KEY), Mapping):
            from .vllm_config import neuron_config_from_override

            return neuron_config_from_override(neuron_config)
        return neuron_config
    inner = getattr(neuron_config, "neuron_config", None)
    return inner if inner is not None else neuron_config


def model_part(neuron_config: Any) -> Mapping[str, Any] | None:
    """The model fields of a nested NxDI config mapping (everything beside ``neuron_config``)."""
    if isinstance(neuron_config, Mapping) and isinstance(neuron_config.get("neuron_config"), Mapping):
        return {key: value for key, value in neuron_config.items() if key != "neuron_config"}
    return None


def describe(value: Any, limit: int = 80) -> str:
    """A short, always-computable rendering of a config value for a message."""
    if type(value) is int:
        return repr(value) if -(10**30) < value < 10**30 else f"an integer of {value.bit_length():,} bits"
    if isinstance(value, str):
        text = repr(value[:limit])
    elif isinstance(value, (float, bool, type(None))):
        text = repr(value)
    elif isinstance(value, (list, tuple, dict)):
        text = f"a {type(value).__name__} of {plural(len(value), 'item')}"
    else:  # never call a foreign __repr__: it may be huge or raise
        text = f"a {type(value).__name__}"
    return text if len(text) <= limit else text[: limit - 1] + "…"


def bounded_int(value: Any, low: int = 1, high: int = fmt.MAX_DIMENSION) -> int | None:
    """``value`` if it is an int (not a bool) within ``low`` … ``high``, else None."""
    return value if type(value) is int and low <= value <= high else None


def _aliased(source: Any, field: str) -> tuple[str, Any]:
    for name in fmt.CONFIG_FIELD_ALIASES.get(field, (field,)):
        value = config_attr(source, name)
        if value is not None:
            return name, value
    return field, None


# --------------------------------------------------------------------------- model config


def model_config_problems(source: Any, dims: fmt.ModelDims | None, *, check: str, what: str,
                          compare_dims: bool) -> list[Problem]:
    """What NxDI would build wrong from the model fields of ``source``.

    ``source`` is ``config.json`` (``compare_dims=False``: the dimensions came from it),
    NxDI's InferenceConfig, or a nested config file's model part (their dimensions must
    equal the checkpoint's; NxDI keeps H'/I' in hidden/intermediate_size and H/I in
    ``original_*``). Rules: ``attention_bias`` must be true (else NxDI builds attention without
    the stored q/k/v/o biases and drops them with a warning); ``original_hidden_size`` /
    ``original_intermediate_size``, when present, must equal H / I (NxDI adds the up-projection
    bias +1 to only that many columns).
    """
    problems: list[Problem] = []
    bias = config_attr(source, "attention_bias")
    if bias is not True:
        problems.append(Problem(
            check, "no_attention_bias",
            f"{what} has attention_bias={describe(bias)}: NxDI then builds attention without biases and drops "
            "the checkpoint's q/k/v/o biases with only a warning; set \"attention_bias\": true",
            "attention_bias"))
    problems.extend(_alias_problems(source, check, what))
    originals = {"hidden_size": "original_hidden_size", "intermediate_size": "original_intermediate_size"}
    if dims is None:
        return problems
    for field, original in originals.items():
        value = config_attr(source, original)
        if value is not None and value != getattr(dims, field):
            problems.append(Problem(
                check, "original_size_mismatch",
                f"{what} has {original}={describe(value)} but the checkpoint's {field} is {getattr(dims, field)}: "
                f"NxDI would treat only that many columns as real; remove {original} or set it to {getattr(dims, field)}",
                original))
    if not compare_dims:
        return problems
    for field, expected in dims.as_dict().items():
        if field in originals and config_attr(source, originals[field]) is not None:
            continue  # NxDI holds H'/I' here; the original_* rule above checked H/I
        name, found = _aliased(source, field)
        if found is not None and found != expected:
            problems.append(Problem(
                check, "nxdi_config_mismatch",
                f"{what} has {name}={describe(found)}, the checkpoint's config.json {expected}: "
                "compile with the checkpoint's config", name))
    return problems


def _alias_problems(source: Any, check: str, what: str) -> list[Problem]:
    """A field NxDI reads under its Hugging Face name (``num_local_experts``,
    ``num_experts_per_tok``) must be there under that name, and an alias beside it must agree.

    NxDI loads ``config.json`` through transformers' GptOssConfig, which takes only the HF name
    and otherwise uses its own default (128 experts, top-4): ``experts_per_token`` alone would
    make NxDI route a different number of experts than the checkpoint was made for.
    """
    problems = []
    for canonical, *aliases in fmt.CONFIG_FIELD_ALIASES.values():
        value = config_attr(source, canonical)
        for alias in aliases:
            other = config_attr(source, alias)
            if other is None:
                continue
            if value is None:
                problems.append(Problem(
                    check, "alias_only",
                    f"{what} has {alias}={describe(other)} but no {canonical}: transformers' GptOssConfig ignores "
                    f"{alias} and NxDI builds the model with its default {canonical}; write \"{canonical}\": {describe(other)}",
                    canonical))
            elif other != value or type(other) is not type(value):
                problems.append(Problem(
                    check, "alias_mismatch",
                    f"{what} has {canonical}={describe(value)} and {alias}={describe(other)}: one model has one value; "
                    f"make them equal (NxDI uses {canonical})", alias))
    return problems


def has_model_fields(source: Mapping[str, Any]) -> bool:
    """Whether a nested file's model part carries any model dimension (else it says nothing)."""
    return any(name in source for field in fmt.ModelDims.__dataclass_fields__
               for name in fmt.CONFIG_FIELD_ALIASES.get(field, (field,)))


# --------------------------------------------------------------------------- neuron config


def unknown_key_problems(nc: Mapping[str, Any]) -> list[Problem]:
    """A warning per key NxDI's NeuronConfig does not take, naming the nearest known key."""
    problems: list[Problem] = []
    for key in list(nc)[:10_000]:
        if key in KNOWN_NEURON_CONFIG_KEYS:
            continue
        if not isinstance(key, str):  # only a mapping built in Python can hold one (NxDI refuses it)
            problems.append(Problem("neuron_config", "unknown_key", f"key {describe(key)} is not an attribute name", describe(key), warning=True))
            continue
        shown = key[:80]
        # the nearest name for the first MAX_NEAREST_SEARCHES keys (each search compares ~200 names)
        nearest = difflib.get_close_matches(key[:200], KNOWN_NEURON_CONFIG_KEYS, n=1, cutoff=0.6) \
            if len(problems) < MAX_NEAREST_SEARCHES else []
        hint = f": did you mean {nearest[0]!r}?" if nearest else ""
        problems.append(Problem(
            "neuron_config", "unknown_key",
            f"{shown!r} is not a NeuronConfig attribute; NxDI drops it with only a log line{hint}",
            shown, warning=True))
    return problems


SWITCH_ON = ("1", "true", "yes", "on")
SWITCH_OFF = ("0", "false", "no", "off", "")


def parse_switch(value: Any, meaning: str = "on") -> bool:
    """The one on/off parser of every switch, environment variable or config attribute:
    None and a bool as they are, else one of ``SWITCH_ON`` / ``SWITCH_OFF`` (any case, spaces
    around ignored). Raises ``ValueError`` saying what is accepted for anything else (``ture``,
    ``2``, ``enabled``): a switch that cannot be read is never silently off.
    """
    if value is None or isinstance(value, bool):
        return bool(value)
    if isinstance(value, str) and value.strip().lower() in SWITCH_ON + SWITCH_OFF:
        return value.strip().lower() in SWITCH_ON
    raise ValueError(f"is not on or off: set it to 1 ({meaning}) or 0 (also accepted: {'/'.join(SWITCH_ON[1:])}, "
                     f"{'/'.join(SWITCH_OFF[1:-1])}, or empty)")


def switch_from_env(name: str, environ: Mapping[str, str], meaning: str = "on") -> bool:
    """Environment variable ``name`` read with ``parse_switch``; ``ConfigError`` naming it otherwise."""
    value = environ.get(name)
    try:
        return parse_switch(value, meaning)
    except ValueError as exc:
        raise ConfigError(f"{name}={describe(value)} {exc}") from None


def parse_verify_at_load(value: Any) -> bool:
    """The verify-at-load switch from an environment or ``neuron_config`` value (None: off).

    Raises ``ValueError`` (saying what is accepted) for anything but a bool or an on/off word.
    """
    return parse_switch(value, "verify shard_sha256 at load")


MAX_CONFIG_FILE_SIZE = MAX_JSON_FILE_BYTES  # the one cap of every JSON file read


def read_config_file(path: str | os.PathLike[str], what: str) -> dict[str, Any]:
    """A JSON configuration file (a NeuronConfig, flat or nested as NxDI saves it), read like
    every checkpoint JSON: a regular file (refused before it is opened otherwise), strict JSON,
    at most ``MAX_CONFIG_FILE_SIZE`` bytes, an object — except that NxDI's own constants
    (``Infinity``, ``-Infinity``, ``NaN``, which ``InferenceConfig.save`` writes for
    ``quantize_clamp_bound``) are read as floats. ``what`` names it in messages (e.g.
    ``--neuron-config nc.json``); ``ConfigError`` says what is wrong, once."""
    try:
        document = read_json_file(path, what=what, max_bytes=MAX_CONFIG_FILE_SIZE, nxdi_constants=True)
    except JsonFileError as exc:
        cause = exc.cause
        if exc.code == "not_a_file":
            kind = str(cause).removeprefix(os.fspath(path)).strip() or str(cause)  # "is a directory, not a regular file"
            raise ConfigError(f"{what} {kind}; pass a JSON file") from None
        if exc.code == "unreadable" and isinstance(cause, OSError):
            raise ConfigError(f"cannot read {what}: {cause.strerror or cause}") from None
        if isinstance(cause, JsonError) or exc.code == "not_utf8":
            raise ConfigError(str(exc)) from None  # its message starts with ``what``
        raise ConfigError(f"{what}: {exc}") from None  # too large, or grew while read
    if not isinstance(document, dict):
        raise ConfigError(f"{what} must hold a JSON object of NeuronConfig attributes, not {describe(document)}")
    return document


def parse_load_mode(value: Any) -> str | None:
    """The load mode from an environment or ``neuron_config`` value (None or empty: not set).

    Raises ``ValueError`` (naming the modes) for anything else.
    """
    if value is None or (isinstance(value, str) and not value.strip()):
        return None
    if isinstance(value, str) and value.strip().lower() in fmt.LOAD_MODES:
        return value.strip().lower()
    raise ValueError(f"is not a load mode: set it to one of {', '.join(fmt.LOAD_MODES)}")


def load_choices(config: Any = None, environ: Mapping[str, str] | None = None) -> tuple[bool, str]:
    """The load's two choices, ``(verify shard_sha256 at load, load mode)``, from the environment
    (``NXDI_GPTOSS_FP8_VERIFY_AT_LOAD``, ``NXDI_GPTOSS_FP8_LOAD_MODE``) and the NeuronConfig
    (``normalized_fp8_verify_at_load``, ``normalized_fp8_load_mode``): verification is on when
    either asks for it; the two modes must not disagree. The one reader the loader
    (``loader.LoadPolicy.resolve``) and the start plan use: ``LoadError`` for a value that is neither
    on/off nor a known mode (``ture``, ``privat``), or for two disagreeing modes."""
    env = os.environ if environ is None else environ
    nc = neuron_config_view(config) if config is not None else None

    def read(parse: Any, value: Any, source: str) -> Any:
        try:
            return parse(value)
        except ValueError as exc:
            raise LoadError(f"{source}={value!r} {exc}") from None

    verify_attr, mode_attr = f"neuron_config.{fmt.VERIFY_AT_LOAD_ATTR}", f"neuron_config.{fmt.LOAD_MODE_ATTR}"
    verify = read(parse_verify_at_load, env.get(fmt.VERIFY_AT_LOAD_ENV), fmt.VERIFY_AT_LOAD_ENV) or read(
        parse_verify_at_load, config_attr(nc, fmt.VERIFY_AT_LOAD_ATTR) if nc is not None else None, verify_attr)
    modes = {source: mode for source, mode in (
        (fmt.LOAD_MODE_ENV, read(parse_load_mode, env.get(fmt.LOAD_MODE_ENV), fmt.LOAD_MODE_ENV)),
        (mode_attr, read(parse_load_mode, config_attr(nc, fmt.LOAD_MODE_ATTR) if nc is not None else None, mode_attr)),
    ) if mode is not None}
    if len(set(modes.values())) > 1:
        raise LoadError(" contradicts ".join(f"{source}={mode!r}" for source, mode in modes.items())
                        + ": set one of them, or both to the same mode")
    return verify, next(iter(modes.values()), fmt.LOAD_MODE_MMAP)


def parse_reference(value: Any) -> str | None:
    """The accuracy reference from an environment or ``neuron_config`` value (None or empty: not
    set): ``dequantized``, or a path (it holds a ``/``) to the HF source the checkpoint was
    converted from; whether that path is the recorded source is decided when it is read.

    Raises ``ValueError`` (naming what is accepted, and ``dequantized`` for a near miss) otherwise.
    """
    if value is None or (isinstance(value, str) and not value.strip()):
        return None
    if isinstance(value, str) and value.strip().lower() == fmt.REFERENCE_DEQUANTIZED:
        return fmt.REFERENCE_DEQUANTIZED
    if isinstance(value, str) and (os.sep in value or "/" in value):
        return value.strip()
    near = isinstance(value, str) and difflib.get_close_matches(value.strip().lower()[:80], [fmt.REFERENCE_DEQUANTIZED], cutoff=0.6)
    hint = f" (did you mean {fmt.REFERENCE_DEQUANTIZED!r}?)" if near else ""
    raise ValueError(f"is not a reference{hint}: set it to {fmt.REFERENCE_DEQUANTIZED} (the checkpoint's own FP8 × scale) "
                     "or to the path of the HF checkpoint it was converted from, e.g. /data/models/gpt-oss-120b")


def reference_choice(config: Any = None, environ: Mapping[str, str] | None = None) -> str | None:
    """The accuracy reference asked for by ``NXDI_GPTOSS_FP8_REFERENCE`` and/or
    ``neuron_config.normalized_fp8_reference`` (None: neither is set). ``ConfigError`` (one line,
    naming the setting) for a value ``parse_reference`` refuses, or for two that disagree."""
    env = os.environ if environ is None else environ
    nc = neuron_config_view(config) if config is not None else None
    choices = {}
    for source, value in ((fmt.REFERENCE_ENV, env.get(fmt.REFERENCE_ENV)),
                          (f"neuron_config.{fmt.REFERENCE_ATTR}", config_attr(nc, fmt.REFERENCE_ATTR) if nc is not None else None)):
        try:
            choice = parse_reference(value)
        except ValueError as exc:
            raise ConfigError(f"{source}={describe(value)} {exc}") from None
        if choice is not None:
            choices[source] = choice
    if len(set(choices.values())) > 1:
        raise ConfigError(" contradicts ".join(f"{source}={choice!r}" for source, choice in choices.items())
                          + ": set one of them, or both to the same reference")
    return next(iter(choices.values()), None)


def neuron_config_problems(nc: Any, *, dims: fmt.ModelDims | None, layout: fmt.Layout | None,
                           stored_padding: Mapping[str, Any]) -> list[Problem]:
    """The ``neuron_config`` rules (docs/format.md) for a NeuronConfig object or its JSON mapping.

    ``dims``/``layout`` come from the checkpoint (None when it has no usable config);
    ``stored_padding`` holds the index's padded sizes as written.
    """
    problems: list[Problem] = []

    def add(reason: str, message: str, key: str) -> None:
        problems.append(Problem("neuron_config", reason, message, key))

    if isinstance(nc, Mapping):
        problems.extend(unknown_key_problems(nc))
    for attr in sorted(BOOLEAN_NEURON_CONFIG_KEYS):
        value = config_attr(nc, attr)
        if (attr in nc if isinstance(nc, Mapping) else value is not None) and type(value) is not bool:
            add("not_boolean", f"{attr} is {describe(value)}, not true or false: NxDI tests it for truth, so any "
                f"non-empty value (\"false\" too) is on; write {attr}: true or false", attr)
    if not config_attr(nc, "quantized", False):
        add("not_quantized", "quantized is not set: set quantized=True and quantized_checkpoints_path to the checkpoint directory, or NxDI builds BF16 experts and casts the FP8 bytes without scales", "quantized")
    # NxDI's NeuronConfig always holds it (None unless given); a JSON file may leave it out
    named, path_key = config_attr(nc, "quantized_checkpoints_path"), "quantized_checkpoints_path"
    given = path_key in nc if isinstance(nc, Mapping) else hasattr(nc, path_key)
    if config_attr(nc, "quantized", False) and given and not (isinstance(named, (str, os.PathLike)) and os.fspath(named).strip()):
        add("bad_checkpoints_path", f"quantized_checkpoints_path is {describe(named)}, not a directory path: NxDI loads "
            "the quantized checkpoint from it; set it to the checkpoint directory", "quantized_checkpoints_path")
    dtype = config_attr(nc, "quantization_dtype", "int8")
    if dtype != fmt.QUANTIZATION_DTYPE:
        add("wrong_quantization_dtype", f"quantization_dtype is {describe(dtype)}: set it to {fmt.QUANTIZATION_DTYPE!r}", "quantization_dtype")
    qtype = config_attr(nc, "quantization_type", "per_tensor_symmetric")
    if qtype != fmt.QUANTIZATION_TYPE:
        add("wrong_quantization_type", f"quantization_type is {describe(qtype)}: set it to {fmt.QUANTIZATION_TYPE!r} (the only scale layout GPT-OSS experts accept)", "quantization_type")
    for attr in ("quantized_mlp_kernel_enabled", "activation_quantization_type"):
        value = config_attr(nc, attr)
        if value:
            add("quantization_rewritten", f"{attr} is {describe(value)}: NxDI then rewrites quantization_type to per_channel_symmetric, which does not fit the expert-wise scales; remove it", attr)
    hybrid = config_attr(nc, "hybrid_sharding_config")
    if hybrid is not None:
        add("hybrid_sharding", "hybrid_sharding_config is set: NxDI's token-generation expert module it creates gets no FP8 scales; remove it", "hybrid_sharding_config")
    if config_attr(nc, "is_mxfp4_compute", False):
        add("mxfp4_compute", "is_mxfp4_compute is on: MXFP4 compute expects packed FP4 experts, not FP8; turn it off", "is_mxfp4_compute")
    for attr, base in (("padded_hidden_size", dims.hidden_size if dims else None),
                       ("padded_intermediate_size", dims.intermediate_size if dims else None)):
        raw = config_attr(nc, attr)
        if raw is not None and bounded_int(raw) is None:
            add("out_of_range", f"{attr} is {describe(raw)}, not an integer in 1 … 2^31", attr)
            continue
        stored = stored_padding.get(attr)
        wanted = raw or base
        if base is not None and bounded_int(stored) is not None and wanted != stored:
            add("padding_mismatch", f"{attr} is {wanted} at runtime but the checkpoint was written for {stored}: set {attr}={stored} or re-convert with --{attr.replace('_', '-')} {wanted}", attr)
    for attr, parse in ((fmt.VERIFY_AT_LOAD_ATTR, parse_verify_at_load), (fmt.LOAD_MODE_ATTR, parse_load_mode),
                        (fmt.REFERENCE_ATTR, parse_reference)):
        value = config_attr(nc, attr)
        try:
            parse(value)
        except ValueError as exc:
            add("bad_load_option", f"{attr} is {describe(value)}: it {exc}", attr)
    problems.extend(_exclusion_problems(nc, dims))
    degrees = {}
    for attr in ("tp_degree", "moe_ep_degree", "moe_tp_degree"):
        raw = config_attr(nc, attr)
        degrees[attr] = 1 if raw is None else bounded_int(raw)
        if degrees[attr] is None:
            add("bad_degree", f"{attr} is {describe(raw)}, not an integer in 1 … 2^31", attr)
    tp, ep, moe_tp = degrees["tp_degree"], degrees["moe_ep_degree"], degrees["moe_tp_degree"]
    if tp is None or ep is None or moe_tp is None or layout is None:
        return problems
    expert_tp = moe_tp if ep > 1 else tp
    ip, experts = layout.padded_intermediate_size, layout.dims.num_local_experts
    if ip % expert_tp:
        which = "moe_tp_degree" if ep > 1 else "tp_degree"
        add("expert_tp_indivisible", f"the padded intermediate size {ip} is not divisible by the MoE tensor-parallel degree {which}={expert_tp}: pick a degree that divides it or re-convert with a padded intermediate size that it divides", which)
    if experts % ep:
        add("expert_ep_indivisible", f"{plural(experts, 'expert')} cannot be split over moe_ep_degree={ep}", "moe_ep_degree")
    return problems


def _excluded(path: str, entries: list[str]) -> bool:
    """NxD's rule: a module is not converted when any entry is a substring of its dotted path."""
    return any(entry in path for entry in entries)


def _exclusion_problems(nc: Any, dims: fmt.ModelDims | None) -> list[Problem]:
    key = "modules_to_not_convert"
    entries = config_attr(nc, key) or []
    if not isinstance(entries, (list, tuple)) or not all(isinstance(e, str) for e in entries):
        return [Problem("neuron_config", "bad_modules_to_not_convert", f"{key} is {describe(entries)}, not a list of module names", key)]
    entries = list(entries)
    layers = dims.num_hidden_layers if dims else 1
    if layers * 6 * max(len(entries), 1) > MAX_EXCLUSION_WORK:
        return [Problem("neuron_config", "bad_modules_to_not_convert", f"{key} has {plural(len(entries), 'entry', 'entries')} for {plural(layers, 'layer')}: too many to check; list module names, not paths", key)]
    qkv = ("qkv_proj.Wqkv",) if config_attr(nc, "fused_qkv", False) else ("qkv_proj.q_proj", "qkv_proj.k_proj", "qkv_proj.v_proj")
    problems = []
    attention_paths = (f"layers.{i}.self_attn.{name}" for i in range(layers) for name in (*qkv, "o_proj.o_proj"))
    missing = next((p for p in attention_paths if not _excluded(p, entries)), None)
    if missing:
        problems.append(Problem("neuron_config", "attention_not_excluded", f"attention is not in {key} (e.g. {missing}): expert-wise FP8 cannot quantize attention; add 'self_attn'", key))
    if not _excluded("lm_head", entries):
        problems.append(Problem("neuron_config", "lm_head_not_excluded", f"lm_head is not in {key}: add 'lm_head'", key))
    expert_paths = (f"layers.{i}.{proj}" for i in range(layers) for proj in (fmt.GATE_UP, fmt.DOWN))
    excluded = next((p for p in expert_paths if _excluded(p, entries)), None)
    if excluded:
        problems.append(Problem("neuron_config", "experts_excluded", f"{key} excludes the FP8 experts (e.g. {excluded}): NxDI would cast the FP8 bytes to BF16 without their scales; remove that entry", key))
    return problems
