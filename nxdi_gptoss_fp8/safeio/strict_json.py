"""Strict, bounded JSON parsing for every JSON input (stdlib only).

Python's ``json`` module is lenient where a fail-closed reader must not be: a repeated key
silently keeps the last value, ``NaN``/``Infinity`` are accepted, ``-0`` becomes the integer
0, an integer literal may run to thousands of digits, and nesting is limited only by the
interpreter's recursion limit. ``parse_json_strict`` refuses all of that with a ``JsonError``
carrying a stable ``code``:

- ``duplicate_key``: a key repeated in one object (at any depth);
- ``invalid_json``: not JSON, a non-standard constant, a lone UTF-16 surrogate;
- ``too_large``: more than ``max_bytes`` bytes of text;
- ``too_deep``: nested deeper than ``max_depth`` arrays/objects;
- ``number_too_large``: an integer literal of more than ``max_int_digits`` digits (no such
  integer is ever built, so no arithmetic or message can choke on it).

NxDI's own files are the one exception, by name: ``InferenceConfig.to_json_string`` writes
NeuronConfig with ``json.dumps``, so a compiled model's ``neuron_config.json`` holds
``Infinity`` (``quantize_clamp_bound``'s default) and may hold ``-Infinity`` or ``NaN``. Only
a caller reading such a file passes ``nxdi_constants=True`` (``NXDI_CONSTANTS``); every
checkpoint file (``config.json``, the index, headers, the manifest) stays strict.

Numbers that are not plain integers (``-0``, ``0.0``, ``1e2``, ``-0.0``) are kept as
``NonInteger`` values holding their literal text when ``mark_non_integers`` is set: the
safetensors header reader refuses them exactly where the reference parser would.
"""

from __future__ import annotations

import json
from typing import Any

from ..errors import NxdiGptossFp8Error

__all__ = ["MAX_DEPTH", "MAX_INT_DIGITS", "NXDI_CONSTANTS", "JsonError", "NonInteger", "parse_json_strict"]

MAX_DEPTH = 64
MAX_INT_DIGITS = 19  # |n| < 10^19: every int64/uint64 a real config or header holds
_CONTAINERS = (dict, list)
# the constants Python's json.dumps writes for non-finite floats (and so NxDI's config files)
NXDI_CONSTANTS = {"Infinity": float("inf"), "-Infinity": float("-inf"), "NaN": float("nan")}


class JsonError(NxdiGptossFp8Error, ValueError):
    """A JSON text that a strict reader refuses; ``code`` names the rule it breaks.

    One of the package's errors (``NxdiGptossFp8Error``) and, as before, a ``ValueError``."""

    def __init__(self, code: str, message: str, key: str | None = None) -> None:
        super().__init__(message)
        self.code = code
        self.key = key


class NonInteger(str):
    """A JSON number literal that is not a plain integer (``-0``, ``1.5``, ``1e2``), as written."""

    def __repr__(self) -> str:
        return str(self)


def _reject_constant(name: str) -> Any:
    raise JsonError("invalid_json", f"JSON contains the non-standard constant {name}")


def _nxdi_constant(name: str) -> Any:
    return NXDI_CONSTANTS[name]


def parse_json_strict(
    text: str,
    *,
    what: str = "header",
    max_bytes: int | None = None,
    max_depth: int | None = MAX_DEPTH,
    max_int_digits: int = MAX_INT_DIGITS,
    mark_non_integers: bool = False,
    int_hook: bool = True,
    nxdi_constants: bool = False,
) -> Any:
    """Parse ``text`` as strict JSON (see the module docstring); ``what`` names it in messages.

    ``max_depth=None`` leaves nesting to the interpreter's recursion limit (``too_deep`` too);
    ``int_hook=False`` parses integers at C speed, without the digit bound or ``-0`` marking
    (for a caller that bounds every integer itself and knows the text holds no ``-0``);
    ``nxdi_constants=True`` reads ``Infinity``, ``-Infinity`` and ``NaN`` as the floats NxDI
    wrote (its NeuronConfig files only; everything else refuses them).

    Raises ``JsonError`` with code ``duplicate_key``, ``invalid_json``, ``too_large``,
    ``too_deep`` or ``number_too_large``.
    """
    if max_bytes is not None and len(text) > max_bytes:
        raise JsonError("too_large", f"{what} is {len(text):,} characters, above the {max_bytes:,} limit")

    def pairs_hook(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
        result = dict(pairs)
        if len(result) != len(pairs):
            seen: set[str] = set()
            for key, _ in pairs:
                if key in seen:
                    raise JsonError("duplicate_key", f"{what} JSON repeats the key {key[:200]!r}", key[:200])
                seen.add(key)
        return result

    def parse_int(literal: str) -> Any:
        digits = len(literal) - literal.startswith("-")
        if digits > max_int_digits:
            raise JsonError("number_too_large", f"{what} JSON holds an integer of {digits:,} digits (at most {max_int_digits} are read)")
        if mark_non_integers and literal.startswith("-") and literal.strip("-0") == "":
            return NonInteger(literal)  # -0: serde_json reads it as the float -0.0
        return int(literal)

    def parse_float(literal: str) -> Any:
        return NonInteger(literal[:40]) if mark_non_integers else float(literal)

    try:
        document = json.loads(text, object_pairs_hook=pairs_hook, parse_constant=_nxdi_constant if nxdi_constants else _reject_constant,
                              parse_int=parse_int if int_hook else None, parse_float=parse_float)
        if "\\u" in text:
            # only a \u escape can smuggle in a lone UTF-16 surrogate, which no file name or
            # output stream can encode (strict JSON parsers reject it too)
            json.dumps(document, ensure_ascii=False).encode("utf-8")
    except JsonError:
        raise
    except RecursionError:
        raise JsonError("too_deep", f"{what} JSON is nested too deeply to be valid") from None
    except UnicodeEncodeError:
        raise JsonError("invalid_json", f"{what} JSON escapes a lone UTF-16 surrogate, which is not text") from None
    except ValueError as exc:  # JSONDecodeError
        raise JsonError("invalid_json", f"{what} is not valid JSON: {str(exc)[:200]}") from None
    if max_depth is not None and _depth_exceeds(document, max_depth):
        raise JsonError("too_deep", f"{what} JSON is nested more than {max_depth} levels deep")
    return document


def _depth_exceeds(document: Any, limit: int) -> bool:
    """Whether ``document`` nests containers more than ``limit`` deep (C-speed scan per level)."""
    level = [document] if isinstance(document, _CONTAINERS) else []
    depth = 0
    while level:
        depth += 1
        if depth > limit:
            return True
        below: list[Any] = []
        for container in level:
            values = container.values() if type(container) is dict else container
            if dict in (kinds := set(map(type, values))) or list in kinds:
                below.extend(v for v in values if type(v) is dict or type(v) is list)
        level = below
    return False
