"""The commands that run NxDI: ``inference-demo``, ``selfcheck``, ``check-forward``."""

from __future__ import annotations

import argparse
import json
import os
import shlex
import sys
from typing import Any

from .. import format as fmt
from ..nxdi import recipes
from ._output import print_result
from ._shared import (
    EXIT_OK,
    EXIT_USAGE,
    UsageError,
    _allow_custom,
    _checkpoint_dir,
    _load_neuron_config,
)
from .help import Example, shell_lines

__all__ = ["CHECK_FORWARD_EXAMPLES", "INFERENCE_DEMO_EXAMPLES", "SELFCHECK_EXAMPLES", "add_check_forward_command",
           "add_inference_demo_command", "add_selfcheck_command"]


def _inference_demo_recipe_example() -> str:
    """The README's inference_demo recipe (``nxdi.recipes``) for gpt-oss-120b: the modules file, then the demo."""
    modules = "/data/modules_to_not_convert.json"
    argv = recipes.inference_demo_argv("/data/models/gpt-oss-120b-fp8", "/data/neuron-compiled/gpt-oss-120b-fp8-tp64-demo",
                                       modules)
    return "\n".join([f"echo {shlex.quote(json.dumps(recipes.modules_file()))} > {modules}",
                      shell_lines(["CHECKPOINT_FORMAT=normalized_fp8", "nxdi-gptoss-fp8", "inference-demo", *argv])])


INFERENCE_DEMO_EXAMPLES = (
    Example("gpt-oss-120b converted with the defaults, at tp 64 on a trn2.48xlarge", _inference_demo_recipe_example()),
    Example("NxDI's own options, after this text", "nxdi-gptoss-fp8 inference-demo --help"),
)


def _cmd_inference_demo(args: argparse.Namespace) -> int:
    from ..nxdi import hook as nxdi_hook

    asks_help = not args.nxdi_args or args.nxdi_args[0] in ("-h", "--help")
    available = nxdi_hook.nxdi_available()
    if asks_help:
        print(args.format_help().rstrip("\n"))
        if not available:
            print("\nNxDI is not installed here, so its inference_demo options cannot be listed.")
            return EXIT_OK if args.nxdi_args else EXIT_USAGE
        print("\nNxDI's inference_demo options follow.\n", flush=True)
    if not available:
        raise UsageError("NxDI (neuronx-distributed-inference) is not installed here: run this on a Neuron host "
                         "with NxDI installed; it registers the hook, then runs NxDI's inference_demo "
                         "(`nxdi-gptoss-fp8 inference-demo --help` explains)")
    return nxdi_hook.run_inference_demo(args.nxdi_args)


def add_inference_demo_command(commands: Any) -> None:
    """The ``inference-demo`` command's parser, beside its handler."""
    inference_demo = commands.add_parser(
        "inference-demo", help="register the normalized-FP8 hook, then run NxDI's inference_demo with ARGS",
        usage="%(prog)s ARGS...",
        description="Register the normalized-FP8 hook on NxDI's GPT-OSS model, then run NxDI's own inference_demo "
                    "with ARGS unchanged (every argument, --help included, is NxDI's). CHECKPOINT_FORMAT="
                    "normalized_fp8 selects the normalized path.\n\n"
                    "The hook runs the same preflight as `nxdi-gptoss-fp8 validate DIR` before any tensor is read: "
                    "check the checkpoint on any host first (add --neuron-config with NxDI's config to check that "
                    "too). Needs NxDI (neuronx-distributed-inference) and a Neuron host.",
        examples=INFERENCE_DEMO_EXAMPLES,
        # no option of ours: every argument, '--help' included, is NxDI's
        prefix_chars="\x00", add_help=False,
    )
    inference_demo.add_argument("nxdi_args", nargs=argparse.REMAINDER, metavar="ARGS",
                                help="the arguments of NxDI's inference_demo, passed on unchanged")
    inference_demo.set_defaults(handler=_cmd_inference_demo, signals=False,  # NxDI's process: its own signal handling
                                format_help=inference_demo.format_help)


SELFCHECK_EXAMPLES = (
    Example("on a host with NxDI: its real model on the CPU, from normalized, legacy and HF weights",
            "nxdi-gptoss-fp8 selfcheck"),
    Example("the same tensor-parallel, 2 torchrun workers, the report as JSON", "nxdi-gptoss-fp8 selfcheck --tp 2 --json"),
)


def _cmd_selfcheck(args: argparse.Namespace) -> int:
    from ..errors import CpuModelError
    from ..forward.selfcheck import selfcheck

    if args.tp < 1:
        raise UsageError(f"--tp must be at least 1, not {args.tp}")
    os.environ.setdefault("NXD_LOG_LEVEL", "warning")  # NxD's per-rank INFO lines would bury the report
    try:
        report = selfcheck(tp=args.tp)
    except CpuModelError as exc:  # NxDI missing or its run failed: the check cannot run
        raise _cannot_run(exc) from None
    return print_result(report, args.json)


def add_selfcheck_command(commands: Any) -> None:
    """The ``selfcheck`` command's parser, beside its handler."""
    selfcheck = commands.add_parser(
        "selfcheck", help="run NxDI's real GPT-OSS on the CPU from a tiny checkpoint three ways and compare (needs NxDI)",
        description="Write one tiny GPT-OSS weight set as HF MXFP4, normalized FP8 and NxDI's legacy FP8, run NxDI's "
                    "model in its CPU mode from each (normalized through this package's hook) and transformers' "
                    "GptOssForCausalLM on the same weights: normalized vs legacy must be bit-identical, each within "
                    "1e-5 of transformers. Exit 0 pass, 1 mismatch, 2 cannot run (NxDI missing or importable "
                    "only in part: one line says what is missing and how to get it).",
        examples=SELFCHECK_EXAMPLES,
    )
    selfcheck.add_argument("--tp", type=int, default=1, metavar="N", help="tensor-parallel degree; N > 1 runs N torchrun workers (gloo)")
    selfcheck.add_argument("--json", action="store_true", help="print the report as JSON")
    selfcheck.set_defaults(handler=_cmd_selfcheck, interrupted="its temporary directory was removed")


def _cannot_run(exc: Exception) -> Exception:
    """Why NxDI's model cannot run, as the CLI's error: a missing or partial package (NxDI, NxD,
    transformers) is a missing dependency (``--json`` kind ``missing_dependency``), anything
    else a usage error; both exit 2."""
    from ..errors import MissingDependencyError

    if isinstance(exc, MissingDependencyError):
        return MissingDependencyError(f"{exc} (`nxdi-gptoss-fp8 env` says where this host stands)")
    return UsageError(str(exc))


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
