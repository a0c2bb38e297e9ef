"""One layer's conversion: its non-expert tensors copied, then its experts through the source
kind. Its own module because both the one-process path (``pipeline.convert``) and the worker
processes (``workers``) run it, and the workers sit below the pipeline (it imports them)."""

from __future__ import annotations

from .. import format as fmt
from .kinds.base import SourceKind
from .output import ExpertStats, Output, Workspace, copy_padded
from .source import SourceReader

__all__ = ["convert_layer"]


def convert_layer(kind: SourceKind, reader: SourceReader, output: Output, layout: fmt.Layout, workspace: Workspace,
                  names: list[tuple[str, str]], layer: int) -> list[ExpertStats]:
    """One layer: its non-expert tensors (``names``: HF name, ours) renamed, cast and padded,
    then its experts through the source kind. Runs here or in a worker process alike."""
    for hf_name, name in names:
        copy_padded(reader, hf_name, output, name)
    return kind.convert_experts(reader, layer, output, layout, workspace)
