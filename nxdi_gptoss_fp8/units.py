"""How the package writes counts, byte sizes, durations and untrusted names as text, and reads a
byte size back, in one place. Stdlib only (and the format's byte-count bound).

Byte sizes are decimal everywhere (kB, MB, GB: powers of 1000, as ``--max-shard-size`` reads
them, with KiB … TiB also read); durations are milliseconds under one second and seconds from one
second on; a name read from disk is escaped (``printable``) before it reaches a terminal.
"""

from __future__ import annotations

import math
import re

from .format import MAX_BYTE_COUNT

__all__ = ["format_bytes", "format_duration", "parse_size", "plural", "printable"]


def plural(count: int, word: str, words: str | None = None) -> str:
    """``plural(1, "error")`` → "1 error"; ``plural(2, "error")`` → "2 errors" (thousands separated)."""
    return f"{count:,} {word if count == 1 else (words or word + 's')}"


def format_bytes(count: float) -> str:
    """A byte count in decimal units: "512 B", "15.9 kB", "3.20 GB"."""
    if count < 1000:
        return f"{int(count)} B"
    for unit, factor in (("kB", 1e3), ("MB", 1e6), ("GB", 1e9), ("TB", 1e12)):
        value = count / factor
        if value < 999.5 or unit == "TB":
            return f"{value:.2f} {unit}" if value < 10 else f"{value:.1f} {unit}" if value < 100 else f"{value:.0f} {unit}"
    raise AssertionError("unreachable")


def format_duration(seconds: float) -> str:
    """"0.8 ms", "412 ms", "1.25 s", "73.4 s": milliseconds below one second, seconds above."""
    if seconds < 0.9995:
        ms = seconds * 1000
        return f"{ms:.1f} ms" if ms < 100 else f"{ms:.0f} ms"
    return f"{seconds:.2f} s" if seconds < 10 else f"{seconds:.1f} s"


def parse_size(text: str | int) -> int:
    """``"5GB"`` → 5_000_000_000; accepts KB/MB/GB/TB (powers of 1000) and KiB/MiB/GiB/TiB.

    The result is a whole number of bytes in 1 … 2^53 (the format's byte-count bound); anything
    else (zero, negative, ``1e999``, ``nan``, a 30-digit number) is a ``ValueError`` naming the text."""
    units = {"": 1, "B": 1, "KB": 10**3, "MB": 10**6, "GB": 10**9, "TB": 10**12,
             "KIB": 2**10, "MIB": 2**20, "GIB": 2**30, "TIB": 2**40}
    if isinstance(text, int) and not isinstance(text, bool):
        value, unit = float(text) if abs(text) < 2**63 else math.inf, ""
    else:
        stripped = str(text).strip().upper().replace(" ", "")[:64]
        number = stripped.rstrip("KMGTIB")
        unit = stripped[len(number):]
        try:
            value = float(number) if re.fullmatch(r"[0-9]+(\.[0-9]*)?|\.[0-9]+", number) else -1.0
        except ValueError:
            value = -1.0
    if unit not in units or value <= 0:
        raise ValueError(f"cannot read a size from {str(text)[:40]!r} (examples: 5GB, 500MB, 2GiB)")
    size = value * units[unit]
    if not math.isfinite(size) or size > MAX_BYTE_COUNT or size < 1:
        raise ValueError(f"size {str(text)[:40]!r} is outside 1 B … 2^53 bytes (examples: 5GB, 500MB, 2GiB)")
    return int(size)


def _escape(char: str) -> str:
    code = ord(char)
    if 0xDC80 <= code <= 0xDCFF:  # a byte that is not UTF-8, as Python decodes a path (surrogateescape)
        return f"\\x{code - 0xDC00:02x}"
    return f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}" if code < 0x10000 else f"\\U{code:08x}"


def printable(text: str) -> str:
    """``text`` with every character a terminal acts on or hides escaped (``\\x1b``, ``\\r``,
    ``\\u202e``...): names come from the checkpoint, and a shard or tensor name holding a carriage
    return, an ANSI escape or a line break must not forge, recolour or hide a line of the verdict.
    A byte of a path that is not UTF-8 (decoded by Python as a lone surrogate) shows as ``\\xNN``."""
    if text.isprintable():
        return text
    return "".join(char if char.isprintable() else _escape(char) for char in text)
