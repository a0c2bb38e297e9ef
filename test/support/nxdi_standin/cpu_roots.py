"""Test-only stand-ins that let NxDI's REAL GPT-OSS model run in NxDI's CPU mode on a host
without the Neuron SDK (``nxdi-cpu-mode.md``).

Unlike ``neuron_stubs.installed`` (which also stubs NxD and transformers for the conversion
code), only the roots that cannot be installed here are stubbed: ``torch_neuronx``,
``neuronxcc``, ``nki``, ``nkilib``, ``libneuronxla`` and ``torch_xla``. Real NxD and real
transformers are imported from ``NXD_SRC/src`` and the venv. Two stand-ins need a value:

* ``torch_neuronx.utils[.utils].get_platform_target()`` returns ``"trn2"``: NxD's
  ``initialize_model_parallel`` turns it into its hardware enum;
* ``torch.classes.neuron``: NxD's ``trace/`` modules name TorchScript classes of the Neuron
  runtime in annotations at import time.

``install`` is permanent for the process (the ``cpu_site/sitecustomize.py`` next to this file
calls it in every interpreter started with that directory on ``PYTHONPATH``, torchrun workers
included); nothing here runs in the package itself.
"""

from __future__ import annotations

import os
import sys
import types
from typing import Any

from . import neuron_stubs

NEURON_ONLY = ("torch_neuronx", "torch_xla", "libneuronxla", "neuronxcc", "nki", "nkilib")
PLATFORM = "trn2"


def _platform_target(*args: Any, **kwargs: Any) -> str:
    return PLATFORM


class _NeuronClasses(types.SimpleNamespace):
    """``torch.classes.neuron``: any class name resolves to a dummy class."""

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__") and name.endswith("__"):
            raise AttributeError(name)
        return neuron_stubs._dummy(name)


def install(nxdi_src: str, nxd_src: str) -> None:
    """Put ``<src>/src`` of both checkouts on ``sys.path`` and the stand-ins in front of imports."""
    import torch

    os.environ.setdefault("NEURON_PLATFORM_TARGET_OVERRIDE", PLATFORM)
    for root in (nxd_src, nxdi_src):
        src = os.path.join(root, "src")
        if src not in sys.path:
            sys.path.insert(0, src)
    sys.meta_path.insert(0, neuron_stubs._Finder(NEURON_ONLY))
    import torch_neuronx.utils
    import torch_neuronx.utils.utils

    torch_neuronx.utils.get_platform_target = _platform_target
    torch_neuronx.utils.utils.get_platform_target = _platform_target
    torch.classes.neuron = _NeuronClasses()  # type: ignore[attr-defined]


def site_dir() -> str:
    """The directory to put first on ``PYTHONPATH`` so a child interpreter installs the stand-ins."""
    return os.path.join(os.path.dirname(os.path.abspath(__file__)), "cpu_site")


def sources() -> tuple[str, str] | None:
    """``(NXDI_SRC, NXD_SRC)`` when both point at source checkouts, else None."""
    nxdi, nxd = os.environ.get("NXDI_SRC"), os.environ.get("NXD_SRC")
    if not nxdi or not nxd:
        return None
    if not os.path.isdir(os.path.join(nxdi, "src", "neuronx_distributed_inference")):
        raise RuntimeError(f"NXDI_SRC={nxdi} has no src/neuronx_distributed_inference")
    if not os.path.isdir(os.path.join(nxd, "src", "neuronx_distributed")):
        raise RuntimeError(f"NXD_SRC={nxd} has no src/neuronx_distributed")
    return nxdi, nxd
