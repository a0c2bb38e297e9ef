"""How counts, byte sizes, durations and names from disk read on the command line, and how a byte
size is read back."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from nxdi_gptoss_fp8 import units
from nxdi_gptoss_fp8.units import format_bytes, format_duration, parse_size, plural, printable


@pytest.mark.parametrize(("count", "text"), [(0, "0 errors"), (1, "1 error"), (2, "2 errors"), (1500, "1,500 errors")])
def test_plural(count: int, text: str) -> None:
    assert plural(count, "error") == text


@pytest.mark.parametrize(("count", "text"), [
    (0, "0 B"), (999, "999 B"), (1000, "1.00 kB"), (15_971, "16.0 kB"), (999_999, "1.00 MB"),
    (3_200_000_000, "3.20 GB"), (119_200_000_000, "119 GB"), (2_500_000_000_000, "2.50 TB"),
])
def test_bytes_are_decimal(count: int, text: str) -> None:
    assert format_bytes(count) == text


@pytest.mark.parametrize(("seconds", "text"), [
    (0.0008, "0.8 ms"), (0.0123, "12.3 ms"), (0.4123, "412 ms"), (0.9999, "1.00 s"), (1.25, "1.25 s"), (73.44, "73.4 s"),
])
def test_durations_switch_to_seconds_at_one_second(seconds: float, text: str) -> None:
    assert format_duration(seconds) == text


@pytest.mark.parametrize(("text", "size"), [("5GB", 5 * 10**9), ("500MB", 5 * 10**8), ("2GiB", 2 * 2**30), ("64KB", 64_000), (123, 123), ("1.5GB", 1_500_000_000)])
def test_parse_size(text: str | int, size: int) -> None:
    assert parse_size(text) == size


@pytest.mark.parametrize("text", ["", "GB", "-5GB", "5XB", "five"])
def test_parse_size_rejects(text: str) -> None:
    with pytest.raises(ValueError):
        parse_size(text)


@pytest.mark.parametrize(("text", "message"), [("0", "cannot read"), ("1e999", "cannot read"), ("nan", "cannot read"),
                                               ("9" * 30, "outside"), ("0.5B", "outside"), (2**60, "outside"),
                                               (10**40, "outside"), (-3, "cannot read")])
def test_parse_size_bounds(text: str | int, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        parse_size(text)


@pytest.mark.parametrize(("text", "shown"), [
    ("model-00001.safetensors", "model-00001.safetensors"), ("a\x1b[31mb", "a\\x1b[31mb"), ("a\rb", "a\\x0db"),
    ("a\u202eb", "a\\u202eb"), ("a\U000e0001b", "a\\U000e0001b"), ("ü", "ü"),
])
def test_printable_escapes_what_a_terminal_acts_on(text: str, shown: str) -> None:
    assert printable(text) == shown and printable(text).isprintable()
COUNTED = ("errors", "warnings", "tensors", "shards", "layers", "ranks", "files", "tokens", "experts", "entries",
           "bytes", "values", "steps", "parameters", "weights", "violations", "workers", "keys", "casts", "items")
# a count written before its noun in an f-string, straight or after one word ("{n} rank files",
# "{n} teacher-forced steps"): "{n} files" reads "1 files" for one
_BARE_COUNT = re.compile(r"\{(?P<expr>[^{}/]+)\} (?:[\w-]+ )?(?P<noun>" + "|".join(COUNTED) + r")\b")


def test_every_count_of_these_nouns_goes_through_plural() -> None:
    """The one place counts are rendered is ``plural``: no message in the package writes
    "{n} errors" itself (which reads "1 errors"). A count after a slash ("3/36 layers", the
    progress descriptions), a bound that is never 1, a joined list of codes, a name and a repr are
    not counts."""
    root = Path(units.__file__).resolve().parent
    bare = []
    for path in sorted(root.rglob("*.py")):
        for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
            for match in _BARE_COUNT.finditer(line):
                expr = match.group("expr")
                if not expr.startswith(("MAX_", "tensors:,")) and not expr.endswith(("name", "!r")) \
                        and "join(" not in expr and f"/{{{expr}}}" not in line:
                    bare.append(f"{path.relative_to(root)}:{number}: {match.group(0)}")
    assert bare == []


@pytest.mark.parametrize("errors, warnings, text", [(1, 0, "FAILED: 1 error, 0 warnings"), (2, 1, "FAILED: 2 errors, 1 warning"),
                                                    (0, 1, "OK: 0 errors, 1 warning")])
def test_the_serving_host_verdict_counts_in_words(errors: int, warnings: int, text: str) -> None:
    from nxdi_gptoss_fp8.nxdi.serving_host import HostFinding, HostReport

    findings = [HostFinding("x", "error", "S", "m")] * errors + [HostFinding("y", "warning", "S", "m")] * warnings
    assert HostReport([], None, findings).render_text().splitlines()[-1].startswith(text)
