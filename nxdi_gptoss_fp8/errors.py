"""The package's exception types. Every message says what is wrong, where, and how to fix it.

What a client catches: vllm-neuron's ``_load_weights_common`` catches ``(FileNotFoundError,
ValueError)`` around the load of precompiled artifacts and compiles again ("Recompiling..."). So no
error of ours may leave the hook as one of those: every type raised at load time derives from
neither ``ValueError`` nor ``OSError``, and the two that must stay so for library callers
(``ConfigError`` a ``ValueError``, ``NotRegularFileError`` an ``OSError``), like any ``ValueError`` /
``OSError`` met while the hook runs our code, are re-raised at the hook boundary as
``LoadRefusedError`` (``refusals_stop_the_start``), the original as its ``__cause__``.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Protocol

__all__ = [
    "CLIENT_CAUGHT", "CheckpointFormatError", "ConfigError", "ConversionError", "CpuModelError", "CpuModelUnavailableError", "FailedReportError", "HubAccessError",
    "IntegrityError", "LoadError", "LoadRefusedError", "MissingDependencyError", "NotRegularFileError",
    "NxdiGptossFp8Error", "OutputWriteError", "PreflightError", "RegistrationError", "ReportBindingError",
    "ShardedWeightsError", "refusals_stop_the_start",
]


class _Coded(Protocol):
    @property
    def code(self) -> str: ...


class _Report(Protocol):
    """What an error needs of a report (``validate.findings.PreflightReport`` is one): this module
    imports nothing of the package, so every module may raise its errors."""

    @property
    def errors(self) -> Sequence[_Coded]: ...

    def render_text(self, *, summarize: bool = ...) -> str: ...


class _ShardedCheck(Protocol):
    """What ``ShardedWeightsError`` needs of a check (``validate.presharded.ShardedCheck`` is one)."""

    @property
    def report(self) -> _Report: ...


class NxdiGptossFp8Error(Exception):
    """Base class of every error this package raises on purpose."""


class ConfigError(NxdiGptossFp8Error, ValueError):
    """A setting the caller gave cannot be used as given: an on/off environment variable that is
    neither on nor off, or a configuration file (``--neuron-config``, ``preflight(neuron_config=PATH)``)
    that cannot be read as a JSON object. The message names the setting and what it accepts."""


class PreflightError(NxdiGptossFp8Error):
    """The preflight found errors; ``report`` holds every finding, the message lists them.

    ``hint``, when given, leads the message: what the directory is instead and what to do.
    """

    def __init__(self, report: _Report, hint: str | None = None) -> None:
        super().__init__(f"{hint}\n{report.render_text(summarize=False)}" if hint else report.render_text(summarize=False))
        self.report = report
        self.hint = hint

    @property
    def codes(self) -> list[str]:
        return [finding.code for finding in self.report.errors]


class CheckpointFormatError(NxdiGptossFp8Error):
    """CHECKPOINT_FORMAT or the NxDI ``checkpoint_format`` opt-in is misspelled or contradictory."""


class IntegrityError(NxdiGptossFp8Error):
    """A shard changed between the preflight and the load, or a digest does not match."""


class ShardedWeightsError(IntegrityError):
    """NxDI's pre-sharded weights (``COMPILED/weights``) refused before NxDI read a byte of them;
    ``check`` holds every finding, ``codes`` the error codes."""

    def __init__(self, message: str, check: _ShardedCheck) -> None:
        super().__init__(message)
        self.check = check

    @property
    def codes(self) -> list[str]:
        return [finding.code for finding in self.check.report.errors]


class LoadError(NxdiGptossFp8Error):
    """The checkpoint cannot be loaded as asked (a wrong call, not a malformed checkpoint)."""


class LoadRefusedError(LoadError):
    """A refusal met while the hook ran our code that was a ``ValueError`` or ``OSError`` (a
    ``ConfigError``, a ``NotRegularFileError``, a file that vanished), re-raised as this type so a
    client's ``except (FileNotFoundError, ValueError)`` cannot mistake it for missing precompiled
    artifacts and recompile: the start stops with the message. ``__cause__`` is the original."""


# what clients catch around a load and turn into a recompile (vllm-neuron 0.1-0.2's
# _load_weights_common: FileNotFoundError, ValueError; OSError covers FileNotFoundError's siblings)
CLIENT_CAUGHT: tuple[type[BaseException], ...] = (ValueError, OSError)


@contextmanager
def refusals_stop_the_start() -> Iterator[None]:
    """Run our part of a hooked NxDI call; a ``CLIENT_CAUGHT`` error leaves as ``LoadRefusedError``
    (same message; a foreign exception's type is named in it)."""
    try:
        yield
    except CLIENT_CAUGHT as exc:
        text = str(exc) if isinstance(exc, NxdiGptossFp8Error) else f"{type(exc).__name__}: {exc}"
        raise LoadRefusedError(text) from exc


class ReportBindingError(LoadError):
    """The preflight report handed to the loader does not vouch for this load (another
    directory, a headers-only or failed run, another NxDI config or opt-in); nothing was mapped."""


class FailedReportError(PreflightError, ReportBindingError):
    """A report with errors handed to the loader: a ``PreflightError`` (``report`` holds every
    finding) whose message is one line, the count and the first finding."""

    def __init__(self, report: _Report, message: str) -> None:
        Exception.__init__(self, message)
        self.report = report
        self.hint = None


class ConversionError(NxdiGptossFp8Error):
    """A source checkpoint cannot be converted (unknown layout, bad tensor, existing output)."""


class OutputWriteError(ConversionError):
    """Writing an output failed part way (disk full, quota, I/O error; the partial output was
    removed and OUT is as it was) or cannot start (OUT on a read-only filesystem: nothing was
    written). ``path`` is the file or folder being written, ``errno_name`` the system's name of
    the error (``ENOSPC``, ``EROFS``), when known."""

    def __init__(self, message: str, *, path: str, errno_name: str | None = None) -> None:
        super().__init__(message)
        self.path = path
        self.errno_name = errno_name


class NotRegularFileError(NxdiGptossFp8Error, OSError):
    """An input path is a FIFO, socket, device or directory: refused before it is read."""


class FileTooLargeError(NxdiGptossFp8Error):
    """An input file above the size its reader accepts: refused, never truncated. ``size`` is the
    size seen (on disk, or once read when the file ``grew`` while it was read), ``limit`` the cap."""

    def __init__(self, message: str, *, size: int, limit: int, grew: bool) -> None:
        super().__init__(message)
        self.size = size
        self.limit = limit
        self.grew = grew


class HubAccessError(NxdiGptossFp8Error):
    """A Hub repo that cannot be read (unreachable, refused, not found, rate-limited, offline):
    one line saying what failed and what to do; nothing was judged and nothing written."""


class MissingDependencyError(NxdiGptossFp8Error):
    """An optional package a command needs (torch, numpy, safetensors, NxDI) is not installed."""


class CpuModelError(NxdiGptossFp8Error):
    """NxDI's model cannot run on the CPU here: NxDI is not importable, or its run failed."""



class CpuModelUnavailableError(CpuModelError, MissingDependencyError):
    """NxDI's model cannot run on the CPU here because a package it needs (NxDI, NxD,
    transformers) is missing or importable only in part: the environment, not a failed run."""


class RegistrationError(NxdiGptossFp8Error):
    """The installed NxDI does not have what the hook wraps; nothing was patched."""


