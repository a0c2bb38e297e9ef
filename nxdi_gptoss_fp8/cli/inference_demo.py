"""``inference-demo``: the hook registered, then NxDI's own ``inference_demo`` with the arguments unchanged."""

from __future__ import annotations

import argparse
import json
import shlex
from typing import Any

from ..nxdi import recipes
from ._errors import UsageError
from ._help import Example, shell_lines
from ._output import EXIT_OK, EXIT_USAGE

__all__ = ["INFERENCE_DEMO_EXAMPLES", "add_inference_demo_command"]


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
