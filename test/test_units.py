"""How counts, byte sizes and durations read on the command line."""

from __future__ import annotations

import pytest

from nxdi_gptoss_fp8.units import format_bytes, format_duration, plural


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
