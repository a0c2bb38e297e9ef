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
from .foreign import refused_recognition
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
        """``inspect``'s one line: what the directory is, and the action (``PreflightReport.hint``)."""
        return self.report.hint


def checkpoint_verdict(path: str | os.PathLike[str], *, neuron_config: Any = None, inference_config: Any = None,
                       allow_custom_model: bool = False, read_scales: bool = True, deep: bool = False,
                       verify_checksums: bool = False) -> CheckpointVerdict:
    """``preflight(path, ...)`` (the same arguments) and, when it fails, what the directory is."""
    report = preflight(path, neuron_config=neuron_config, inference_config=inference_config,
                       allow_custom_model=allow_custom_model, read_scales=read_scales, deep=deep,
                       verify_checksums=verify_checksums)
    if report.ok or report.view is None:
        return CheckpointVerdict(report)
    return CheckpointVerdict(report, refused_recognition(report.view))
