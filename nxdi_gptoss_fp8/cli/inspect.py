"""``inspect``: which checkpoint any directory is, what to do with it, and a normalized one's summary."""

from __future__ import annotations

import argparse
from typing import Any

from .. import format as fmt
from ._errors import UsageError
from ._help import Example
from ._options import _allow_custom, _checkpoint_source
from ._output import EXIT_FINDINGS, EXIT_OK, print_result

__all__ = ["INSPECT_EXAMPLES", "add_inspect_command"]


INSPECT_EXAMPLES = (
    Example("what a downloaded checkpoint is, and the command that converts or loads it",
            "nxdi-gptoss-fp8 inspect /data/models/gpt-oss-120b"),
    Example("a normalized checkpoint's shards, bytes by dtype, padding and verdict, as JSON",
            "nxdi-gptoss-fp8 inspect /data/models/gpt-oss-120b-fp8 --json"),
    Example("a normalized checkpoint on the Hugging Face Hub, before downloading it",
            "nxdi-gptoss-fp8 inspect my-org/gpt-oss-120b-fp8"),
    Example("a compiled NxDI model directory: its pre-sharded weights' manifest and verdict",
            "nxdi-gptoss-fp8 inspect /data/neuron-compiled/gpt-oss-120b-fp8-tp64"),
)


def _cmd_inspect(args: argparse.Namespace) -> int:
    from ..inspection import inspect_directory
    from ..recognize import NOT_A_DIRECTORY

    target = _checkpoint_source(args.path, args.revision, "inspect")
    inspection = inspect_directory(target, allow_custom_model=_allow_custom(args))
    if inspection.recognition.kind == NOT_A_DIRECTORY:  # a usage error, in text and JSON alike
        raise UsageError("; ".join(inspection.recognition.evidence))
    return print_result(inspection, args.json, exit_code=EXIT_OK if inspection.succeeded else EXIT_FINDINGS)


def add_inspect_command(commands: Any) -> None:
    """The ``inspect`` command's parser, beside its handler."""
    inspect = commands.add_parser(
        "inspect", help="say which checkpoint any directory is and what to do with it; summarize a normalized one",
        description="Recognize any directory (HF MXFP4 or BF16, compressed-tensors FP8, NxDI legacy, normalized FP8, "
                    "NxDI pre-sharded weights, a compiled NxDI model) from its files and tensor names: the "
                    "CHECKPOINT_FORMAT value or the command that applies, and why. A normalized checkpoint also "
                    "gets its shards, tensors, bytes by dtype, profile, padding and preflight verdict (with the "
                    "first findings when invalid); a compiled NxDI model directory its pre-sharded weights' manifest "
                    "and validate's verdict on them.\n\n"
                    "Exit 0 recognized (and valid: a normalized checkpoint's preflight, a compiled directory's "
                    "validate), 1 invalid or unrecognized, 2 not a directory.",
        examples=INSPECT_EXAMPLES,
    )
    inspect.add_argument("path", metavar="DIR", help="any directory, or a Hub repo id (REPO_ID or REPO_ID@REVISION: "
                                                     "a normalized checkpoint on the Hub, summarized without "
                                                     "downloading its weights; a local directory of that name wins)")
    inspect.add_argument("--revision", metavar="REV",
                         help="a Hub repo id only: the branch, tag or commit to inspect (default main)")
    inspect.add_argument("--json", action="store_true", help="print the recognition and summary as JSON")
    inspect.add_argument("--allow-custom-model", action="store_true",
                         help=f"accept model_profile 'custom' as validate does; also {fmt.ALLOW_CUSTOM_ENV}=1")
    inspect.set_defaults(handler=_cmd_inspect)
