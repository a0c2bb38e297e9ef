"""Shared fixtures: tiny valid checkpoints, made once per session and copied per test."""

from __future__ import annotations

import shutil
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

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


@pytest.fixture(scope="session")
def bases(tmp_path_factory: pytest.TempPathFactory) -> Any:
    """The valid checkpoints the adversarial corpus mutates (``support/corpus.py``: ``Bases``), made once."""
    from corpus import Bases  # support/ is on sys.path from here on

    return Bases.create(tmp_path_factory.mktemp("corpus-bases"))


@pytest.fixture(scope="session")
def built(bases: Any, tmp_path_factory: pytest.TempPathFactory) -> Any:
    """Each corpus case built once per session, on first use (``corpus.case_builder``; the tests only read it)."""
    from corpus import case_builder

    return case_builder(bases, tmp_path_factory.mktemp("corpus"))


@pytest.fixture(scope="module")
def stack() -> Iterator[Any]:
    """The client tests' vLLM start: vllm-neuron from ``VLLM_NEURON_SRC`` over NxDI from
    ``NXDI_SRC``, compiler and device stood in (``clients.vllm_stack``; skips without them)."""
    import clients  # support/: the client tests alone need it (it stubs Neuron packages)

    with clients.vllm_stack() as started:
        yield started
