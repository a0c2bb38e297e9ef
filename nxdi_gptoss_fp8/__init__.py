"""nxdi-gptoss-fp8: load pre-quantized, normalized static-FP8 GPT-OSS checkpoints into AWS
NeuronX Distributed Inference (NxDI) without conversion, after a fail-closed preflight.

Importing this package imports neither NxDI nor torch; the validator is stdlib only.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ._version import __version__
from .errors import (
    CheckpointFormatError,
    ConversionError,
    CpuModelError,
    IntegrityError,
    LoadError,
    MissingDependencyError,
    NxdiGptossFp8Error,
    OutputWriteError,
    PreflightError,
    RegistrationError,
    ReportBindingError,
    ShardedWeightsError,
)
from .format import FORMAT_NAME, FORMAT_VERSION
from .validate.findings import CHECKS, Finding, PreflightReport, Severity
from .validate.pipeline import preflight

if TYPE_CHECKING:  # the lazy names below, for type checkers and IDEs
    from .loader import load_state_dict
    from .nxdi.hook import is_registered, register, unregister
    from .synthetic.tiny import make_tiny


# imported on first use (they need torch or NxDI): module and attribute of each
_LAZY = {
    "register": ("nxdi.hook", "register"),
    "unregister": ("nxdi.hook", "unregister"),
    "is_registered": ("nxdi.hook", "is_registered"),
    "load_state_dict": ("loader", "load_state_dict"),
    "make_tiny": ("synthetic.tiny", "make_tiny"),
}

__all__ = [
    "CHECKS",
    "FORMAT_NAME",
    "FORMAT_VERSION",
    "CheckpointFormatError",
    "ConversionError",
    "CpuModelError",
    "Finding",
    "IntegrityError",
    "LoadError",
    "MissingDependencyError",
    "NxdiGptossFp8Error",
    "OutputWriteError",
    "PreflightError",
    "PreflightReport",
    "RegistrationError",
    "ReportBindingError",
    "Severity",
    "ShardedWeightsError",
    "__version__",
    "is_registered",
    "load_state_dict",
    "make_tiny",
    "preflight",
    "register",
    "unregister",
]


def __getattr__(name: str) -> Any:
    """Lazy access to the parts that need torch or NxDI, so importing stays light."""
    if name in _LAZY:
        import importlib

        module_name, attr = _LAZY[name]
        return getattr(importlib.import_module(f".{module_name}", __name__), attr)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def __dir__() -> list[str]:
    """Every public name, the lazy ones included (``dir()``, completion)."""
    return sorted(set(globals()) | set(__all__))
