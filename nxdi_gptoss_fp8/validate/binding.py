"""What a preflight report is bound to, so the loader maps only what was checked. Stdlib only.

A report is worth something only for the directory, the options, the NxDI config and the file
versions it checked. ``preflight()`` seals those into a ``CheckedCheckpoint`` (its view of the
checkpoint plus a ``Binding``); the loader compares the binding with the load it is asked for
and refuses any difference before it maps a byte. ``CheckedCheckpoint`` can be made only by
``seal()`` (which the preflight calls): an unbound or hand-assembled report cannot reach the
loader by accident.
"""

from __future__ import annotations

import enum
import hashlib
import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from ..safeio.files import FileIdentity

if TYPE_CHECKING:
    from .view import CheckpointView

__all__ = ["NO_CONFIG", "Binding", "BoundFile", "CheckedCheckpoint", "config_fingerprint", "seal"]

NO_CONFIG = "none"  # the fingerprint of "no NxDI config was given"
_MAX_DEPTH = 64  # a config nested deeper is fingerprinted down to here (the preflight refuses it anyway)
_MAX_NODES = 200_000  # and at most this many values of it
_SEAL = object()  # only seal() holds it: CheckedCheckpoint refuses to be made without it


@dataclass(frozen=True)
class BoundFile:
    """One checked file: its identity and the SHA-256 of the bytes the preflight read
    (the header for a shard, the whole file for ``config.json`` and the index)."""

    name: str
    identity: FileIdentity
    sha256: str


@dataclass(frozen=True)
class Binding:
    """The circumstances of one preflight run, compared by the loader with the load."""

    root: str  # the checked directory, resolved (realpath)
    headers_only: bool  # the scale values were not read: a partial verdict
    errors: int  # error findings when the run ended (the report's findings list stays mutable)
    allow_custom_model: bool
    deep: bool
    verify_checksums: bool
    config_fingerprint: str  # ``config_fingerprint()`` of the NxDI config given, or NO_CONFIG
    files: tuple[BoundFile, ...]  # config.json, the index and every shard whose header was read

    def file(self, name: str) -> BoundFile | None:
        """The bound record of ``name`` (a file name in the directory), if it was checked."""
        return next((bound for bound in self.files if bound.name == name), None)


@dataclass(frozen=True)
class CheckedCheckpoint:
    """A preflight's view of a checkpoint together with what it is bound to; made only by ``seal``."""

    view: CheckpointView
    binding: Binding
    _seal: object = field(default=None, repr=False, compare=False)

    def __post_init__(self) -> None:
        if self._seal is not _SEAL:
            raise TypeError("a CheckedCheckpoint is made only by preflight(); run the preflight instead of building one")


def seal(view: CheckpointView, *, root: str, headers_only: bool, errors: int, allow_custom_model: bool, deep: bool,
         verify_checksums: bool, config: object, json_files: Mapping[str, tuple[FileIdentity, str]]) -> CheckedCheckpoint:
    """Bind ``view`` to its run: the resolved ``root``, the options, the error count, the
    ``config`` given (the object ``config_fingerprint`` hashes) and the identity of every file read."""
    files = [BoundFile(name, identity, digest) for name, (identity, digest) in json_files.items()]
    files += [BoundFile(name, header.identity, header.header_sha256) for name, header in view.headers.items()]
    binding = Binding(
        root=root, headers_only=headers_only, errors=errors, allow_custom_model=allow_custom_model, deep=deep,
        verify_checksums=verify_checksums, config_fingerprint=config_fingerprint(config),
        files=tuple(sorted(files, key=lambda bound: bound.name)),
    )
    return CheckedCheckpoint(view, binding, _SEAL)


# --------------------------------------------------------------------------- config fingerprint


def config_fingerprint(config: object) -> str:
    """A stable SHA-256 of an NxDI config (InferenceConfig, NeuronConfig, a mapping of one, or
    a tuple of them), or ``NO_CONFIG`` for None.

    Every attribute counts, nested objects included, so a config changed in any field after the
    preflight no longer matches. Values are reduced to JSON without loss for data (integers as
    hex, so a 5,000-digit one costs no decimal conversion; floats by ``repr``); an object that
    is not data counts by its type name. Bounded in depth and size; never raises.
    """
    if config is None:
        return NO_CONFIG
    budget = [_MAX_NODES]
    text = json.dumps(_canonical(config, 0, budget), sort_keys=True, separators=(",", ":"), ensure_ascii=True)
    return hashlib.sha256(text.encode("ascii")).hexdigest()


def _type_name(value: object) -> str:
    kind = type(value)
    return f"{kind.__module__}.{kind.__qualname__}"


def _canonical(value: object, depth: int, budget: list[int]) -> object:
    try:
        return _reduce(value, depth, budget)
    except Exception:  # a property or repr that raises: the type still counts
        return ["unreadable", _type_name(value)]


def _reduce(value: object, depth: int, budget: list[int]) -> object:
    budget[0] -= 1
    if budget[0] < 0 or depth > _MAX_DEPTH:
        return ["cut"]
    if value is None or isinstance(value, (bool, str)):
        return value
    if isinstance(value, int):
        return ["int", format(value, "x")]
    if isinstance(value, float):
        return ["float", repr(value)]
    if isinstance(value, enum.Enum):
        return ["enum", _type_name(value), value.name]
    if isinstance(value, Mapping):
        items = [(json.dumps(_canonical(key, depth + 1, budget), sort_keys=True), _canonical(item, depth + 1, budget))
                 for key, item in list(value.items())]
        return ["map", sorted(items, key=lambda pair: pair[0])]
    if isinstance(value, (list, tuple)):
        return ["list", [_canonical(item, depth + 1, budget) for item in value]]
    if isinstance(value, (set, frozenset)):
        return ["set", sorted(json.dumps(_canonical(item, depth + 1, budget), sort_keys=True) for item in value)]
    try:
        attributes = vars(value)
    except TypeError:
        attributes = None
    if isinstance(attributes, dict) and not isinstance(value, type) and not callable(value):
        return ["obj", _type_name(value), _canonical(attributes, depth + 1, budget)]
    if isinstance(value, type):
        return ["class", f"{value.__module__}.{value.__qualname__}"]
    text = repr(value) if type(value).__repr__ is not object.__repr__ else ""
    # a repr naming a memory address differs per process and object: only the type then counts
    return ["value", _type_name(value), "" if " at 0x" in text else text[:1000]]
