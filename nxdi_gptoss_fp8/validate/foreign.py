"""What a directory that is not a normalized checkpoint is (``recognize``'s verdict), and the advice
the findings give for it.
"""

from __future__ import annotations

from typing import Any

from .view import CheckpointView

__all__ = ["foreign_recognition", "refusal_hint"]


# The checkpoint kinds ``recognize`` names that are not normalized (compiled NxDI output and
# pre-sharded weights are not checkpoints to convert or load with CHECKPOINT_FORMAT).
_FOREIGN_KINDS = ("hf-mxfp4", "hf-bf16", "compressed-tensors-fp8", "compressed-tensors", "nxdi-legacy-bf16",
                  "nxdi-legacy-fp8", "openai-original")


_HF_KINDS = _FOREIGN_KINDS[:4]


def foreign_recognition(view: CheckpointView) -> Any:
    """What ``inspect`` says the directory is when it is another kind of checkpoint (HF,
    compressed-tensors, legacy: a ``recognize.Recognition``), else None. Asked once per view,
    and only for a directory that is not normalized: a valid checkpoint never pays for it."""
    if view.recognition is None:
        from ..recognize import recognize

        view.recognition = recognize(view.root)
    return view.recognition if view.recognition.kind in _FOREIGN_KINDS else None


def refusal_hint(view: CheckpointView) -> str | None:
    """``inspect``'s one-line verdict and action for a directory the preflight refused when it is
    another kind of checkpoint (HF, compressed-tensors, legacy) or pre-sharded weights copied
    without their compiled directory; else None (``PreflightReport.hint``)."""
    from ..recognize import PRESHARDED

    recognition = foreign_recognition(view)
    if recognition is None and view.recognition is not None and view.recognition.kind == PRESHARDED:
        recognition = view.recognition
    return recognition.hint() if recognition is not None else None


def _foreign_advice(view: CheckpointView) -> str | None:
    """``this is an HF BF16 checkpoint: convert it with …``: inspect's verdict and action, for
    an HF or compressed-tensors directory."""
    recognition = foreign_recognition(view)
    if recognition is None or recognition.kind not in _HF_KINDS:
        return None
    return f"this is {recognition.title}: {', or '.join(recognition.actions)}"
