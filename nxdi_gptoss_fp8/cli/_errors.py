"""How a command fails: one line on stderr and, with ``--json``, one JSON error document on stdout.

Every way a command can end without its result goes through ``report_failure``: a usage error
argparse finds (``JsonAwareParser``), a usage error of our own (``UsageError``), a missing dependency, a refusal,
an I/O error, Ctrl-C, SIGTERM or SIGHUP (``interrupt_signals``). The JSON shape is the same for
all of them::

    {"ok": false, "command": "convert", "exit_code": 2,
     "error": {"kind": "usage", "type": "UsageError", "message": "..."}}

``kind`` is one of ``ERROR_KINDS``: ``usage`` (the command line, argparse's errors included),
``missing_dependency`` (an optional package or NxDI), ``config`` (a setting), ``refused`` (the
checkpoint), ``io`` (a read or a write the disk or filesystem refused: full, read-only, an I/O
error), ``hub`` (a Hub repo that could not be read: unreachable, refused, not found, rate-limited,
offline), ``interrupted``. ``message`` is the stderr line without its ``nxdi-gptoss-fp8 COMMAND:``
prefix, both escaped alike (``printable``: a line break or a non-UTF-8 byte in a path never
splits or garbles the one line). A command's own result with ``ok`` false (findings, a failed
verification) is not a failure: it is printed as that command's report. With
``NXDI_GPTOSS_FP8_DEBUG`` on, the error's traceback (``print_traceback``) comes before the line;
nothing else changes.
"""

from __future__ import annotations

import argparse
import contextlib
import signal
import sys
import traceback
from collections.abc import Iterator, Mapping, Sequence
from typing import Any, NoReturn

from ..units import printable
from ._output import emit

__all__ = [
    "ERROR_KINDS", "EXIT_INTERRUPTED", "NOTHING_WRITTEN", "PARTIAL_OUTPUT_REMOVED", "PROG", "JsonAwareParser",
    "Terminated", "UsageError", "error_document", "interrupt_signals", "interrupted_message", "print_traceback",
    "report_failure",
    "signal_of", "usage_error", "wants_json",
]


ERROR_KINDS = ("usage", "missing_dependency", "config", "refused", "io", "hub", "interrupted")
EXIT_INTERRUPTED = 128 + signal.SIGINT
PROG = "nxdi-gptoss-fp8"
NOTHING_WRITTEN = "nothing was written"  # what an interrupted read-only command leaves


# what an interrupted command that writes OUT leaves (its ``interrupted`` default; read-only
# commands leave ``NOTHING_WRITTEN``)
PARTIAL_OUTPUT_REMOVED = "the partial output was removed and OUT is as it was before the run"


class UsageError(Exception):
    """A command-line input that cannot be used, or an output that could not be written (exit 2);
    ``kind`` is the ``--json`` error's kind (``io`` for a write the disk or filesystem refused),
    ``details`` its extra fields (``usage_error``)."""

    def __init__(self, message: str, *, details: Mapping[str, Any] | None = None, kind: str = "usage") -> None:
        super().__init__(message)
        self.details = dict(details or {})
        self.kind = kind


def usage_error(exc: Exception) -> UsageError:
    """``exc`` (a package error about an input or the output) as a ``UsageError``; a write the
    disk or filesystem refused (``OutputWriteError``: full, read-only) is of kind ``io`` and keeps
    its path and error name for ``--json``."""
    from ..errors import OutputWriteError

    if isinstance(exc, OutputWriteError):
        return UsageError(str(exc), kind="io", details={"type": "OutputWriteError", "path": exc.path,
                                                        "errno": exc.errno_name})
    return UsageError(str(exc))


def _cannot_run(exc: Exception) -> Exception:
    """Why NxDI's model cannot run, as the CLI's error: a missing or partial package (NxDI, NxD,
    transformers) is a missing dependency (``--json`` kind ``missing_dependency``), anything
    else a usage error; both exit 2."""
    from ..errors import MissingDependencyError

    if isinstance(exc, MissingDependencyError):
        return MissingDependencyError(f"{exc} (`nxdi-gptoss-fp8 env` says where this host stands)")
    return UsageError(str(exc))


def wants_json(argv: Sequence[str]) -> bool:
    """Whether ``argv`` asks for ``--json`` (as argparse reads it: the option or an
    abbreviation of it, before a ``--``)."""
    for token in argv:
        if token == "--":
            return False
        if len(token) >= 3 and "--json".startswith(token):
            return True
    return False


def error_document(command: str | None, kind: str, message: str, exit_code: int, error_type: str,
                   details: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """The one JSON error shape (see the module docstring); ``details`` are extra fields of
    ``error`` (a failed write's ``type``, ``path`` and ``errno``)."""
    assert kind in ERROR_KINDS, kind
    return {"ok": False, "command": command, "exit_code": exit_code,
            "error": {"kind": kind, "type": error_type, "message": message, **(details or {})}}


def report_failure(command: str | None, kind: str, message: str, exit_code: int, *, as_json: bool,
                   error_type: str, details: Mapping[str, Any] | None = None) -> int:
    """Print the failure (stderr line; with ``as_json`` the document on stdout) and return ``exit_code``.
    ``message`` is shown escaped (``printable``), the same on stderr and in the document."""
    prefix = f"{PROG} {command}" if command else PROG
    message = printable(message)
    return emit(error_document(command, kind, message, exit_code, error_type, details), f"{prefix}: {message}",
                as_json=as_json, exit_code=exit_code, failure=True)


def print_traceback(exc: BaseException) -> None:
    """``exc``'s traceback on stderr (``NXDI_GPTOSS_FP8_DEBUG``), with the whole chain: a library
    error the command re-raised as its own (``raise UsageError(...) from None``) shows where it
    was first raised too."""
    seen: set[int] = set()
    link: BaseException | None = exc
    while link is not None and id(link) not in seen:
        seen.add(id(link))
        if link.__suppress_context__ and link.__cause__ is None:
            link.__cause__ = link.__context__  # shown as the direct cause it is
        link = link.__cause__ or link.__context__
    traceback.print_exception(exc, file=sys.stderr)
    with contextlib.suppress(OSError, ValueError):
        sys.stderr.flush()


class JsonAwareParser(argparse.ArgumentParser):
    """An ``ArgumentParser`` whose usage errors are one line on stderr, like every other failure
    (no usage block: the line names the command's ``--help``), and also the JSON error document
    on stdout when the command line asks for ``--json`` (subcommand parsers inherit the class
    and the argv)."""

    argv: Sequence[str] = ()  # the command line being parsed, set by the top-level parse_args

    def parse_args(self, args: Sequence[str] | None = None, namespace: Any = None) -> Any:  # type: ignore[override]
        JsonAwareParser.argv = list(sys.argv[1:] if args is None else args)
        return super().parse_args(args, namespace)

    def error(self, message: str) -> NoReturn:
        names = self._command_names()  # empty on a subcommand's parser, whose prog ends with its name
        command = next((t for t in JsonAwareParser.argv if t in names), None) if names else self.prog.split()[-1]
        usage = f"{PROG} {command} --help" if command else f"{PROG} --help"
        report_failure(command, "usage", f"{message} (run '{usage}')", 2, as_json=wants_json(JsonAwareParser.argv),
                       error_type="UsageError")
        self.exit(2)

    def _command_names(self) -> set[str]:
        """The subcommands of this parser (the top-level one reports an unrecognized argument
        after the subcommand parsed: the command line then names the command)."""
        return {name for action in self._actions if isinstance(action, argparse._SubParsersAction)
                for name in action.choices}


class Terminated(KeyboardInterrupt):
    """SIGTERM or SIGHUP, raised in the main thread so every ``with`` block unwinds as for Ctrl-C
    (a partial output is removed)."""

    def __init__(self, signum: int) -> None:
        super().__init__(signum)
        self.signum = signum


def signal_of(exc: BaseException) -> int:
    """The signal an interruption came from (Ctrl-C: SIGINT)."""
    return int(getattr(exc, "signum", signal.SIGINT))


def interrupted_message(exc: BaseException, cleaned_up: str) -> tuple[str, int]:
    """(The full sentence, the exit code) for an interruption: what interrupted the command,
    what was cleaned up, and the exit code, the same for Ctrl-C, SIGTERM and SIGHUP."""
    signum = signal_of(exc)
    name = signal.Signals(signum).name
    how = f"{name} (Ctrl-C)" if signum == signal.SIGINT else name
    code = 128 + signum
    return f"interrupted by {how}: {cleaned_up} (exit {code})", code


@contextlib.contextmanager
def interrupt_signals() -> Iterator[None]:
    """Inside: SIGTERM (kill, timeout, docker stop, Kubernetes) and SIGHUP behave like SIGINT
    (``Terminated``, a ``KeyboardInterrupt``). Outside the main thread nothing changes."""
    def interrupt(signum: int, _frame: Any) -> None:
        raise Terminated(signum)

    previous = {}
    for signum in (signal.SIGTERM, signal.SIGHUP):
        with contextlib.suppress(ValueError, OSError):  # not the main thread: leave the defaults
            previous[signum] = signal.signal(signum, interrupt)
    try:
        yield
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)
