"""Shared fixtures: tiny valid checkpoints, made once per session and copied per test."""

from __future__ import annotations

import shutil
import sys
from pathlib import Path

import pytest
from hypothesis import HealthCheck, settings

from nxdi_gptoss_fp8.synthetic.tiny import make_tiny

# the benchmark helpers in scripts/ (e.g. sparse_checkpoint) are importable from tests
sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "scripts"))
# the test helpers (ckpt_edit, corpus, fuzz_targets, the NxDI stand-in) live in test/support/
sys.path.insert(0, str(Path(__file__).resolve().parent / "support"))

settings.register_profile(
    "ci", max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow]
)
settings.load_profile("ci")


@pytest.fixture(scope="session")
def tiny_template(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A valid tiny (custom-profile) checkpoint; never modify it, copy it (``tiny_checkpoint``)."""
    return Path(make_tiny(tmp_path_factory.mktemp("template") / "tiny"))


@pytest.fixture(scope="session")
def tiny_padded_template(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A valid tiny checkpoint padded H 64→96 and I 64→128."""
    return Path(make_tiny(tmp_path_factory.mktemp("template") / "tiny-padded", padded_hidden_size=96, padded_intermediate_size=128))


@pytest.fixture
def tiny_checkpoint(tiny_template: Path, tmp_path: Path) -> Path:
    """A private, writable copy of the tiny checkpoint."""
    return Path(shutil.copytree(tiny_template, tmp_path / "ckpt"))
