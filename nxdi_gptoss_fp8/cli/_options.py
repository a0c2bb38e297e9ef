"""What every command shares: exit codes, the usage error, argument checks and common options."""

from __future__ import annotations

import argparse
import os
from collections.abc import Mapping
from typing import Any

from .. import format as fmt
from ..deps import require
from ..errors import ConfigError
from ..validate.pipeline import allow_custom_from_env

__all__ = ["EXIT_FINDINGS", "EXIT_OK", "EXIT_PARTIAL", "EXIT_USAGE", "PARTIAL_OUTPUT_REMOVED", "UsageError", "usage_error"]


EXIT_OK, EXIT_FINDINGS, EXIT_USAGE, EXIT_PARTIAL = 0, 1, 2, 3
# what an interrupted command that writes OUT leaves (its ``interrupted`` default; read-only
# commands leave ``failure.NOTHING_WRITTEN``)
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


def _checkpoint_dir(path: str, what: str = "the checkpoint directory") -> str:
    """``path`` if it is a directory we can list; else a usage error (exit 2) saying why."""
    if not os.path.exists(path):
        raise UsageError(f"{path} does not exist: pass {what}")
    if not os.path.isdir(path):
        raise UsageError(f"{path} is a file, not a directory: pass {what} (the one holding {fmt.INDEX_FILE})")
    if not os.access(path, os.R_OK | os.X_OK):
        raise UsageError(f"{path} cannot be listed (permissions): run as a user who can read it")
    return path


def _needs(purpose: str, *modules: str) -> None:
    """Fail at once, in one line, when a module is missing that the command (or its option
    ``purpose``, e.g. "--deep") needs (exit 2)."""
    for module in modules:
        require(module, purpose)


def _load_neuron_config(path: str | None) -> dict[str, Any] | None:
    """The ``--neuron-config`` JSON, read like every checkpoint JSON: regular file, strict, bounded
    (``validate.nxdi_config.read_config_file``, which ``preflight(neuron_config=PATH)`` uses too)."""
    if path is None:
        return None
    from ..validate.nxdi_config import read_config_file

    try:
        return read_config_file(path, f"--neuron-config {path}")
    except ConfigError as exc:
        raise UsageError(str(exc)) from None


def _allow_custom(args: argparse.Namespace) -> bool:
    """``--allow-custom-model`` or the environment opt-in (read either way: a value that is
    neither on nor off is refused even when the flag is given)."""
    return allow_custom_from_env() or args.allow_custom_model


def _size(text: str, option: str = "--max-shard-size") -> int:
    from ..units import parse_size

    try:
        return parse_size(text)
    except ValueError as exc:
        raise UsageError(f"{option}: {exc}") from None


def _padded_size(text: str) -> int:
    """An argparse type for H'/I': a decimal integer up to 2^31 (the format's dimension bound); 0 and
    sizes below the model's are refused by the command itself, which knows the model."""
    stripped = text.strip()
    if not stripped.isdigit() or len(stripped) > 10 or int(stripped) > fmt.MAX_DIMENSION:  # 0: the command's own check
        shown = stripped if len(stripped) <= 20 else f"a number of {len(stripped)} characters"
        raise argparse.ArgumentTypeError(f"must be a whole number up to 2^31 (the model's size plus a multiple "
                                         f"of {fmt.PAD_MULTIPLE}), not {shown}")
    return int(stripped)


def _add_output_options(command: argparse.ArgumentParser, *, max_shard_size: str, why: str = "") -> None:
    """The options of every command that writes a normalized checkpoint."""
    command.add_argument("--padded-hidden-size", type=_padded_size, metavar="N", help="H' (H plus a multiple of 32)")
    command.add_argument("--padded-intermediate-size", type=_padded_size, metavar="N", help="I' (I plus a multiple of 32)")
    command.add_argument("--max-shard-size", default=max_shard_size, metavar="SIZE",
                         help=f"largest shard, 1 B … 2^53 bytes, e.g. 5GB, 500MB, 2GiB (default {max_shard_size}{why})")
    command.add_argument("--overwrite", action="store_true",
                         help="replace a non-empty output directory, only when its content is an earlier output of "
                              "the same kind (this tool's files, nothing else); anything else, or the current "
                              "directory, is refused (exit 2), never emptied")
