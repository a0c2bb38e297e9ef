"""The config.json field rule: every field of a checkpoint's ``config.json`` means what NxDI computes.

``format`` holds the tables (the fields NxDI reads, hard-codes, or ignores; the rotary-scaling
members); this module applies them, field by field (docs/format.md, config.json), and returns the
same ``nxdi_config.Problem`` values as the other config rules. Its own module because it is one
rule over one file, used by the preflight, the converter (refusing a source) and the stdlib tiny
writer, while ``nxdi_config`` reads NxDI's runtime configuration. Stdlib only.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from typing import Any

from .. import format as fmt
from ..units import plural
from .nxdi_config import Problem, bounded_int, describe

__all__ = ["MAX_UNKNOWN_FIELDS", "config_field_problems"]


def _number(value: Any) -> float | None:
    """``value`` as a float when it is a finite JSON number (not a bool), else None."""
    if type(value) is int:
        return float(value) if -(10**300) < value < 10**300 else None
    if type(value) is float and math.isfinite(value):
        return value
    return None


def _equal(value: Any, accepted: Any) -> bool:
    """A config value equals one NxDI hard-codes: same kind (a bool only equals a bool)."""
    if isinstance(accepted, bool) or isinstance(value, bool):
        return value is accepted
    if isinstance(accepted, (int, float)):
        return _number(value) is not None and value == accepted
    return value == accepted


def config_field_problems(config: Mapping[str, Any], dims: fmt.ModelDims | None, *, what: str = fmt.CONFIG_FILE) -> list[Problem]:
    """Every field of ``config.json`` means what NxDI computes (docs/format.md, config.json, field by field).

    A field NxDI reads is bounded (the dimensions, read by ``format.dims_from_config``, are
    checked elsewhere); one it hard-codes must hold NxDI's value or be absent (``hard_coded_mismatch``,
    ``layer_types_mismatch``, ``rope_mismatch``); a known inert field passes; any other field is a
    ``unknown_field`` warning. ``bad_rope``: NxDI's rotary embedding would fail or compute nonsense.
    """
    problems: list[Problem] = []

    def add(reason: str, message: str, key: str, warning: bool = False) -> None:
        problems.append(Problem("config", reason, message, key, warning))

    for field, accepted in fmt.CONFIG_HARD_CODED.items():
        if field in config and not any(_equal(config[field], value) for value in accepted):
            shown = " or ".join(json.dumps(value) for value in accepted)
            add("hard_coded_mismatch", f"{what} has {field}={describe(config[field])}, but {fmt.HARD_CODED_REASONS[field]}: "
                f"set \"{field}\": {shown} or remove it", field)
    if "layer_types" in config and dims is not None:
        problem = _layer_types_problem(config["layer_types"], dims.num_hidden_layers)
        if problem:
            add("layer_types_mismatch", f"{what} has layer_types {problem}, but NxDI's GPT-OSS slides every even layer "
                "(0, 2, …) and attends fully in every odd one, whatever layer_types says: remove layer_types or write "
                f"{plural(dims.num_hidden_layers, 'entry', 'entries')} alternating \"{fmt.SLIDING_ATTENTION}\", \"{fmt.FULL_ATTENTION}\"",
                "layer_types")
    if dims is not None and dims.num_attention_heads % dims.num_key_value_heads:
        add("heads_indivisible", f"{what} has num_attention_heads={dims.num_attention_heads}, not a multiple of "
            f"num_key_value_heads={dims.num_key_value_heads}: grouped-query attention shares each key/value head "
            "between a whole number of query heads", "num_attention_heads")
    pad = config.get("pad_token_id")
    if pad is not None and dims is not None and (type(pad) is not int or not 0 <= pad < dims.vocab_size):
        add("out_of_range", f"{what} has pad_token_id={describe(pad)}, not a token id in 0 … {dims.vocab_size - 1} "
            "(vocab_size - 1) or null", "pad_token_id")
    for field in ("torch_dtype", "dtype"):
        value = config.get(field)
        if value is None or value == "bfloat16":
            continue
        if value in ("float32", "float16"):
            add("dtype_not_bfloat16", f"{what} has {field}={describe(value)}: NxDI then computes in {value} (unless the "
                "neuron config sets torch_dtype and overrides_torch_dtype), while the checkpoint stores BF16", field, warning=True)
        else:
            add("bad_field", f"{what} has {field}={describe(value)}, not a dtype name NxDI knows: write \"bfloat16\"", field)
    problems.extend(_rope_problems(config, dims, what))
    known = fmt.CONFIG_READ_FIELDS | fmt.CONFIG_HARD_CODED.keys() | fmt.CONFIG_INERT_FIELDS | {"layer_types"}
    for field in [key for key in config if key not in known][:MAX_UNKNOWN_FIELDS]:
        add("unknown_field", f"{what} has a field {describe(field)} that NxDI's GPT-OSS does not read and this format "
            "does not know: check that the model does not depend on it, or remove it", str(field)[:200], warning=True)
    return problems


MAX_UNKNOWN_FIELDS = 100


def _layer_types_problem(layer_types: Any, layers: int) -> str | None:
    """How ``layer_types`` differs from what NxDI computes (None: it says the same)."""
    if not isinstance(layer_types, list):
        return f"= {describe(layer_types)}, not a list"
    if len(layer_types) != layers:
        return f"of {plural(len(layer_types), 'entry', 'entries')} for num_hidden_layers={layers}"
    expected = fmt.nxdi_layer_types(layers)
    wrong = [layer for layer, (found, want) in enumerate(zip(layer_types, expected, strict=True)) if found != want]
    if not wrong:
        return None
    first = wrong[0]
    return (f"[{first}] = {describe(layer_types[first])} ({len(wrong)} of {plural(layers, 'layer')} differ), where NxDI computes "
            f"{expected[first]!r}")


def _rope_problems(config: Mapping[str, Any], dims: fmt.ModelDims | None, what: str) -> list[Problem]:
    """The rotary embedding NxDI computes: its own untruncated YaRN from rope_theta,
    initial_context_length and rope_scaling's factor / beta_slow / beta_fast."""
    problems: list[Problem] = []

    def add(reason: str, message: str, key: str, warning: bool = False) -> None:
        problems.append(Problem("config", reason, message, key, warning))

    theta = config.get("rope_theta", 150000.0)
    if _number(theta) is None or theta <= 1:
        add("bad_rope", f"{what} has rope_theta={describe(theta)}: NxDI's rotary embedding needs a finite base above 1 "
            "(the published models use 150000)", "rope_theta")
        theta = None
    context = config.get("initial_context_length")
    if context is None:
        add("bad_field", f"{what} has no initial_context_length: NxDI requires it (the pre-YaRN context length, 4096 "
            "for the published models)", "initial_context_length")
    elif bounded_int(context) is None:
        add("out_of_range", f"{what} has initial_context_length={describe(context)}, not an integer in 1 … 2^31",
            "initial_context_length")
        context = None
    if "rope_scaling" not in config:
        return problems  # transformers' GptOssConfig fills in the published YaRN settings
    scaling = config["rope_scaling"]
    if not isinstance(scaling, Mapping):
        add("bad_rope", f"{what} has rope_scaling={describe(scaling)}: NxDI reads factor, beta_slow and beta_fast from it "
            "and fails without them; remove rope_scaling (transformers then uses the published YaRN settings) or write "
            "the published object", "rope_scaling")
        return problems
    rope_type = scaling.get("rope_type", scaling.get("type"))
    if rope_type != fmt.ROPE_TYPE or ("type" in scaling and "rope_type" in scaling and scaling["type"] != scaling["rope_type"]):
        add("rope_mismatch", f"{what} has rope_scaling.rope_type={describe(rope_type)}, but NxDI's GPT-OSS always applies "
            f"YaRN: set \"rope_type\": \"{fmt.ROPE_TYPE}\"", "rope_scaling.rope_type")
    values: dict[str, float] = {}
    for member, default in (("factor", None), ("beta_fast", None), ("beta_slow", None)):
        value = scaling.get(member, default)
        number = _number(value)
        if number is None or number <= 0 or (member == "factor" and number < 1):
            bound = "at least 1" if member == "factor" else "above 0"
            add("bad_rope", f"{what} has rope_scaling.{member}={describe(value)}: NxDI's YaRN needs a finite number "
                f"{bound} here", f"rope_scaling.{member}")
        else:
            values[member] = number
    for top, member in (("rope_scaling_factor", "factor"), ("rope_ntk_alpha", "beta_slow"), ("rope_ntk_beta", "beta_fast")):
        if top in config and (member not in values or not _equal(config[top], values[member])):
            add("rope_mismatch", f"{what} has {top}={describe(config[top])} beside rope_scaling.{member}="
                f"{describe(scaling.get(member))}: NxDI uses {top}, transformers rope_scaling.{member}; remove {top}",
                top)
    if scaling.get("truncate", True) is not False:  # absent: transformers truncates
        shown = describe(scaling["truncate"]) if "truncate" in scaling else "absent (true to transformers)"
        add("rope_mismatch", f"{what} has rope_scaling.truncate {shown}, but NxDI's YaRN never rounds its correction "
            "range (transformers does unless truncate is false): set \"truncate\": false", "rope_scaling.truncate")
    original = scaling.get("original_max_position_embeddings")
    if original is None:
        original_name = "max_position_embeddings"
        original = config.get("max_position_embeddings", 131072)
    else:
        original_name = "rope_scaling.original_max_position_embeddings"
    if context is not None and bounded_int(context) is not None and not _equal(original, context):
        add("rope_mismatch", f"{what} makes {original_name}={describe(original)} the pre-YaRN context length, but NxDI "
            f"uses initial_context_length={context}: set rope_scaling.original_max_position_embeddings to {context}",
            "rope_scaling.original_max_position_embeddings")
    for member in ("attention_factor", "mscale", "mscale_all_dim"):
        if member in scaling:
            add("rope_mismatch", f"{what} has rope_scaling.{member}={describe(scaling[member])}, but NxDI's YaRN always "
                "scales attention by 0.1·ln(factor) + 1: remove it", f"rope_scaling.{member}")
    for member in [key for key in scaling if key not in fmt.ROPE_SCALING_READ | fmt.ROPE_SCALING_HARD_CODED][:MAX_UNKNOWN_FIELDS]:
        add("unknown_field", f"{what} has rope_scaling.{str(member)[:80]}, which NxDI's YaRN does not read and this "
            "format does not know: remove it", f"rope_scaling.{str(member)[:200]}", warning=True)
    factor = values.get("factor")
    if (factor is not None and factor > 1 and theta is not None and bounded_int(context) is not None and dims is not None
            and "beta_fast" in values and "beta_slow" in values):
        half = dims.head_dim / 2
        low = half * math.log(context / (values["beta_fast"] * 2 * math.pi)) / math.log(theta)
        high = half * math.log(context / (values["beta_slow"] * 2 * math.pi)) / math.log(theta)
        if not 0 < low < high < half - 1:
            add("bad_rope", f"{what}: NxDI's YaRN requires 0 < low < high < head_dim/2 - 1 for its correction range, "
                f"and these settings give low={low:.3g}, high={high:.3g} for head_dim={dims.head_dim} (beta_fast="
                f"{values['beta_fast']:g}, beta_slow={values['beta_slow']:g}, initial_context_length={context}, "
                f"rope_theta={theta:g}): NxDI would stop at its assertion", "rope_scaling")
    return problems
