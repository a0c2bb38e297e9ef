"""Tiny checkpoints without torch: valid, deep-clean, padded correctly, deterministic, torch-free."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from nxdi_gptoss_fp8 import preflight
from nxdi_gptoss_fp8.synthetic.tiny_stdlib import make_tiny_stdlib


@pytest.mark.parametrize("padded", [None, (96, 128)])
def test_valid_and_clean_under_the_deep_scan(tmp_path: Path, padded: tuple[int, int] | None) -> None:
    hp, ip = padded or (None, None)
    out = make_tiny_stdlib(tmp_path / "t", padded_hidden_size=hp, padded_intermediate_size=ip)
    report = preflight(out, allow_custom_model=True, deep=True, verify_checksums=True)
    assert report.ok and not report.warnings, report.render_text()
    assert "deep scan read" in " ".join(f.message for f in report.findings)


def test_deterministic_for_a_seed(tmp_path: Path) -> None:
    def shards(out: str) -> dict[str, bytes]:
        return {p.name: p.read_bytes() for p in sorted(Path(out).glob("*.safetensors"))}

    first, again = make_tiny_stdlib(tmp_path / "a", seed=4), make_tiny_stdlib(tmp_path / "b", seed=4)
    other = make_tiny_stdlib(tmp_path / "c", seed=5)
    assert shards(first) == shards(again) != shards(other)


def test_loads_through_the_loader(tmp_path: Path) -> None:
    torch = pytest.importorskip("torch")
    from nxdi_gptoss_fp8.loader import load_state_dict

    state = load_state_dict(make_tiny_stdlib(tmp_path / "t"), allow_custom_model=True)
    fp8 = [t for t in state.values() if t.dtype == torch.float8_e4m3fn]
    assert fp8 and all(torch.isfinite(t.float()).all() and t.float().abs().max() <= 240 for t in fp8)


def test_bad_padding_is_a_value_error(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="multiple of 32"):
        make_tiny_stdlib(tmp_path / "t", padded_hidden_size=70)


def test_imports_neither_torch_nor_numpy(tmp_path: Path) -> None:
    code = ("import sys\nfor name in ('torch', 'numpy', 'safetensors'):\n    sys.modules[name] = None\n"
            "from nxdi_gptoss_fp8.synthetic.tiny_stdlib import make_tiny_stdlib\n"
            f"print(make_tiny_stdlib({str(tmp_path / 't')!r}))")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert preflight(result.stdout.strip(), allow_custom_model=True).ok
