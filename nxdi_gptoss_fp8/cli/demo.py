"""``demo``: the README's first command — a tiny checkpoint made, validated, corrupted and loaded."""

from __future__ import annotations

import argparse
from typing import Any

from ._help import Example
from ._output import EXIT_FINDINGS, EXIT_OK

__all__ = ["DEMO_EXAMPLES", "add_demo_command"]


DEMO_EXAMPLES = (
    Example("make a tiny checkpoint, validate it, corrupt copies and read the findings",
            "nxdi-gptoss-fp8 demo"),
)


def _cmd_demo(args: argparse.Namespace) -> int:
    from ..demo import run_demo

    return EXIT_OK if run_demo() else EXIT_FINDINGS


def add_demo_command(commands: Any) -> None:
    """The ``demo`` command's parser, beside its handler."""
    demo = commands.add_parser(
        "demo", help="make a tiny checkpoint, validate it, corrupt copies and show the findings",
        description="No arguments: everything happens in a temporary directory that is removed afterwards. "
                    "Needs nothing but Python; the last step (the zero-copy load) runs when torch is installed.",
        examples=DEMO_EXAMPLES,
    )
    demo.set_defaults(handler=_cmd_demo, interrupted="its temporary directory was removed")
