"""The arguments several commands share, checked the same way: a checkpoint directory, a
``--neuron-config`` file, the custom-model opt-in, sizes, the output options of every command that
writes a checkpoint, a source given as a directory or a Hub id, ``--workers`` and
``--ct-gate-up-split``; and the optional dependency a command needs, asked for at once.
"""

from __future__ import annotations

import argparse
import os
import sys
from typing import Any

from .. import format as fmt
from ..deps import require
from ..errors import ConfigError
from ..validate.pipeline import allow_custom_from_env
from ._errors import UsageError

__all__ = []


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


def _resolve(spec: str, revision: str | None, *, recorded_in: str | None = None,
             before_shards: Any = None) -> Any:
    """A local directory or a Hub repo id (``hub.resolve_source``); says on stderr which was used."""
    from ..errors import ConversionError
    from ..hub import is_repo_id, recorded_revision, resolve_source

    ambiguous = is_repo_id(spec)
    if revision is None and recorded_in is not None and ambiguous and not os.path.lexists(spec):
        revision = recorded_revision(recorded_in, spec)  # the commit the output was converted from
    try:
        resolved = resolve_source(spec, revision=revision, before_shards=before_shards)
    except ConversionError as exc:
        raise UsageError(str(exc)) from None
    if ambiguous or resolved.from_hub:
        print(f"source {resolved.describe()}", file=sys.stderr)
    return resolved


def _hub_spec(spec: str) -> bool:
    """Whether ``spec`` names a Hub repo (``REPO_ID`` or ``REPO_ID@REVISION``) rather than a local path:
    no such path here, and the shape of a repo id."""
    from ..hub import is_repo_id

    return not os.path.lexists(spec) and is_repo_id(spec.rsplit("@", 1)[0] if "@" in spec else spec)


def _checkpoint_source(spec: str, revision: str | None, command: str) -> Any:
    """The checkpoint ``command`` judges: a local path as it is (a directory wins over a Hub repo id
    of the same name, as in ``convert``), or a Hub repo id (``REPO_ID``, ``REPO_ID@REVISION``)
    read without downloading its weights (``hub.hub_checkpoint``: a ``CheckpointReader``). Says on
    stderr which was used when the name could be either."""
    from ..errors import ConversionError
    from ..hub import is_repo_id, split_revision

    if not _hub_spec(spec):
        if revision is not None:
            raise UsageError(f"--revision applies to a Hub repo id, but {spec} is a local path")
        if is_repo_id(spec):
            print(f"{command} {spec}: the local directory (a Hub repo of that name is not read)", file=sys.stderr)
        return spec
    try:
        repo_id, asked = split_revision(spec, revision)
    except ConversionError as exc:
        raise UsageError(str(exc)) from None
    from ..hub import hub_checkpoint

    reader = hub_checkpoint(repo_id, asked)
    if getattr(reader, "local", True):
        print(f"{command} {spec}: the local Hub cache's snapshot {reader.root} (HF_HUB_OFFLINE is set)", file=sys.stderr)
    else:
        print(f"{command} {spec}: Hub repo {repo_id}, revision {asked or 'main'} -> commit {reader.commit} "
              "(no local path of that name; no weights downloaded)", file=sys.stderr)
    return reader


def _workers(value: int | None) -> int | None:
    """``--workers`` checked (a usage error, exit 2, outside 1…MAX_WORKERS)."""
    from ..convert.workers import check_workers

    try:
        return None if value is None else check_workers(value)
    except ValueError as exc:
        raise UsageError(f"--{exc}") from None


def _add_workers_option(command: argparse.ArgumentParser, what: str) -> None:
    """``--workers N`` of convert and verify-conversion (``convert.workers``)."""
    command.add_argument("--workers", type=int, metavar="N",
                         help=f"experts {what} at once: up to 3 as threads, from 4 on as N/2 worker processes "
                              "taking whole layers (default: the CPUs this process may use, after its affinity and "
                              "cgroup quota; one process for models under 1 GB); fewer, with a warning, when the "
                              "available memory cannot hold them, or more than one process per layer and 8 lanes "
                              "each would be needed. N is 1 … 1024. The result does not depend on N")


def _add_split_option(command: argparse.ArgumentParser) -> None:
    """compressed-tensors sources whose files cannot tell how gate_up was split."""
    command.add_argument("--ct-gate-up-split", choices=("interleaved", "halves"), default=None,
                         help="compressed-tensors FP8 sources only, when the converter asks: how llm-compressor "
                              "split gate_up_proj (halves: llm-compressor 0.12.0-0.13.0; interleaved: other versions)")
