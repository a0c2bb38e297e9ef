"""One verdict on a checkpoint directory and a NeuronConfig: the preflight, and, when it fails
because the directory is another kind of checkpoint, what ``inspect`` says it is and what to do.

``validate DIR --neuron-config FILE`` and ``doctor -- vllm serve DIR ...`` both ask this one
question, so both call ``checkpoint_verdict``: one answer cannot drift from another. Stdlib only.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any

from .findings import PreflightReport
from .foreign import foreign_recognition
from .pipeline import preflight

__all__ = ["CheckpointVerdict", "checkpoint_verdict"]


@dataclass
class CheckpointVerdict:
    """The preflight's report, and ``recognition`` (a ``recognize.Recognition``) when the
    directory failed it for being another kind of checkpoint (HF, compressed-tensors, legacy,
    pre-sharded weights, a compiled NxDI model directory)."""

    report: PreflightReport
    recognition: Any = None

    @property
    def hint(self) -> str | None:
        """``inspect``'s one line: what the directory is, and the action."""
        return self.recognition.hint() if self.recognition is not None else None


def checkpoint_verdict(path: str | os.PathLike[str], *, neuron_config: Any = None, inference_config: Any = None,
                       allow_custom_model: bool = False, read_scales: bool = True, deep: bool = False,
                       verify_checksums: bool = False) -> CheckpointVerdict:
    """``preflight(path, ...)`` (the same arguments) and, when it fails, what the directory is."""
    from ..recognize import NORMALIZED

    report = preflight(path, neuron_config=neuron_config, inference_config=inference_config,
                       allow_custom_model=allow_custom_model, read_scales=read_scales, deep=deep,
                       verify_checksums=verify_checksums)
    view = report.view
    if report.ok or view is None:
        return CheckpointVerdict(report)
    foreign_recognition(view)  # recognizes the directory once, into view.recognition
    recognition = view.recognition
    # another kind of checkpoint, or a folder that holds a checkpoint one level down
    known = recognition is not None and ((recognition.known and recognition.kind != NORMALIZED) or recognition.inside)
    return CheckpointVerdict(report, recognition if known else None)
