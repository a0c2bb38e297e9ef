"""Optional dependencies, imported on demand with a one-line error when they are missing.

The validator needs only the standard library; ``--deep`` needs numpy; loading, converting
and ``make-tiny`` need torch and safetensors; the NxDI hook needs NxDI (installed with the
Neuron SDK). ``require`` turns a missing one into ``MissingDependencyError``, which names the
package, what needs it and how to install it (the CLI prints it and exits 2). The one answer to
"is it here" (``importable``: found without importing it; ``available``: it imports) and "which
version" (``module_version``). Stdlib only.
"""

from __future__ import annotations

import importlib
import importlib.util
import sys
from types import ModuleType

from .errors import MissingDependencyError
from .interrupts import interrupts_held

__all__ = ["CPU_TORCH", "INSTALL_HINTS", "OPTIONAL", "available", "importable", "missing", "module_version", "require"]

CPU_TORCH = "pip install torch --index-url https://download.pytorch.org/whl/cpu"
INSTALL_HINTS = {
    "torch": f"install torch first (CPU-only build: {CPU_TORCH}; on a Neuron host use the torch that torch-neuronx installed)",
    "safetensors": "pip install safetensors (or: pip install 'nxdi-gptoss-fp8[torch]')",
    "numpy": "pip install numpy (or: pip install 'nxdi-gptoss-fp8[torch]')",
    "tqdm": "pip install tqdm",
    "transformers": "pip install 'nxdi-gptoss-fp8[forward]' (transformers is the reference model)",
    "huggingface_hub": "pip install 'nxdi-gptoss-fp8[hub]'",
}
# Root module names whose absence is an environment problem, not a bug in this package.
OPTIONAL = frozenset(INSTALL_HINTS) | {"neuronx_distributed_inference", "neuronx_distributed", "torch_neuronx"}


def missing(name: str, purpose: str = "") -> MissingDependencyError:
    """The error for module ``name`` missing when ``purpose`` (e.g. "the deep scan"; empty: the
    command the message is printed for) needs it."""
    root = name.split(".")[0]
    hint = INSTALL_HINTS.get(root, "it comes with the AWS Neuron SDK: run this on a Neuron host (see docs/install.md)")
    return MissingDependencyError(f"{purpose + ' ' if purpose else ''}needs {root}, which is not installed here: {hint}")


def require(name: str, purpose: str = "") -> ModuleType:
    """Import module ``name``, or raise ``MissingDependencyError`` saying that ``purpose`` needs it.
    Ctrl-C, SIGTERM and SIGHUP wait for the import to end (``interrupts_held``): torch's C
    initialisers would swallow the interruption and the command would run on."""
    try:
        with interrupts_held():
            return importlib.import_module(name)
    except ImportError as exc:
        if (exc.name or name).split(".")[0] != name.split(".")[0]:
            raise  # the package is there but something it imports is broken: not ours to hide
        raise missing(name, purpose) from None


def available(name: str) -> bool:
    """Whether module ``name`` can be imported (imports it)."""
    try:
        importlib.import_module(name)
    except ImportError:
        return False
    return True


def importable(name: str) -> bool:
    """Whether module ``name`` is imported already or can be found (without importing it)."""
    if sys.modules.get(name) is not None:
        return True
    try:
        return importlib.util.find_spec(name) is not None
    except (ImportError, ValueError):
        return False


def module_version(name: str) -> str:
    """The version of the importable module ``name``: its distribution's metadata (``a_b`` or
    ``a-b``), else its ``_version.__version__`` or ``__version__`` (imports it), else "unknown"."""
    from importlib import metadata

    for dist in (name.replace("_", "-"), name):
        try:
            return metadata.version(dist)
        except metadata.PackageNotFoundError:
            continue
    try:
        return str(importlib.import_module(f"{name}._version").__version__)
    except (ImportError, AttributeError):
        return str(getattr(importlib.import_module(name), "__version__", "unknown"))
