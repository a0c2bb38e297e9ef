"""What the client tests share: the recipe blocks of docs/serving.md as commands, and the real NxDI source
(``NXDI_SRC``) with only the Neuron-only packages stubbed and the compiler/device stood in.

Unlike the conformance tests, transformers is the real one here (vLLM reads the HF config with it,
NxDI's ``load_pretrained_config`` too), so Pillow must be installed (NxDI's vision models import it).
"""

from __future__ import annotations

import contextlib
import importlib
import os
import shlex
from collections.abc import Iterator, Mapping
from types import ModuleType, SimpleNamespace

import documents
import neuron_device
import pytest
from nxdi_standin import neuron_stubs

# stubbed for the client tests: the Neuron SDK, and torchvision (NxDI's vision models import it)
CLIENT_STUBBED = tuple(root for root in neuron_stubs.STUBBED if root not in ("transformers", "PIL"))
# the page that holds the recipes, their sections, and their paths and the sizes of gpt-oss-120b,
# which the client tests replace by a tiny checkpoint's
SERVING_PAGE = "docs/serving.md"
VLLM_RECIPE = "vLLM (the NxDI-backed `vllm-neuron`)"
DEMO_RECIPE = "NxDI's `inference_demo`"
PYTHON_RECIPE = "The Python API"
RECIPE_MODEL = "/data/models/gpt-oss-120b-fp8"
RECIPE_PADDED = 2880


def recipe_block(title: str, language: str, index: int = 0) -> str:
    """The ``index``-th fenced ``language`` block of the serving page's recipe titled ``title``."""
    return documents.code_block(SERVING_PAGE, title, language, index)


def shell_commands(block: str) -> list[list[str]]:
    """The block's commands (backslash continuations joined), each split as the shell would."""
    return [shlex.split(line) for line in block.replace("\\\n", " ").splitlines() if line.strip()]


def substitute(words: list[str], mapping: Mapping[str, str]) -> list[str]:
    out = []
    for word in words:
        for old, new in mapping.items():
            word = word.replace(old, new)
        out.append(word)
    return out


def nxdi_source() -> str:
    src = os.environ.get("NXDI_SRC")
    if not src:
        pytest.skip("NXDI_SRC is not set (a checkout of neuronx-distributed-inference)")
    path = os.path.join(src, "src")
    if not os.path.isdir(os.path.join(path, "neuronx_distributed_inference")):
        pytest.fail(f"NXDI_SRC={src} has no src/neuronx_distributed_inference")
    if importlib.util.find_spec("PIL") is None:
        pytest.skip("the client tests need Pillow (pip install pillow): NxDI's vision models import it")
    return path


@contextlib.contextmanager
def real_nxdi() -> Iterator[SimpleNamespace]:
    """NxDI from ``NXDI_SRC`` (Neuron packages stubbed, transformers real), the compiler and device
    stood in; ``sys.modules`` and the stand-ins restored after."""
    src = nxdi_source()
    with neuron_stubs.installed(src, CLIENT_STUBBED, keep=("torch", "transformers")):
        application_base = importlib.import_module("neuronx_distributed_inference.models.application_base")
        modeling: ModuleType = importlib.import_module("neuronx_distributed_inference.models.gpt_oss.modeling_gpt_oss")
        constants = importlib.import_module("neuronx_distributed_inference.utils.constants")
        with neuron_device.installed(application_base) as device:
            yield SimpleNamespace(application_base=application_base, modeling=modeling, constants=constants,
                                  device=device)


@contextlib.contextmanager
def vllm_stack() -> Iterator[SimpleNamespace]:
    """vllm-neuron from ``VLLM_NEURON_SRC`` over ``real_nxdi`` (skips without a checkout): its
    loader, NxDI and the stood-in device, as the client tests drive a start."""
    import vllm_standin  # imports torch: only the client tests that start vLLM need it

    src = vllm_standin.source()
    if src is None:
        pytest.skip(f"{vllm_standin.SRC_ENV} is not set (a checkout of vllm-project/vllm-neuron at a release tag)")
    with real_nxdi() as nxdi, vllm_standin.loader(src) as loader:
        yield SimpleNamespace(nxdi=nxdi, loader=loader, device=nxdi.device)


@contextlib.contextmanager
def restored_environ() -> Iterator[None]:
    """os.environ as it was (NxDI's load sets runtime variables; the recipes export theirs)."""
    saved = dict(os.environ)
    try:
        yield
    finally:
        os.environ.clear()
        os.environ.update(saved)


__all__ = ["CLIENT_STUBBED", "DEMO_RECIPE", "PYTHON_RECIPE", "RECIPE_MODEL", "RECIPE_PADDED", "SERVING_PAGE", "VLLM_RECIPE",
           "real_nxdi", "recipe_block", "restored_environ", "shell_commands", "substitute", "vllm_stack"]
