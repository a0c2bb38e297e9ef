"""``doctor``: a ``vllm serve`` command and this host judged as the start judges them."""

from __future__ import annotations

import argparse
from typing import Any

from .. import format as fmt
from ..nxdi import recipes
from ._errors import UsageError
from ._help import Example
from ._output import print_result

__all__ = ["DOCTOR_EXAMPLES", "add_doctor_command"]


def _doctor_recipe_example() -> str:
    """The README's vLLM recipe (``nxdi.recipes``) for gpt-oss-120b, its serve command given to doctor."""
    dims = fmt.PROFILES[fmt.PROFILE_120B]
    *exports, serve = recipes.vllm_command("/data/models/gpt-oss-120b-fp8", "/data/neuron-compiled/gpt-oss-120b-fp8-tp64",
                                           "/data/tiktoken", dims.hidden_size, dims.intermediate_size).split("\n", 3)
    return "\n".join([*exports, f"nxdi-gptoss-fp8 doctor -- {serve}"])


DOCTOR_EXAMPLES = (
    Example("the settings and the serve command of the vLLM recipe, checked before the server starts",
            _doctor_recipe_example()),
    Example("the environment only (CHECKPOINT_FORMAT, NEURON_COMPILED_ARTIFACTS, TIKTOKEN_ENCODINGS_BASE), as JSON",
            "nxdi-gptoss-fp8 doctor --json"),
)


def _cmd_doctor(args: argparse.Namespace) -> int:
    from ..nxdi.serving_host import CommandError, lint_serving_host

    command = list(args.serve_command)
    if command[:1] == ["--"]:
        command = command[1:]
    try:
        report = lint_serving_host(command)
    except CommandError as exc:
        raise UsageError(str(exc)) from None
    return print_result(report, args.json)


def add_doctor_command(commands: Any) -> None:
    """The ``doctor`` command's parser, beside its handler."""
    doctor = commands.add_parser(
        "doctor", help="run the start's own checks on a vllm serve command and this host (stdlib, any host)",
        description="Run the start's own checks on a vllm serve command and this host, before it starts: the start "
                    "plan the hook runs at the start, evaluated without NxDI, in its order — the entry point vLLM "
                    "loads (VLLM_PLUGINS), the NeuronConfig vllm-neuron builds from the command (its own functions "
                    "where vllm-neuron is installed, else the package's model of 0.1.0 and 0.2.0, which the report "
                    "names) and what vllm-neuron refuses in it, CHECKPOINT_FORMAT, every NXDI_GPTOSS_FP8_* setting "
                    "and normalized_fp8_* key as the load reads them, where the compile writes "
                    "(NEURON_COMPILED_ARTIFACTS), a precompiled directory's pre-sharded weights, and the checkpoint "
                    "checked with that NeuronConfig by the checks `validate MODEL --neuron-config FILE` runs (another "
                    "kind of directory is named as inspect names it); then Harmony's o200k_base.tiktoken in "
                    "TIKTOKEN_ENCODINGS_BASE. The command is read as vLLM reads it (vllm by any path or python -m "
                    "vllm.entrypoints.openai.api_server; the model as the positional or --model; --opt=value; _ or - "
                    "in option names; the last of a repeated option; --additional-config as JSON). Without a command "
                    "after --, only the environment is checked. One line per finding, each with its fix. Exit 0: the "
                    "start loads (warnings may remain); 1: an error stops it; 2: not a vLLM server's command line, or "
                    "vLLM's --config YAML (pass its options instead). Rules: docs/serving.md.",
        examples=DOCTOR_EXAMPLES,
    )
    doctor.add_argument("--json", action="store_true", help="print the findings as JSON")
    doctor.add_argument("serve_command", nargs=argparse.REMAINDER, metavar="-- vllm serve MODEL ...",
                        help="the vllm serve command line to check (after --)")
    doctor.set_defaults(handler=_cmd_doctor)
