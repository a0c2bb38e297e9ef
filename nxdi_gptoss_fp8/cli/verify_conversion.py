"""``verify-conversion``: a converted checkpoint compared with its source, value by value (needs torch)."""

from __future__ import annotations

import argparse
from typing import Any

from ._errors import UsageError
from ._help import Example
from ._options import _add_split_option, _add_workers_option, _checkpoint_dir, _needs, _resolve, _workers
from ._output import print_result

__all__ = ["VERIFY_CONVERSION_EXAMPLES", "add_verify_conversion_command"]


VERIFY_CONVERSION_EXAMPLES = (
    Example("compare a conversion with the Hub source it was made from (the commit it recorded)",
            "nxdi-gptoss-fp8 verify-conversion /data/models/gpt-oss-120b-fp8 --source openai/gpt-oss-120b"),
    Example("a local source, 8 workers, the per-layer report as JSON",
            "nxdi-gptoss-fp8 verify-conversion /data/models/gpt-oss-20b-fp8 --source /data/models/gpt-oss-20b "
            "--workers 8 --json"),
)


def _cmd_verify_conversion(args: argparse.Namespace) -> int:
    _checkpoint_dir(args.out, "OUT, the converted checkpoint directory")
    _needs("", "torch", "safetensors")
    from ..convert.verify import verify_conversion
    from ..errors import ConversionError

    workers = _workers(args.workers)
    source = _resolve(args.source, args.revision, recorded_in=args.out)
    try:  # arguments swapped, or a source that is not one: one line with the hint
        report = verify_conversion(args.out, source.path, progress=True, gate_up_split=args.ct_gate_up_split,
                                   given_source=args.source, workers=workers)
    except ConversionError as exc:
        raise UsageError(str(exc)) from None
    return print_result(report, args.json)


def add_verify_conversion_command(commands: Any) -> None:
    """The ``verify-conversion`` command's parser, beside its handler."""
    verify_conversion = commands.add_parser(
        "verify-conversion", help="compare a converted checkpoint with its source, value by value (needs torch)",
        description="Re-read OUT and SRC one expert at a time: every non-expert tensor must be bit-exact, every "
                    "FP8 expert value exact where E4M3 allows and within half an E4M3 step otherwise. Prints a "
                    "per-layer table; exit 1 on any violation.",
        examples=VERIFY_CONVERSION_EXAMPLES,
    )
    verify_conversion.add_argument("out", metavar="OUT", help="the converted checkpoint directory")
    verify_conversion.add_argument("--source", required=True, metavar="SRC",
                                   help="the source it was converted from: a directory or a Hub repo id")
    verify_conversion.add_argument("--revision", metavar="R", help="Hub revision of a repo-id SRC (default: the commit "
                                                                 "OUT records, else main)")
    _add_split_option(verify_conversion)
    _add_workers_option(verify_conversion, "compared")
    verify_conversion.add_argument("--json", action="store_true", help="print the report (or the error) as JSON")
    verify_conversion.set_defaults(handler=_cmd_verify_conversion)
