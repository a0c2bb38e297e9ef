"""``nxdi-gptoss-fp8``: validate, inspect, make and convert normalized FP8 GPT-OSS checkpoints.

A thin face over the library: each command parses its arguments, calls one library function
and renders the result. Data goes to stdout, messages to stderr. Exit codes: 0 success /
valid, 1 findings or a failed check, 2 usage error, unreadable input or a missing optional
dependency (torch, numpy, NxDI) or a setting that cannot be read. Known errors print one line;
NXDI_GPTOSS_FP8_DEBUG=1 prints each one's traceback (its whole chain) before that line, the exit
status unchanged. A closed stdout (``| head``) ends the command quietly.
"""

from __future__ import annotations

import argparse
import contextlib
import logging
import os
import sys
from collections.abc import Sequence
from typing import Any

from .. import format as fmt
from .._version import __version__
from ..deps import OPTIONAL, missing
from ..errors import ConfigError, HubAccessError, MissingDependencyError, NxdiGptossFp8Error
from ..units import printable
from ..validate.nxdi_config import switch_from_env
from ._errors import (
    NOTHING_WRITTEN,
    UsageError,
    interrupt_signals,
    interrupted_message,
    print_traceback,
    report_failure,
)
from ._help import CommandParser, Example
from ._output import EXIT_FINDINGS, EXIT_OK, EXIT_PARTIAL, EXIT_USAGE
from .check_forward import add_check_forward_command
from .convert import add_convert_command
from .demo import add_demo_command
from .doctor import add_doctor_command
from .env import add_env_command
from .goldens import add_goldens_command
from .inference_demo import add_inference_demo_command
from .inspect import add_inspect_command
from .make_tiny import add_make_tiny_command
from .selfcheck import add_selfcheck_command
from .validate import add_validate_command
from .verify_conversion import add_verify_conversion_command

__all__ = ["DEBUG_ENV", "EXIT_BROKEN_PIPE", "EXIT_FINDINGS", "EXIT_OK", "EXIT_PARTIAL", "EXIT_USAGE", "JOB_EXAMPLES",
           "UsageError", "build_parser", "main"]

# the job in order, from a published checkpoint to a server
JOB_EXAMPLES = (
    Example("what you hold, and the command that applies", "nxdi-gptoss-fp8 inspect /data/models/gpt-oss-120b"),
    Example("the conversion's plan: files, shards, free space, peak memory",
            "nxdi-gptoss-fp8 convert openai/gpt-oss-120b /data/models/gpt-oss-120b-fp8 --dry-run"),
    Example("convert", "nxdi-gptoss-fp8 convert openai/gpt-oss-120b /data/models/gpt-oss-120b-fp8"),
    Example("compare every value with the source",
            "nxdi-gptoss-fp8 verify-conversion /data/models/gpt-oss-120b-fp8 --source openai/gpt-oss-120b"),
    Example("check the checkpoint where it will be loaded", "nxdi-gptoss-fp8 validate /data/models/gpt-oss-120b-fp8"),
    Example("check the serve command and the host before the server starts",
            "nxdi-gptoss-fp8 doctor -- vllm serve /data/models/gpt-oss-120b-fp8 --tensor-parallel-size 64 ..."),
)


def build_parser(prog: str = "nxdi-gptoss-fp8") -> argparse.ArgumentParser:
    parser = CommandParser(
        prog=prog,
        description=(
            "Validate, inspect, make and convert normalized static-FP8 GPT-OSS checkpoints for "
            "AWS NeuronX Distributed Inference. Validation reads headers only and needs no "
            "Neuron SDK: run it on any host before you load."
        ),
        epilog=("Exit codes: 0 valid/success, 1 findings or failed check, 2 usage error or unreadable input, "
                "3 partial verdict (validate --headers-only: no errors in what was checked, not everything checked). "
                f"The format, every check and finding code: {fmt.format_document_ref()}"),
        examples=JOB_EXAMPLES,
    )
    parser.add_argument("--version", action="version", version=f"%(prog)s {__version__}")
    commands = parser.add_subparsers(dest="command", metavar="COMMAND")
    commands.required = True
    add_validate_command(commands)
    add_inspect_command(commands)
    add_make_tiny_command(commands)
    add_demo_command(commands)
    add_inference_demo_command(commands)
    add_convert_command(commands)
    add_verify_conversion_command(commands)
    add_env_command(commands)
    add_doctor_command(commands)
    add_selfcheck_command(commands)
    add_check_forward_command(commands)
    add_goldens_command(commands)
    return parser


EXIT_BROKEN_PIPE = 128 + 13  # what a shell reports for a process ended by SIGPIPE
DEBUG_ENV = "NXDI_GPTOSS_FP8_DEBUG"


def main(argv: Sequence[str] | None = None, prog: str = "nxdi-gptoss-fp8") -> int:
    parser = build_parser(prog)
    args = parser.parse_args(argv)  # a usage error: argparse's lines (and, with --json, the JSON error), exit 2
    for stream in (sys.stdout, sys.stderr):  # names from disk may not be valid UTF-8
        if hasattr(stream, "reconfigure"):
            stream.reconfigure(errors="backslashreplace")
    as_json = bool(getattr(args, "json", False))

    debug = False

    def fail(kind: str, message: str, code: int, exc: BaseException) -> int:
        if debug:  # the traceback first; the one line, the JSON document and the exit status stay as they are
            print_traceback(exc)
        return report_failure(args.command, kind, message, code, as_json=as_json, error_type=type(exc).__name__,
                              details=getattr(exc, "details", None))

    try:
        debug = switch_from_env(DEBUG_ENV, os.environ, "tracebacks")
    except ConfigError as exc:
        return fail("config", str(exc), EXIT_USAGE, exc)
    _log_to_stderr()
    signals = interrupt_signals() if getattr(args, "signals", True) else contextlib.nullcontext()
    try:
        with signals:
            code = int(args.handler(args))
            sys.stdout.flush()  # a closed pipe shows here, not at interpreter exit
        return code
    except BrokenPipeError:
        _silence_stdout()
        return EXIT_BROKEN_PIPE
    except UsageError as exc:
        return fail(exc.kind, str(exc), EXIT_USAGE, exc)
    except MissingDependencyError as exc:  # the environment, not the checkpoint
        return fail("missing_dependency", str(exc), EXIT_USAGE, exc)
    except ConfigError as exc:  # a setting
        return fail("config", str(exc), EXIT_USAGE, exc)
    except ModuleNotFoundError as exc:  # an optional package that a lazy import needed
        if (exc.name or "").split(".")[0] not in OPTIONAL:
            raise
        return fail("missing_dependency", str(missing(exc.name or "")), EXIT_USAGE, exc)
    except HubAccessError as exc:  # the Hub could not be read: nothing was judged
        if debug:
            raise
        return fail("hub", str(exc), EXIT_USAGE, exc)
    except NxdiGptossFp8Error as exc:
        return fail("refused", str(exc), EXIT_FINDINGS, exc)
    except OSError as exc:
        where = f" {exc.filename}" if exc.filename else ""
        return fail("io", f"cannot access{where}: {exc.strerror or exc}", EXIT_USAGE, exc)
    except KeyboardInterrupt as exc:  # Ctrl-C, or SIGTERM/SIGHUP (Terminated): every with-block has unwound
        message, code = interrupted_message(exc, getattr(args, "interrupted", NOTHING_WRITTEN))
        with contextlib.suppress(OSError, ValueError):
            if debug:
                print_traceback(exc)
            return report_failure(args.command, "interrupted", message, code, as_json=as_json,
                                  error_type="Interrupted")
        return code


class _StderrHandler(logging.StreamHandler):  # type: ignore[type-arg]
    """Writes to whatever ``sys.stderr`` is at the time of the message."""

    @property  # type: ignore[override]
    def stream(self) -> Any:
        return sys.stderr

    @stream.setter
    def stream(self, value: Any) -> None:
        pass

    def format(self, record: logging.LogRecord) -> str:
        return printable(super().format(record))  # one line, escaped as every failure line is


def _log_to_stderr() -> None:
    """The package's warnings (e.g. a removed leftover of an interrupted run) as plain stderr lines."""
    logger = logging.getLogger("nxdi_gptoss_fp8")
    if not any(isinstance(handler, _StderrHandler) for handler in logger.handlers):
        handler = _StderrHandler()
        handler.setFormatter(logging.Formatter("nxdi-gptoss-fp8: %(message)s"))
        logger.addHandler(handler)
        if logger.level == logging.NOTSET:
            logger.setLevel(logging.WARNING)


def _silence_stdout() -> None:
    """After the reader of stdout went away, send what is still buffered nowhere."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        os.close(devnull)
    except (OSError, ValueError):
        pass
