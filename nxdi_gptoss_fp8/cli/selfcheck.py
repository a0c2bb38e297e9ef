"""``selfcheck``: NxDI's real GPT-OSS on the CPU from one tiny weight set three ways, compared (needs NxDI)."""

from __future__ import annotations

import argparse
import os
from typing import Any

from ._errors import UsageError, _cannot_run
from ._help import Example
from ._output import print_result

__all__ = ["SELFCHECK_EXAMPLES", "add_selfcheck_command"]


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
