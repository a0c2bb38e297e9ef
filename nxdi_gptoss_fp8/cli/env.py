"""``env``: the installed stack placed in the tested matrix, and the support window."""

from __future__ import annotations

import argparse
from typing import Any

from ._help import Example
from ._output import print_result

__all__ = ["ENV_EXAMPLES", "add_env_command"]


ENV_EXAMPLES = (
    Example("where this host's Python, torch, transformers, NxDI, NxD and vLLM stand in the tested matrix",
            "nxdi-gptoss-fp8 env"),
    Example("the same as JSON, e.g. to attach to a bug report", "nxdi-gptoss-fp8 env --json"),
)


def _cmd_env(args: argparse.Namespace) -> int:
    from ..support import environment_report

    report = environment_report()
    return print_result(report, args.json)


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
                    "support window (not supported on Trn2/Trn3 since Neuron SDK 2.34.0, no model on Inf2/Trn1 since "
                    "2.29; serving this format needs a Trn2 with a 2.27-2.31 image); on the newer plugin's stack one "
                    "line says this format does not serve there and what does. Exit 0, or 1 when an installed "
                    "component is unsupported.",
        examples=ENV_EXAMPLES,
    )
    env.add_argument("--json", action="store_true", help="print the report as JSON")
    env.set_defaults(handler=_cmd_env)
