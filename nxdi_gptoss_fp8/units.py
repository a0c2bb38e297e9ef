"""How the command line writes counts, byte sizes and durations, in one place. Stdlib only.

Byte sizes are decimal everywhere (kB, MB, GB: powers of 1000, as ``--max-shard-size`` reads
them); durations are milliseconds under one second and seconds from one second on.
"""

from __future__ import annotations

__all__ = ["format_bytes", "format_duration", "plural"]


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
