"""nxdi-gptoss-fp8: load pre-quantized, normalized static-FP8 GPT-OSS checkpoints into AWS
NeuronX Distributed Inference (NxDI) without conversion, after a fail-closed preflight.

Importing this package imports neither NxDI nor torch; the validator is stdlib only.
"""

from __future__ import annotations

from typing import Any

from .errors import (
    CheckpointFormatError,
    ConversionError,
    CpuModelError,
    IntegrityError,
    LoadError,
    MissingDependencyError,
    NxdiGptossFp8Error,
    PreflightError,
    RegistrationError,
    ReportBindingError,
    ShardedWeightsError,
)
from .format import FORMAT_NAME, FORMAT_VERSION
from .validate.findings import CHECKS, Finding, PreflightReport, Severity
from .validate.pipeline import preflight

__version__ = "0.2.0"

__all__ = [
    "CHECKS", "FORMAT_NAME", "FORMAT_VERSION", "CheckpointFormatError", "ConversionError", "CpuModelError",
    "Finding", "IntegrityError", "LoadError", "MissingDependencyError", "NxdiGptossFp8Error", "PreflightError",
    "PreflightReport", "RegistrationError", "ReportBindingError", "Severity", "ShardedWeightsError", "__version__",
    "preflight",
]


def __getattr__(name: str) -> Any:
    """Lazy access to the parts that need torch or NxDI, so importing stays light."""
    lazy = {
        "register": ("nxdi_hook", "register"),
        "unregister": ("nxdi_hook", "unregister"),
        "is_registered": ("nxdi_hook", "is_registered"),
        "load_state_dict": ("loader", "load_state_dict"),
        "make_tiny": ("synthetic.tiny", "make_tiny"),
    }
    if name in lazy:
        import importlib

        module_name, attr = lazy[name]
        return getattr(importlib.import_module(f".{module_name}", __name__), attr)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
