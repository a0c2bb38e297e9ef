"""A small stand-in of the NxDI classes the hook wraps, for tests on hosts without NxDI.

Our own code, written from the behaviour documented in ``nxdi-contract.md`` (sections a, b, e):
the same module names, class names, method kinds and signatures, the GPT-OSS dispatch on
``CHECKPOINT_FORMAT``, ``get_state_dict`` with its renames and ``_FUSED_PREFIX``,
``checkpoint_loader_fn`` with its cast rule, NeuronConfig dropping unknown keyword arguments,
and the two ``MODEL_TYPES`` dicts. The conversions themselves are recorded, not reimplemented:
the tests check that the original is called and its result returned, and the real conversion
code is exercised by ``test_nxdi_conformance.py``.

``installed()`` puts fresh copies of these modules into ``sys.modules`` under NxDI's names.
``neuron_stubs`` is the other half: it lets the REAL NxDI source import on CPU (conformance).
``cpu_roots`` (with ``cpu_site/sitecustomize.py``) stubs only the Neuron-only roots, so NxDI's real
model runs in its CPU mode on real NxD and transformers (``test_forward_cpu_model.py``).
"""

from __future__ import annotations

import importlib
import sys
import types
from collections.abc import Iterator
from contextlib import contextmanager

ROOT = "neuronx_distributed_inference"
# real module name → stand-in submodule
MODULES = {
    f"{ROOT}.models.config": "config",
    f"{ROOT}.modules.checkpoint": "checkpoint",
    f"{ROOT}.models.application_base": "application_base",
    f"{ROOT}.models.gpt_oss.modeling_gpt_oss": "modeling_gpt_oss",
    f"{ROOT}.utils.constants": "constants",
    f"{ROOT}.inference_demo": "inference_demo",
}
PACKAGES = (ROOT, f"{ROOT}.models", f"{ROOT}.models.gpt_oss", f"{ROOT}.modules", f"{ROOT}.utils")


def _owned(name: str) -> bool:
    return name == ROOT or name.startswith(ROOT + ".") or name.startswith(__name__ + ".")


@contextmanager
def installed(*, with_demo: bool = True) -> Iterator[types.SimpleNamespace]:
    """Install fresh stand-in modules under NxDI's names; restore ``sys.modules`` afterwards.

    Yields a namespace with one attribute per stand-in module (``modeling_gpt_oss``, ...).
    ``with_demo=False`` leaves ``inference_demo`` unloaded, as in a vLLM server process.
    """
    saved = {name: module for name, module in sys.modules.items() if _owned(name)}
    for name in saved:
        del sys.modules[name]
    try:
        for package in PACKAGES:
            module = types.ModuleType(package)
            module.__path__ = []  # type: ignore[attr-defined]
            sys.modules[package] = module
        loaded = {}
        for real, short in MODULES.items():
            if short == "inference_demo" and not with_demo:
                continue
            module = importlib.import_module(f"{__name__}.{short}")
            sys.modules[real] = module
            parent, _, leaf = real.rpartition(".")
            setattr(sys.modules[parent], leaf, module)
            loaded[short] = module
        yield types.SimpleNamespace(**loaded)
    finally:
        from nxdi_gptoss_fp8.nxdi import hook as nxdi_hook

        nxdi_hook.unregister()
        for name in [n for n in sys.modules if _owned(n)]:
            del sys.modules[name]
        sys.modules.update(saved)
