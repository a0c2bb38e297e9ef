"""Convert a GPT-OSS checkpoint users hold into the normalized FP8 format. Requires torch and
safetensors.

Three source kinds, one module each, behind one small protocol (``kinds.base.SourceKind``):

* ``hf_mxfp4`` — the published HF MXFP4 sets: re-encoded with power-of-two channel scales,
  exact wherever E4M3 can hold the value;
* ``hf_bf16`` — HF BF16: quantized afresh with ``amax / 240`` channel scales;
* ``compressed_tensors`` — llm-compressor FP8_DYNAMIC: per-expert linear layers rescaled from
  OCP ±448 to Neuron's ±240 by a power of two, exact except a counted few.

``source`` reads and validates the files, ``layout`` holds the gate/up chunking and padding,
``output`` the writer, compute lanes and report, ``plan`` what a run reads and writes and
whether it fits, ``pipeline`` the driver. Tensors are read one
at a time (experts one expert at a time) and written at their final offsets, so memory does
not grow with the model; the output appears, complete, only when the index is down.
"""

from __future__ import annotations

from .kinds.base import ExpertRows, SourceKind
from .kinds.compressed_tensors import GATE_UP_SPLITS, SPLIT_HALVES, SPLIT_INTERLEAVED
from .kinds.compressed_tensors import NAME as SOURCE_COMPRESSED_TENSORS
from .kinds.hf_bf16 import NAME as SOURCE_BF16
from .kinds.hf_mxfp4 import NAME as SOURCE_MXFP4
from .layout import chunk_halves, chunk_interleaved, pad_to, place_down, place_gate_up
from .output import ConversionReport, ExpertStats, output_config
from .pipeline import KINDS, convert, open_source, plan, plan_from_hub, plan_writer, source_kind, source_specs
from .plan import ConversionPlan, PlannedFile
from .source import Source, SourceReader, SourceSpec, expert_source_name, non_expert_names

__all__ = [
    "GATE_UP_SPLITS", "KINDS", "SOURCE_BF16", "SOURCE_COMPRESSED_TENSORS", "SOURCE_MXFP4", "SPLIT_HALVES",
    "SPLIT_INTERLEAVED", "ConversionPlan", "ConversionReport", "ExpertRows", "ExpertStats", "PlannedFile", "Source", "SourceKind", "SourceReader", "SourceSpec",
    "chunk_halves", "chunk_interleaved", "convert", "expert_source_name", "non_expert_names", "open_source",
    "output_config", "pad_to", "place_down", "place_gate_up", "plan", "plan_from_hub", "plan_writer", "source_kind",
    "source_specs",
]
