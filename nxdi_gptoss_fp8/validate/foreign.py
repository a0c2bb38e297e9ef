"""What a directory that is not a normalized checkpoint is (``recognize``'s verdict), and the advice
the findings give for it.
"""

from __future__ import annotations

from typing import Any

from .view import CheckpointView

__all__ = ["foreign_recognition", "nested_advice", "refused_recognition"]


# The checkpoint kinds ``recognize`` names that are not normalized (compiled NxDI output and
# pre-sharded weights are not checkpoints to convert or load with CHECKPOINT_FORMAT).
_FOREIGN_KINDS = ("hf-mxfp4", "hf-bf16", "compressed-tensors-fp8", "compressed-tensors", "nxdi-legacy-bf16",
                  "nxdi-legacy-fp8", "openai-original")


_HF_KINDS = _FOREIGN_KINDS[:4]


def foreign_recognition(view: CheckpointView) -> Any:
    """What ``inspect`` says the directory is when it is another kind of checkpoint (HF,
    compressed-tensors, legacy: a ``recognize.Recognition``), else None. Asked once per view,
    and only for a directory that is not normalized: a valid checkpoint never pays for it."""
    if not view.reader.local:
        return None  # recognize reads a directory on this machine
    if view.recognition is None:
        from ..recognize import recognize

        view.recognition = recognize(view.root)
    return view.recognition if view.recognition.kind in _FOREIGN_KINDS else None


def nested_advice(view: CheckpointView) -> str | None:
    """``DIR holds gpt-oss-120b-fp8/, a normalized FP8 checkpoint: nxdi-gptoss-fp8 validate …``
    when the directory is no checkpoint but holds one a level down (``recognize``), else None."""
    if foreign_recognition(view) is None and view.recognition is None:
        return None
    return view.recognition.hint() if view.recognition.inside else None


def refused_recognition(view: CheckpointView) -> Any:
    """What ``inspect`` says a directory the preflight refused is, when it is a kind of directory
    ``recognize`` knows other than a normalized checkpoint (HF, compressed-tensors, legacy,
    pre-sharded weights, a compiled NxDI model directory) or a folder that holds a checkpoint one
    level down, else None: its ``hint()`` is ``PreflightReport.hint``."""
    from ..recognize import NORMALIZED

    foreign_recognition(view)  # recognizes the directory once, into view.recognition
    if view.recognition is None:
        return None
    recognition = view.recognition
    known = recognition is not None and ((recognition.known and recognition.kind != NORMALIZED) or recognition.inside)
    return recognition if known else None


def _foreign_advice(view: CheckpointView) -> str | None:
    """``this is an HF BF16 checkpoint: convert it with …``: inspect's verdict and action, for
    an HF or compressed-tensors directory."""
    recognition = foreign_recognition(view)
    if recognition is None or recognition.kind not in _HF_KINDS:
        return None
    return f"this is {recognition.title}: {', or '.join(recognition.actions)}"
