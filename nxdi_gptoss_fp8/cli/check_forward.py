"""``check-forward``: a checkpoint's first layers through NxDI's model on the CPU against its source (needs NxDI)."""

from __future__ import annotations

import argparse
import os
import sys
from typing import Any

from .. import format as fmt
from ._errors import _cannot_run
from ._help import Example
from ._options import _allow_custom, _checkpoint_dir, _load_neuron_config
from ._output import print_result

__all__ = ["CHECK_FORWARD_EXAMPLES", "add_check_forward_command"]


CHECK_FORWARD_EXAMPLES = (
    Example("the first 2 layers of a conversion against its HF source, on the CPU",
            "nxdi-gptoss-fp8 check-forward /data/models/gpt-oss-20b-fp8 --source /data/models/gpt-oss-20b"),
    Example("every layer, with the NeuronConfig the model will be compiled with, the report as JSON",
            "nxdi-gptoss-fp8 check-forward /data/models/gpt-oss-20b-fp8 --source /data/models/gpt-oss-20b "
            "--layers all --neuron-config neuron_config.json --json"),
)


def _cmd_check_forward(args: argparse.Namespace) -> int:
    _checkpoint_dir(args.path)  # a missing or unusable path is a usage error (exit 2), as everywhere
    _checkpoint_dir(args.source, "--source, the HF checkpoint directory it was made from")
    from ..errors import ConversionError, CpuModelError
    from ..forward.check import check_forward

    os.environ.setdefault("NXD_LOG_LEVEL", "warning")  # NxD's per-rank INFO lines would bury the report
    try:
        report = check_forward(
            args.path, args.source, layers=args.layers, tokens=args.tokens, steps=args.steps,
            neuron_config=_load_neuron_config(args.neuron_config),
            allow_custom_model=_allow_custom(args),
            say=lambda line: print(f"nxdi-gptoss-fp8 check-forward: {line}", file=sys.stderr, flush=True),
        )
    except (CpuModelError, ConversionError, ValueError) as exc:  # cannot run, or unusable inputs
        raise _cannot_run(exc) from None
    return print_result(report, args.json)


def _layer_count(text: str) -> int | None:
    """``--layers``: a positive whole number, or ``all`` (None: every layer of the checkpoint)."""
    if text.strip().lower() == "all":
        return None
    if not text.strip().isdigit() or int(text) < 1:
        raise argparse.ArgumentTypeError(f"must be a whole number from 1, or 'all', not {text!r}")
    return int(text)


def add_check_forward_command(commands: Any) -> None:
    """The ``check-forward`` command's parser, beside its handler."""
    check_forward = commands.add_parser(
        "check-forward", help="run the first K layers of a checkpoint through NxDI's model on the CPU against its source (needs NxDI)",
        description="Preflight CKPT, then run its first K layers through the hook in NxDI's real GPT-OSS model (CPU "
                    "mode) and the same K layers of the published source (HF MXFP4 decoded exactly, or BF16) in "
                    "transformers on a fixed token sequence; report per position max |Δlogit|, cosine, top-1 "
                    "agreement and KL. An MXFP4 source must agree to float32 rounding, a BF16 source within FP8 "
                    "quantization error. Before NxDI is imported it refuses (exit 2, one line) a source the reference "
                    "cannot read (compressed-tensors: pass the HF checkpoint instead), a source of another model, and "
                    "a host without the memory the run needs (it says how much first). Exit 1 on a preflight failure "
                    "or a violated bound.",
        examples=CHECK_FORWARD_EXAMPLES,
    )
    check_forward.add_argument("path", metavar="CKPT", help="the normalized checkpoint directory")
    check_forward.add_argument("--source", required=True, metavar="HF_DIR", help="the HF checkpoint it was made from")
    check_forward.add_argument("--layers", type=_layer_count, default=2, metavar="K",
                               help="decoder layers to run, or 'all' (default 2); memory holds one layer's experts "
                                    "at a time, so K adds little memory, only time")
    check_forward.add_argument("--tokens", type=int, default=12, metavar="N", help="length of the token sequence (default 12)")
    check_forward.add_argument("--steps", type=int, default=6, metavar="S", help="teacher-forced token steps after the context pass (default 6)")
    check_forward.add_argument("--neuron-config", metavar="FILE.json",
                               help="NxDI NeuronConfig attributes as JSON (fused_qkv, lm_head padding, ...); the "
                                    "settings CPU mode needs replace the device ones and are listed")
    check_forward.add_argument("--allow-custom-model", action="store_true",
                               help=f"accept model_profile 'custom' (tiny test models); also {fmt.ALLOW_CUSTOM_ENV}=1")
    check_forward.add_argument("--json", action="store_true", help="print the report as JSON")
    check_forward.set_defaults(handler=_cmd_check_forward, interrupted="its temporary directory was removed")
