"""What a checkpoint that is not the normalized format looks like, and the advice for each.

``format.py`` says what a normalized checkpoint holds; this module says what the names that do not
belong in one are (entries NxDI derives at load, Hugging Face and legacy names, stray scales), the
gate/up split facts of compressed-tensors sources, and the one wording of what to do instead,
shared by the namespace findings, ``inspect`` and the NxDI hook's refusals. Stdlib only.
"""

from __future__ import annotations

import re
from typing import Any

from . import format as fmt

__all__ = [
    "ADVICE_HF_LOAD", "ADVICE_LEGACY_LOAD", "CONVERT_COMMAND", "CT_GATE_UP_SPLITS", "CT_SPLIT_HALVES", "CT_SPLIT_HELP",
    "CT_SPLIT_INTERLEAVED", "HF_HINT", "LEGACY_HINT", "convert_advice", "ct_known_split", "derived_reason",
    "foreign_name", "hinted_names", "is_stray_scale",
]


# Entries NxDI's conversion derives from the runtime config (docs/format.md, Entries that are never stored): never stored.
_DERIVED_PATTERNS: tuple[tuple[re.Pattern[str], str], ...] = (
    (re.compile(r"^rank_util\.rank$"), "derived from tp_degree"),
    (re.compile(r"^layers\.\d+\.self_attn\.rank_util\.rank$"), "derived from tp_degree"),
    (re.compile(r"^embed_tokens\.rank_util\.rank$"), "derived from vocab_parallel"),
    (re.compile(r"^layers\.\d+\.self_attn\.tkg_learned_sinks\.sink$"),
     "derived when attention_dp_degree != cp_degree"),
    (re.compile(r"^lm_head\.bias$"), "derived from NxDI's lm_head padding rule"),
    (re.compile(r"^layers\.\d+\.self_attn\.Wqkv\.(weight|bias|scale)$"), "derived from fused_qkv"),
    (re.compile(r"(^|\.)(input_layernorm|post_attention_layernorm|norm)\.weight_unpadded$"),
     "derived from the padded sizes"),
)


def derived_reason(key: str) -> str | None:
    """Why ``key`` is a runtime-derived entry that must not be stored, or None."""
    for pattern, reason in _DERIVED_PATTERNS:
        if pattern.search(key):
            return reason
    return None


# What to do with a checkpoint that is not normalized: the one wording shared by the namespace
# findings (``foreign_name``), ``inspect`` and the NxDI hook's refusals (``recognize``).
CONVERT_COMMAND = "nxdi-gptoss-fp8 convert"
ADVICE_HF_LOAD = "unset CHECKPOINT_FORMAT (or set it to hf) to load it with NxDI's HF converter"
ADVICE_LEGACY_LOAD = (
    "set CHECKPOINT_FORMAT=legacy (any value other than hf/normalized_fp8) to use NxDI's legacy converter"
)


def convert_advice(src: str = "SRC") -> str:
    """``convert it with `nxdi-gptoss-fp8 convert SRC OUT```: the command that makes a normalized checkpoint."""
    return f"convert it with `{CONVERT_COMMAND} {src} OUT`"


# compressed-tensors sources: how their gate_up_proj was cut into gate_proj / up_proj
CT_SPLIT_INTERLEAVED = "interleaved"
CT_SPLIT_HALVES = "halves"
CT_GATE_UP_SPLITS = (CT_SPLIT_INTERLEAVED, CT_SPLIT_HALVES)
CT_SPLIT_HELP = (
    "--ct-gate-up-split (gate_up_split=) 'halves' if llm-compressor 0.12.0 to 0.13.0 made it (its generic expert "
    "linearizer cut gate_up_proj into column halves), 'interleaved' if an earlier or later version did (even/odd "
    "columns); if unsure, compare one expert's output with the source model's"
)


def ct_known_split(transformers_version: Any, nested: bool) -> tuple[str | None, str]:
    """The gate/up split of a compressed-tensors checkpoint when its files tell it, and why:
    ``experts.experts.E`` names (llm-compressor 0.10–0.11) or ``transformers_version`` < 5 mean
    even/odd; otherwise (None, "") — only the user can say (``CT_SPLIT_HELP``)."""
    if nested:
        return CT_SPLIT_INTERLEAVED, "experts.experts.E names (llm-compressor 0.10–0.11) split even/odd"
    match = re.match(r"(\d+)\.", str(transformers_version if transformers_version is not None else ""))
    if match and int(match.group(1)) < 5:
        return CT_SPLIT_INTERLEAVED, f"transformers_version {transformers_version} (< 5) means even/odd"
    return None, ""


# The namespace findings' hint when the directory is not one ``recognize`` names (it names the
# kind when it can: validate.foreign.foreign_recognition); only HF MXFP4 also loads with NxDI's HF converter.
HF_HINT = (f"this looks like a Hugging Face checkpoint: {convert_advice()} (if it is HF MXFP4, you can also "
           f"{ADVICE_HF_LOAD}; HF BF16 and compressed-tensors it cannot load)")
LEGACY_HINT = f"this looks like an NxDI legacy (block.N.*) checkpoint: {ADVICE_LEGACY_LOAD}"
_FOREIGN_PATTERNS: tuple[tuple[re.Pattern[str], str, str], ...] = (
    (re.compile(r"^model\."), "hf_name", HF_HINT),
    (re.compile(r"_(blocks|scales)$"), "hf_name", HF_HINT),
    (re.compile(r"\.mlp\.(experts|router)\."), "hf_name", HF_HINT),
    (re.compile(r"\.self_attn\.sinks$"), "hf_name", HF_HINT),
    (re.compile(r"^block\.\d+\."), "legacy_name", LEGACY_HINT),
    (re.compile(r"^(embedding|unembedding)\.weight$|^norm\.scale$"), "legacy_name", LEGACY_HINT),
)


def foreign_name(key: str) -> tuple[str, str] | None:
    """(code, hint) when ``key`` is an HF or legacy GPT-OSS name rather than a normalized one."""
    for pattern, code, hint in _FOREIGN_PATTERNS:
        if pattern.search(key):
            return code, hint
    return None


# Every name derived_reason, foreign_name or is_stray_scale can say something about contains
# one of these (a superset test, exact tests follow per candidate).
_HINT_CANDIDATE = re.compile(r"rank_util|sink|lm_head|Wqkv|unpadded|model\.|_blocks|_scales|\.mlp\.|block\.|embedding|norm|(?i:scale)")


def hinted_names(keys: set[str]) -> set[str]:
    """The members of ``keys`` that may be derived, HF, legacy or stray-scale names.

    One regular-expression scan over the joined names (C speed), so an index of millions of
    plain phantom names costs no Python work per name.
    """
    if len(keys) < 1000:
        return {key for key in keys if _HINT_CANDIDATE.search(key)}
    joined = "\n".join(keys)
    if joined.count("\n") != len(keys) - 1:  # a name holding a newline: test one by one
        return {key for key in keys if _HINT_CANDIDATE.search(key)}
    found = set()
    for match in _HINT_CANDIDATE.finditer(joined):
        start = joined.rfind("\n", 0, match.start()) + 1
        end = joined.find("\n", match.end())
        found.add(joined[start:end if end >= 0 else len(joined)])
    return found


def is_stray_scale(key: str) -> bool:
    """A ``*scale*`` tensor (anywhere in the name, any case: ``.SCALE``, ``.scale.weight``) that is
    not one of the two expert ``.scale`` sidecars of a layer."""
    return "scale" in key.lower() and not fmt.is_expert_scale(key)
