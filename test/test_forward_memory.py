"""The memory ``check-forward`` states and checks before it runs."""

from __future__ import annotations

import itertools

import pytest

from nxdi_gptoss_fp8 import format as fmt
from nxdi_gptoss_fp8.errors import CpuModelError
from nxdi_gptoss_fp8.forward.memory import check_memory, forward_memory

GIB = 1 << 30
SEQ = 128  # the context a gpt-oss check runs (one sliding window)


def layout(profile: str, **padding: int) -> fmt.Layout:
    dims = fmt.PROFILES[profile]
    return fmt.Layout(dims, padding.get("hidden", dims.hidden_size), padding.get("inter", dims.intermediate_size))


@pytest.mark.parametrize("profile", [fmt.PROFILE_20B, fmt.PROFILE_120B])
def test_each_further_layer_adds_little(profile: str) -> None:
    needs = [forward_memory(layout(profile), k, SEQ).total for k in (1, 2, 3, fmt.PROFILES[profile].num_hidden_layers)]
    steps = [b - a for a, b in itertools.pairwise(needs[:3])]
    assert all(0 < step <= 0.3 * GIB for step in steps)
    assert needs[-1] - needs[0] <= 0.3 * GIB * (fmt.PROFILES[profile].num_hidden_layers - 1)


def test_every_20b_layer_and_one_120b_layer_fit_a_24_gb_host() -> None:
    assert forward_memory(layout(fmt.PROFILE_20B), 24, SEQ).total < 24 * GIB
    assert forward_memory(layout(fmt.PROFILE_120B), 1, SEQ).total < 24 * GIB


def test_padding_counts_on_the_nxdi_side() -> None:
    plain, padded = forward_memory(layout(fmt.PROFILE_20B), 2, SEQ), forward_memory(
        layout(fmt.PROFILE_20B, hidden=3072, inter=3072), 2, SEQ)
    assert padded.nxdi > plain.nxdi and padded.reference == plain.reference


def test_the_check_says_what_it_needs_and_what_the_host_offers() -> None:
    need = forward_memory(layout(fmt.PROFILE_20B), 2, SEQ)
    assert check_memory(need, (need.total + 1, "MemAvailable")).startswith(f"needs {need.render()}; MemAvailable offers")
    assert "unknown" in check_memory(need, (None, "MemAvailable"))
    with pytest.raises(CpuModelError, match=r"and MemAvailable offers 1\.00 GB: free memory or check fewer layers"):
        check_memory(need, (1_000_000_000, "MemAvailable"))
