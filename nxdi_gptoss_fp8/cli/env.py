"""The ``env`` command."""

from __future__ import annotations

import argparse
import json
from typing import Any

from ._shared import EXIT_FINDINGS, EXIT_OK

__all__ = ["add_env_command"]


def _cmd_env(args: argparse.Namespace) -> int:
    from ..support import environment_report

    report = environment_report()
    print(json.dumps(report.to_dict(), indent=2) if args.json else report.render_text())
    return EXIT_OK if report.ok else EXIT_FINDINGS


def add_env_command(commands: Any) -> None:
    """The ``env`` command's parser, beside its handler."""
    env = commands.add_parser(
        "env", help="which Python, torch, transformers, NxDI, NxD, Neuron and vLLM packages are installed, and "
                    "whether each is in the tested matrix (any host)",
        description="Read the installed versions from package metadata (nothing heavy is imported) and place each "
                    "in this package's tested matrix: verified (what the nxdi tests and selfcheck ran against), "
                    "expected to work (the same API line; register() checks the signatures it wraps), unsupported "
                    "(with the reason and the way forward) or not installed. Also tells which vLLM Neuron plugin is "
                    "installed (the NxDI-backed one, or the newer one that does not use NxDI) and states the NxDI "
                    "support window. Exit 0, or 1 when an installed component is unsupported.",
    )
    env.add_argument("--json", action="store_true", help="print the report as JSON")
    env.set_defaults(handler=_cmd_env)
