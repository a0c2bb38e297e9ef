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
from .nxdi_config import config_attr, neuron_config_view
from .pipeline import preflight

__all__ = ["PLACEHOLDER_PATH", "CheckpointVerdict", "checkpoint_path_problem", "checkpoint_verdict"]

PLACEHOLDER_PATH = "/path/to/this/directory"  # the model card's stand-in for the checkpoint's own directory


def checkpoint_path_problem(config: Any, directory: str | os.PathLike[str]) -> str | None:
    """The start's checkpoint-path rule: a quantized NeuronConfig makes NxDI read the weights from
    ``quantized_checkpoints_path``, so that must be ``directory`` (the one checked or served); one
    line naming the key and the fix when it names another directory or is the model card's
    placeholder, else None (a value that is no path at all is ``neuron_config.bad_checkpoints_path``)."""
    nc = neuron_config_view(config) if config is not None else None
    named = config_attr(nc, "quantized_checkpoints_path") if nc is not None and config_attr(nc, "quantized", False) else None
    if not isinstance(named, (str, os.PathLike)) or not os.fspath(named).strip():
        return None
    named, directory = os.fspath(named), os.fspath(directory)
    if named.rstrip("/") == PLACEHOLDER_PATH:
        return (f"quantized_checkpoints_path is the model card's placeholder {PLACEHOLDER_PATH!r}: NxDI would read the "
                f"weights from there; set it to this checkpoint's directory ({directory})")
    if os.path.realpath(named) != os.path.realpath(directory):
        return (f"quantized_checkpoints_path is {named!r}, not {directory}: NxDI reads the weights from it, not from "
                f"the directory checked here; set quantized_checkpoints_path to {directory}")
    return None


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
                       verify_checksums: bool = False, served: bool = False) -> CheckpointVerdict:
    """``preflight(path, ...)`` (the same arguments) and, when it fails, what the directory is.
    ``served``: ``path`` is the directory the start loads (``validate DIR --neuron-config F``),
    so the NeuronConfig's ``quantized_checkpoints_path`` must name it (``checkpoint_path_problem``:
    a ``neuron_config.checkpoint_path_elsewhere`` error otherwise)."""
    report = preflight(path, neuron_config=neuron_config, inference_config=inference_config,
                       allow_custom_model=allow_custom_model, read_scales=read_scales, deep=deep,
                       verify_checksums=verify_checksums)
    problem = checkpoint_path_problem(neuron_config, path) if served and neuron_config is not None else None
    if problem is not None:
        report.add("neuron_config", "checkpoint_path_elsewhere", problem, key="quantized_checkpoints_path")
    if report.ok or report.view is None:
        return CheckpointVerdict(report)
    return CheckpointVerdict(report, refused_recognition(report.view))
