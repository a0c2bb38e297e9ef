"""The padding geometry (``padding.py``): where H → H' and INTER → INTER' put zeros, tensor by tensor."""

from __future__ import annotations

import subprocess
import sys

import pytest

from nxdi_gptoss_fp8 import format as fmt
from nxdi_gptoss_fp8.padding import Region, padding_region
from nxdi_gptoss_fp8.synthetic.tiny_stdlib import TINY_DIMS

H, INTER = TINY_DIMS.hidden_size, TINY_DIMS.intermediate_size
PADDED = fmt.Layout(TINY_DIMS, H + 32, INTER + 64)


@pytest.mark.parametrize(("name", "shape", "region"), [
    (f"layers.0.{fmt.GATE_UP}.weight", (4, H + 32, 2 * (INTER + 64)),
     Region(H, ((INTER, INTER + 64), (INTER + 64 + INTER, 2 * (INTER + 64))))),
    (f"layers.0.{fmt.DOWN}.weight", (4, INTER + 64, H + 32), Region(INTER, ((H, H + 32),))),
    (f"layers.0.{fmt.GATE_UP}.bias", (4, 2 * (INTER + 64)),  # [experts, cols]: every row real
     Region(4, ((INTER, INTER + 64), (INTER + 64 + INTER, 2 * (INTER + 64))))),
    ("layers.0.self_attn.o_proj.weight", (H + 32, 64), Region(H, ())),
    ("embed_tokens.weight", (128, H + 32), Region(128, ((H, H + 32),))),
    (f"layers.0.{fmt.GATE_UP}.scale", (4, 1, 2 * (INTER + 64)), None),
    ("layers.0.self_attn.sinks", (4,), None),
])
def test_padding_regions_of_a_padded_layout(name: str, shape: tuple[int, ...], region: Region | None) -> None:
    assert padding_region(name, shape, PADDED) == region


def test_an_unpadded_layout_has_no_padding() -> None:
    layout = fmt.Layout(TINY_DIMS, H, INTER)
    assert padding_region(f"layers.0.{fmt.DOWN}.weight", (4, INTER, H), layout) is None


def test_the_stdlib_writer_does_not_load_numpy() -> None:
    """The geometry lives outside the deep scan so that the stdlib tiny writer (``demo``) stays stdlib."""
    code = ("import sys; import nxdi_gptoss_fp8.synthetic.tiny_stdlib; "
            "print(sorted(m for m in ('numpy', 'torch') if m in sys.modules))")
    assert subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.strip() == "[]"
