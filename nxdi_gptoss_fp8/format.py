"""The normalized static-FP8 GPT-OSS checkpoint format, version 1, as code.

This module is the single source of truth for the format described in ``docs/format.md``
(installed as ``nxdi_gptoss_fp8/format.md``: ``format_document_path``):
the index metadata, the model profiles and the exact tensor namespace (names, shapes, dtypes)
that a checkpoint must hold. The preflight, the loader and
the converter all derive what they expect from here. What does not belong in a normalized
checkpoint (derived, HF and legacy names) and the advice for it: ``other_formats``. Stdlib only.
"""

from __future__ import annotations

import functools
import math
import os
from collections.abc import Mapping
from dataclasses import asdict, dataclass
from typing import Any

__all__ = [
    "ALLOW_CUSTOM_ENV", "ARCHITECTURE", "BF16", "CONFIG_FIELD_ALIASES", "CONFIG_FILE", "CONFIG_HARD_CODED",
    "CONFIG_INERT_FIELDS", "CONFIG_READ_FIELDS", "DOWN", "DTYPE_BITS", "EXPERT_PREFIX", "F8_E4M3", "F32",
    "FORMAT_DOCUMENT", "FORMAT_NAME", "FORMAT_VERSION", "FP8_MAX", "FULL_ATTENTION", "GATE_UP", "HARD_CODED_REASONS",
    "INDEX_FILE", "LOAD_MODES", "LOAD_MODE_ATTR", "LOAD_MODE_ENV", "LOAD_MODE_MMAP", "LOAD_MODE_PRIVATE",
    "MAX_BYTE_COUNT", "MAX_DIMENSION", "MODEL_TYPE", "NXDI_RMS_NORM_EPS", "NXDI_SWIGLU_LIMIT", "OPTIONAL_METADATA",
    "PAD_MULTIPLE", "PICKLE_SUFFIXES", "PROFILES", "PROFILE_20B", "PROFILE_120B", "PROFILE_CUSTOM", "PROFILE_NAMES",
    "QUANTIZATION_DTYPE", "QUANTIZATION_TYPE", "QUANT_METHOD", "REFERENCE_ATTR", "REFERENCE_DEQUANTIZED",
    "REFERENCE_ENV", "REQUIRED_METADATA", "ROPE_SCALING_HARD_CODED", "ROPE_SCALING_READ", "ROPE_TYPE",
    "SLIDING_ATTENTION", "VERIFY_AT_LOAD_ATTR", "VERIFY_AT_LOAD_ENV", "WEIGHT_FILE_SUFFIXES", "ConfigFieldError",
    "Layout", "ModelDims", "TensorSpec", "dims_from_config", "expected_namespace", "expected_total_size",
    "format_document_path", "format_document_ref", "global_specs", "hf_config", "index_metadata", "is_expert_scale",
    "layer_prefix", "layer_specs", "nxdi_layer_types", "profile_for_dims", "scale_key_for", "weight_key_for",
]

# The user document of the format: docs/format.md in the source tree, shipped in the package as
# nxdi_gptoss_fp8/format.md (setup.py copies it at build time: one source of truth).
FORMAT_DOCUMENT = "format.md"


def format_document_path() -> str | None:
    """Where the format document is on this machine: the installed copy inside the package, else
    the source tree's ``docs/format.md`` (an editable install); None if neither is there."""
    package = os.path.dirname(os.path.abspath(__file__))
    for candidate in (os.path.join(package, FORMAT_DOCUMENT), os.path.join(os.path.dirname(package), "docs", FORMAT_DOCUMENT)):
        if os.path.isfile(candidate):
            return candidate
    return None


def format_document_ref() -> str:
    """How a message cites the format document: its path here, or its name in the source tree."""
    return format_document_path() or "docs/format.md of the nxdi-gptoss-fp8 source"


FORMAT_NAME = "nxdi_gptoss_normalized_fp8"
FORMAT_VERSION = 1
QUANT_METHOD = FORMAT_NAME
QUANTIZATION_TYPE = "expert_wise_per_channel_symmetric"
QUANTIZATION_DTYPE = "f8e4m3"
FP8_MAX = 240.0
PAD_MULTIPLE = 32
# Bounds applied before any arithmetic or message uses a number (docs/format.md, Bounds and trust).
MAX_DIMENSION = 2**31  # dimension-like fields: config dimensions, padded sizes, degrees
MAX_BYTE_COUNT = 2**53  # byte counts: total_size, header offsets, tensor sizes
MODEL_TYPE = "gpt_oss"
ARCHITECTURE = "GptOssForCausalLM"

INDEX_FILE = "model.safetensors.index.json"
CONFIG_FILE = "config.json"
WEIGHT_FILE_SUFFIXES = (".safetensors", ".bin", ".pt", ".pth")
PICKLE_SUFFIXES = (".bin", ".pt", ".pth")

PROFILE_120B = "gpt-oss-120b"
PROFILE_20B = "gpt-oss-20b"
PROFILE_CUSTOM = "custom"
ALLOW_CUSTOM_ENV = "NXDI_GPTOSS_FP8_ALLOW_CUSTOM_MODEL"
# Load-time choices (docs/loading.md#what-a-mapping-cannot-promise): each an environment variable and a
# neuron_config attribute (kept through NxDI's config JSON round trip by the hook).
VERIFY_AT_LOAD_ENV = "NXDI_GPTOSS_FP8_VERIFY_AT_LOAD"
VERIFY_AT_LOAD_ATTR = "normalized_fp8_verify_at_load"
LOAD_MODE_ENV = "NXDI_GPTOSS_FP8_LOAD_MODE"
LOAD_MODE_ATTR = "normalized_fp8_load_mode"
LOAD_MODE_MMAP = "mmap"  # the default: private copy-on-write mappings of the shard files
LOAD_MODE_PRIVATE = "private"  # read every shard into anonymous memory
LOAD_MODES = (LOAD_MODE_MMAP, LOAD_MODE_PRIVATE)
# What the hooked ``load_hf_model`` builds for NxDI's accuracy check (docs/accuracy.md): the
# checkpoint's own numbers dequantized, or a path to the HF source it was converted from.
REFERENCE_ENV = "NXDI_GPTOSS_FP8_REFERENCE"
REFERENCE_ATTR = "normalized_fp8_reference"
REFERENCE_DEQUANTIZED = "dequantized"

# safetensors dtype names used by the format.
BF16 = "BF16"
F32 = "F32"
F8_E4M3 = "F8_E4M3"

EXPERT_PREFIX = "feed_forward.moe.expert_mlps.mlp_op"
GATE_UP = f"{EXPERT_PREFIX}.gate_up_proj"
DOWN = f"{EXPERT_PREFIX}.down_proj"


@dataclass(frozen=True)
class ModelDims:
    """The dimensions of a GPT-OSS model, named as in its Hugging Face ``config.json``."""

    num_hidden_layers: int
    num_local_experts: int
    hidden_size: int
    intermediate_size: int
    head_dim: int
    num_attention_heads: int
    num_key_value_heads: int
    vocab_size: int
    num_experts_per_tok: int
    sliding_window: int

    def as_dict(self) -> dict[str, int]:
        return asdict(self)


PROFILES: dict[str, ModelDims] = {
    PROFILE_120B: ModelDims(
        num_hidden_layers=36, num_local_experts=128, hidden_size=2880, intermediate_size=2880,
        head_dim=64, num_attention_heads=64, num_key_value_heads=8, vocab_size=201088,
        num_experts_per_tok=4, sliding_window=128,
    ),
    PROFILE_20B: ModelDims(
        num_hidden_layers=24, num_local_experts=32, hidden_size=2880, intermediate_size=2880,
        head_dim=64, num_attention_heads=64, num_key_value_heads=8, vocab_size=201088,
        num_experts_per_tok=4, sliding_window=128,
    ),
}
PROFILE_NAMES = (PROFILE_120B, PROFILE_20B, PROFILE_CUSTOM)

# Alternative spellings that GPT-OSS configs use for the same field, the Hugging Face name first:
# it is the one NxDI uses (through transformers' GptOssConfig); the preflight requires it and
# an alias beside it to agree (validate.nxdi_config.model_config_problems).
CONFIG_FIELD_ALIASES: dict[str, tuple[str, ...]] = {
    "num_local_experts": ("num_local_experts", "num_experts"),
    "num_experts_per_tok": ("num_experts_per_tok", "experts_per_token"),
}


# config.json, field by field (docs/format.md, "config.json, field by field"): NxDI reads the
# file through transformers' GptOssConfig, then reads some fields, overwrites or ignores others.
# Every field is in one of the tables below; any other is a warning naming it.
#
# Fields NxDI reads (each checked against the profile, the index or a bound).
CONFIG_READ_FIELDS: frozenset[str] = frozenset({
    *(name for field in ModelDims.__dataclass_fields__ for name in CONFIG_FIELD_ALIASES.get(field, (field,))),
    "model_type", "architectures", "quantization_config", "attention_bias",
    "original_hidden_size", "original_intermediate_size",
    # rotary embedding: NxDI's own YaRN reads these (rope_scaling_factor / rope_ntk_alpha /
    # rope_ntk_beta at the top level win over rope_scaling's factor / beta_slow / beta_fast)
    "initial_context_length", "rope_theta", "rope_scaling", "rope_scaling_factor", "rope_ntk_alpha", "rope_ntk_beta",
    "pad_token_id",
    "torch_dtype", "dtype",  # NxDI's compute dtype, unless the neuron config overrides it
})
NXDI_RMS_NORM_EPS = 1e-05
NXDI_SWIGLU_LIMIT = 7.0
SLIDING_ATTENTION = "sliding_attention"
FULL_ATTENTION = "full_attention"
# Fields NxDI hard-codes: field → the values that say what NxDI computes (NxDI's first). Absent
# is fine too. ``layer_types`` is one too (``nxdi_layer_types``), as are rope_scaling's
# ``truncate``, ``original_max_position_embeddings`` and YaRN attention factors (below).
CONFIG_HARD_CODED: dict[str, tuple[Any, ...]] = {
    "rms_norm_eps": (NXDI_RMS_NORM_EPS,),  # set by NxDI's GptOssInferenceConfig
    "swiglu_limit": (NXDI_SWIGLU_LIMIT,),  # NxDI's expert clamp limits (±7)
    "tie_word_embeddings": (False,),  # NxDI keeps the stored lm_head (its tie is a no-op)
    # NxDI sets "sigmoid" and always computes the clamped SwiGLU x·σ(1.702·x); the published
    # configs say "silu" for the same computation
    "hidden_act": ("silu", "sigmoid"),
    "n_shared_experts": (0,),  # set by NxDI: GPT-OSS has no shared experts
    "partial_rotary_factor": (1.0,),  # NxDI rotates the whole head
}
HARD_CODED_REASONS: dict[str, str] = {
    "rms_norm_eps": f"NxDI's GPT-OSS always uses rms_norm_eps={NXDI_RMS_NORM_EPS}",
    "swiglu_limit": f"NxDI's GPT-OSS always clamps the experts' SwiGLU at ±{NXDI_SWIGLU_LIMIT:g}",
    "tie_word_embeddings": "NxDI's GPT-OSS never ties lm_head to embed_tokens (it keeps the stored lm_head; "
                           "transformers would tie them)",
    "hidden_act": "NxDI's GPT-OSS always computes the clamped SwiGLU x·sigmoid(1.702·x)",
    "n_shared_experts": "NxDI's GPT-OSS has no shared experts",
    "partial_rotary_factor": "NxDI's GPT-OSS rotates the whole head",
}
# rope_scaling's members: the ones NxDI reads (rope_type must be yarn: NxDI applies YaRN
# whatever it says), and the ones it hard-codes (validate.config_fields._rope_problems holds the values).
ROPE_TYPE = "yarn"
ROPE_SCALING_READ: frozenset[str] = frozenset({"rope_type", "type", "factor", "beta_fast", "beta_slow"})
ROPE_SCALING_HARD_CODED: frozenset[str] = frozenset({
    "truncate",  # NxDI never rounds the YaRN correction range: false (absent is true to transformers)
    "original_max_position_embeddings",  # NxDI uses initial_context_length
    "attention_factor", "mscale", "mscale_all_dim",  # NxDI's attention factor is 0.1·ln(factor) + 1
})
# Fields NxDI never uses to build or run the model (training, generation defaults, bookkeeping):
# transformers' generic PretrainedConfig fields and GPT-OSS's own.
CONFIG_INERT_FIELDS: frozenset[str] = frozenset({
    "transformers_version", "_name_or_path", "max_position_embeddings", "use_cache", "initializer_range",
    "attention_dropout", "router_aux_loss_coef", "output_router_logits", "use_sliding_window",
    "num_cores_per_group",  # derived by NxDI (overwritten)
    "bos_token_id", "eos_token_id", "sep_token_id", "decoder_start_token_id",
    "add_cross_attention", "bad_words_ids", "begin_suppress_tokens", "chunk_size_feed_forward",
    "cross_attention_hidden_size", "diversity_penalty", "do_sample", "early_stopping",
    "encoder_no_repeat_ngram_size", "exponential_decay_length_penalty", "finetuning_task",
    "forced_bos_token_id", "forced_eos_token_id", "id2label", "is_decoder", "is_encoder_decoder", "label2id",
    "length_penalty", "max_length", "min_length", "no_repeat_ngram_size", "num_beam_groups", "num_beams",
    "num_return_sequences", "output_attentions", "output_hidden_states", "output_scores", "prefix",
    "problem_type", "pruned_heads", "remove_invalid_values", "repetition_penalty", "return_dict",
    "return_dict_in_generate", "suppress_tokens", "task_specific_params", "temperature", "tf_legacy_loss",
    "tie_encoder_decoder", "tokenizer_class", "top_k", "top_p", "torchscript", "typical_p", "use_bfloat16",
})


def nxdi_layer_types(num_hidden_layers: int) -> list[str]:
    """What NxDI's GPT-OSS computes, whatever ``layer_types`` says: every even layer (0, 2, …)
    slides its attention window, every odd layer attends fully."""
    return [SLIDING_ATTENTION if layer % 2 == 0 else FULL_ATTENTION for layer in range(num_hidden_layers)]


class ConfigFieldError(ValueError):
    """A ``config.json`` field needed for the namespace is missing, not an integer, or out of
    1 … 2^31 (``reason``: ``bad_field`` or ``out_of_range``)."""

    def __init__(self, field: str, problem: str, reason: str = "bad_field") -> None:
        super().__init__(f"{field}: {problem}")
        self.field = field
        self.problem = problem
        self.reason = reason


def dims_from_config(config: Mapping[str, Any]) -> ModelDims:
    """Read the model dimensions from a parsed ``config.json``.

    Raises ``ConfigFieldError`` naming the first field that is missing, is not an integer
    (booleans and floats are refused: a dimension of ``2880.0`` is a broken config) or lies
    outside 1 … 2^31 (checked before anything computes with it), or when more experts per token
    are asked for than the layer has.
    """
    values: dict[str, int] = {}
    for field in ModelDims.__dataclass_fields__:
        names = CONFIG_FIELD_ALIASES.get(field, (field,))
        present = [name for name in names if name in config]
        if not present:
            raise ConfigFieldError(field, "missing")
        value = config[present[0]]
        if type(value) is not int:
            shown = repr(value) if isinstance(value, (str, float, bool, type(None))) else type(value).__name__
            raise ConfigFieldError(present[0], f"must be a positive integer, found {shown[:80]}")
        if not 1 <= value <= MAX_DIMENSION:
            shown = repr(value) if abs(value) < 10**30 else f"an integer of {value.bit_length():,} bits"
            raise ConfigFieldError(present[0], f"must be an integer in 1 … 2^31, found {shown}", "out_of_range")
        values[field] = value
    if values["num_experts_per_tok"] > values["num_local_experts"]:
        raise ConfigFieldError(
            "num_experts_per_tok",
            f"is {values['num_experts_per_tok']}, more than num_local_experts ({values['num_local_experts']}): "
            "a token cannot be routed to more experts than the layer has",
        )
    return ModelDims(**values)


def profile_for_dims(dims: ModelDims) -> str:
    """The name of the published profile with exactly these dimensions, else ``custom``."""
    for name, profile in PROFILES.items():
        if profile == dims:
            return name
    return PROFILE_CUSTOM


@dataclass(frozen=True)
class TensorSpec:
    """One tensor the format requires: its name, shape and safetensors dtype."""

    name: str
    shape: tuple[int, ...]
    dtype: str

    @property
    def numel(self) -> int:
        return math.prod(self.shape)

    @property
    def nbytes(self) -> int:
        return self.numel * DTYPE_BITS[self.dtype] // 8


# Bits per element of every safetensors dtype; the header reader and the format share it.
DTYPE_BITS: dict[str, int] = {
    "BOOL": 8, "U8": 8, "I8": 8, "F8_E5M2": 8, "F8_E4M3": 8, "F8_E8M0": 8,
    "I16": 16, "U16": 16, "F16": 16, "BF16": 16,
    "I32": 32, "U32": 32, "F32": 32,
    "I64": 64, "U64": 64, "F64": 64, "C64": 64,
    "F4": 4, "F6_E2M3": 6, "F6_E3M2": 6,
}


@dataclass(frozen=True)
class Layout:
    """Everything that fixes the namespace: the model dimensions and the padded sizes."""

    dims: ModelDims
    padded_hidden_size: int
    padded_intermediate_size: int

    @classmethod
    def unpadded(cls, dims: ModelDims) -> Layout:
        return cls(dims, dims.hidden_size, dims.intermediate_size)

    def padding_problems(self) -> list[str]:
        """Why these padded sizes are not allowed (empty when they are)."""
        problems = []
        for label, padded, base in (
            ("padded_hidden_size", self.padded_hidden_size, self.dims.hidden_size),
            ("padded_intermediate_size", self.padded_intermediate_size,
             self.dims.intermediate_size),
        ):
            if padded < base:
                problems.append(f"{label}={padded} is smaller than the model's {base}")
            elif (padded - base) % PAD_MULTIPLE:
                problems.append(
                    f"{label}={padded} exceeds {base} by {padded - base}, "
                    f"not a multiple of {PAD_MULTIPLE}"
                )
        return problems


def layer_prefix(layer: int) -> str:
    return f"layers.{layer}."


def global_specs(layout: Layout) -> list[TensorSpec]:
    d, hp = layout.dims, layout.padded_hidden_size
    return [
        TensorSpec("embed_tokens.weight", (d.vocab_size, hp), BF16),
        TensorSpec("lm_head.weight", (d.vocab_size, hp), BF16),
        TensorSpec("norm.weight", (hp,), BF16),
    ]


def layer_specs(layout: Layout, layer: int) -> list[TensorSpec]:
    """The 19 tensors of decoder layer ``layer``, in the order of the namespace table of docs/format.md."""
    d, hp, ip = layout.dims, layout.padded_hidden_size, layout.padded_intermediate_size
    q, kv, e = d.num_attention_heads * d.head_dim, d.num_key_value_heads * d.head_dim, d.num_local_experts
    rows = [
        ("input_layernorm.weight", (hp,), BF16),
        ("post_attention_layernorm.weight", (hp,), BF16),
        ("self_attn.q_proj.weight", (q, hp), BF16),
        ("self_attn.q_proj.bias", (q,), BF16),
        ("self_attn.k_proj.weight", (kv, hp), BF16),
        ("self_attn.k_proj.bias", (kv,), BF16),
        ("self_attn.v_proj.weight", (kv, hp), BF16),
        ("self_attn.v_proj.bias", (kv,), BF16),
        ("self_attn.o_proj.weight", (hp, q), BF16),
        ("self_attn.o_proj.bias", (hp,), BF16),
        ("self_attn.learned_sinks.sink", (d.num_attention_heads,), BF16),
        ("feed_forward.moe.router.linear_router.weight", (e, hp), BF16),
        ("feed_forward.moe.router.linear_router.bias", (e,), BF16),
        (f"{GATE_UP}.weight", (e, hp, 2 * ip), F8_E4M3),
        (f"{GATE_UP}.scale", (e, 1, 2 * ip), F32),
        (f"{GATE_UP}.bias", (e, 2 * ip), BF16),
        (f"{DOWN}.weight", (e, ip, hp), F8_E4M3),
        (f"{DOWN}.scale", (e, 1, hp), F32),
        (f"{DOWN}.bias", (e, hp), BF16),
    ]
    prefix = layer_prefix(layer)
    return [TensorSpec(prefix + name, shape, dtype) for name, shape, dtype in rows]


def expected_namespace(layout: Layout) -> dict[str, TensorSpec]:
    """Every tensor of a valid checkpoint with this layout, keyed by name (global first).

    A fresh dict each call (the caller may change it) of the specs derived once per layout."""
    return dict(_namespace_of(layout))


@functools.lru_cache(maxsize=8)
def _namespace_of(layout: Layout) -> dict[str, TensorSpec]:
    """``expected_namespace`` derived once per layout (a hashable frozen dataclass; the specs
    are frozen too): never modified, only copied."""
    specs = global_specs(layout)
    for layer in range(layout.dims.num_hidden_layers):
        specs.extend(layer_specs(layout, layer))
    return {spec.name: spec for spec in specs}


def expected_total_size(layout: Layout) -> int:
    return sum(spec.nbytes for spec in expected_namespace(layout).values())


def scale_key_for(weight_key: str) -> str | None:
    """The sidecar scale key of an FP8 expert weight key (``…proj.weight`` → ``…proj.scale``)."""
    if weight_key.endswith(".weight"):
        return weight_key[: -len("weight")] + "scale"
    return None


def weight_key_for(scale_key: str) -> str | None:
    if scale_key.endswith(".scale"):
        return scale_key[: -len("scale")] + "weight"
    return None


def is_expert_scale(key: str) -> bool:
    return key.endswith((f"{GATE_UP}.scale", f"{DOWN}.scale"))


# Index metadata (docs/format.md, Index metadata): field → required type. Optional fields are listed separately.
REQUIRED_METADATA: dict[str, type] = {
    "format": str,
    "format_version": int,
    "total_size": int,
    "model_profile": str,
    "padded_hidden_size": int,
    "padded_intermediate_size": int,
    "quantization_type": str,
    "quantization_dtype": str,
    "fp8_max": float,
}
OPTIONAL_METADATA: dict[str, type] = {"shard_sha256": dict, "source": dict, "target": str}


def index_metadata(
    layout: Layout,
    profile: str,
    *,
    shard_sha256: Mapping[str, str] | None = None,
    source: Mapping[str, Any] | None = None,
    target: str | None = None,
) -> dict[str, Any]:
    """The index ``metadata`` object a writer emits for a checkpoint with this layout
    (``target``: the ``targets.TARGETS`` name it was converted for, if any)."""
    metadata: dict[str, Any] = {
        "format": FORMAT_NAME,
        "format_version": FORMAT_VERSION,
        "total_size": expected_total_size(layout),
        "model_profile": profile,
        "padded_hidden_size": layout.padded_hidden_size,
        "padded_intermediate_size": layout.padded_intermediate_size,
        "quantization_type": QUANTIZATION_TYPE,
        "quantization_dtype": QUANTIZATION_DTYPE,
        "fp8_max": FP8_MAX,
    }
    if shard_sha256 is not None:
        metadata["shard_sha256"] = dict(shard_sha256)
    if source is not None:
        metadata["source"] = dict(source)
    if target is not None:
        metadata["target"] = target
    return metadata


def hf_config(dims: ModelDims, **extra: Any) -> dict[str, Any]:
    """A complete GPT-OSS ``config.json`` for a normalized checkpoint with these dimensions.

    Besides the dimensions it carries the fields NxDI's GPT-OSS config requires (rope settings,
    pad token, ...) with the published models' values; ``extra`` overrides any of them. Its
    ``quantization_config`` names this format, so no tool mistakes the FP8 bytes for MXFP4.
    """
    config: dict[str, Any] = {
        "architectures": [ARCHITECTURE],
        "model_type": MODEL_TYPE,
        "torch_dtype": "bfloat16",
        "tie_word_embeddings": False,
        "attention_bias": True,
        "hidden_act": "silu",
        "initial_context_length": 4096,
        "max_position_embeddings": 131072,
        "rms_norm_eps": 1e-05,
        "rope_theta": 150000,
        "rope_scaling": {
            "beta_fast": 32.0, "beta_slow": 1.0, "factor": 32.0,
            "original_max_position_embeddings": 4096, "rope_type": "yarn", "truncate": False,
        },
        "swiglu_limit": 7.0,
        "pad_token_id": dims.vocab_size - 1,
        "eos_token_id": dims.vocab_size - 2,
        **dims.as_dict(),
        "experts_per_token": dims.num_experts_per_tok,
        "layer_types": nxdi_layer_types(dims.num_hidden_layers),
        "quantization_config": {
            "quant_method": QUANT_METHOD,
            "quantization_type": QUANTIZATION_TYPE,
            "quantization_dtype": QUANTIZATION_DTYPE,
            "fp8_max": FP8_MAX,
        },
    }
    config.update(extra)
    return config
