"""The ``header``, ``ownership`` and ``collision`` checks: every shard header read, every tensor owned
by the shard the index names, no tensor twice.
"""

from __future__ import annotations

import functools
import itertools
import operator
from collections.abc import Mapping
from typing import Any

from ..errors import NotRegularFileError
from ..safeio.reader import CheckpointReader
from ..safeio.safetensors_header import HeaderError, SafetensorsHeader
from .findings import MAX_FINDINGS_PER_CODE, PreflightReport
from .view import CheckpointView

__all__ = []


class _ShardProblem(Exception):
    """Why one shard's header could not be read: becomes one finding, the shard is skipped."""

    def __init__(self, check: str, reason: str, message: str, key: str | None = None) -> None:
        super().__init__(message)
        self.check, self.reason, self.message, self.key = check, reason, message, key


def _read_shard_header(reader: CheckpointReader, shard: str) -> SafetensorsHeader:
    try:
        target = reader.link_outside(shard)
        if target is not None:
            raise _ShardProblem("filesystem", "link_outside", f"{shard} is a link to {target}, outside the checkpoint directory: copy the file in instead")
        return reader.header(shard)
    except FileNotFoundError:
        raise _ShardProblem("ownership", "missing_shard", f"the index lists shard {shard}, which does not exist") from None
    except HeaderError as exc:
        raise _ShardProblem("header", exc.code, f"{shard}: {exc}", exc.key) from None
    except NotRegularFileError as exc:
        raise _ShardProblem("filesystem", "not_a_file", f"{exc}: a shard must be a plain file (refused before it was opened for reading)") from None
    except OSError as exc:
        raise _ShardProblem("filesystem", "unreadable", f"cannot read {shard}: {exc.strerror or exc}") from None


def _header_or_problem(reader: CheckpointReader, shard: str) -> SafetensorsHeader | _ShardProblem:
    try:
        return _read_shard_header(reader, shard)
    except _ShardProblem as problem:
        return problem


def _read_headers(view: CheckpointView, report: PreflightReport) -> None:
    listed = set(view.weight_map.values())
    try:
        present = listed & set(view.reader.listing())
    except OSError:
        present = listed
    for shard in sorted(listed - present):  # one listing, not a stat per missing name
        view.broken_shards.add(shard)
        report.add("ownership", "missing_shard", f"the index lists shard {shard}, which does not exist", file=shard)
    shards = sorted(present)
    # a remote reader asks for every header at once; a local one reads them in turn
    results = view.reader.map(functools.partial(_header_or_problem, view.reader), shards)
    for shard, header in zip(shards, results, strict=True):
        if isinstance(header, _ShardProblem):
            problem = header
            view.broken_shards.add(shard)
            report.add(problem.check, problem.reason, problem.message, file=shard, key=problem.key)
            continue
        report.bytes_read += header.bytes_read
        view.headers[shard] = header
        if view.locations.keys().isdisjoint(header.tensors):  # the common case, at C speed
            view.locations.update(zip(header.tensors, map(list, itertools.repeat((shard,))), strict=False))
            continue
        for key in header.tensors:
            view.locations.setdefault(key, []).append(shard)


def _first_members(members: set[str], *orders: Mapping[str, Any]) -> list[str]:
    """The members to report one by one: all of them sorted, or beyond the per-code cap the
    first ``MAX_FINDINGS_PER_CODE`` in the files' order (no sort of millions of names)."""
    if len(members) <= MAX_FINDINGS_PER_CODE:
        return sorted(members)
    candidates = (key for order in orders for key in order if key in members)
    return sorted(set(itertools.islice(candidates, 2 * MAX_FINDINGS_PER_CODE)))[:MAX_FINDINGS_PER_CODE]


def _check_ownership(view: CheckpointView, report: PreflightReport) -> None:
    # keys no shard holds are found with set operations: an index may list millions
    nowhere = view.weight_map.keys() - view.locations.keys()
    if view.broken_shards:  # keys of an unreadable shard: that shard's finding says it
        nowhere = {key for key in nowhere if view.weight_map[key] not in view.broken_shards}
    shown = _first_members(nowhere, view.weight_map)
    for key in shown:
        report.add("ownership", "key_not_in_shard", f"the index assigns {key} to {view.weight_map[key]}, but no shard holds it", file=view.weight_map[key], key=key)
    report.add_omitted("ownership", "key_not_in_shard", len(nowhere) - len(shown))
    # a key held by a shard the index does not assign it to: per shard, its keys' shards in the
    # index (one C-speed map); only a shard where they are not all this shard is looked into
    misplaced: set[str] = set()
    unlisting: list[tuple[str, SafetensorsHeader]] = []  # the shards holding a key the index does not list
    for shard, header in view.headers.items():
        assigned = list(map(view.weight_map.get, header.tensors))  # per key, its shard in the index
        if assigned.count(shard) == len(assigned):
            continue  # the common case: every key listed, and listed in this shard
        misplaced.update(itertools.compress(header.tensors, map(operator.ne, assigned, itertools.repeat(shard))))
        if None in assigned:
            unlisting.append((shard, header))
    for key in sorted(misplaced & view.weight_map.keys()):
        shard = view.weight_map[key]
        if shard in view.broken_shards or key in view.headers[shard].tensors:
            continue  # the assigned shard holds it too: a collision, reported as such
        elsewhere = view.locations[key]
        report.add("ownership", "key_in_other_shard", f"the index assigns {key} to {shard}, but it is only in {', '.join(elsewhere)}: fix the weight_map or move the tensor", file=shard, key=key)
    for shard, header in unlisting:
        unlisted = {key for key in header.tensors if key not in view.weight_map}
        shown = _first_members(unlisted, header.tensors)  # a header may hold a million phantom names
        for key in shown:
            report.add("ownership", "unlisted_key", f"{shard} holds {key}, which the index does not list", file=shard, key=key)
        report.add_omitted("ownership", "unlisted_key", len(unlisted) - len(shown))


def _check_collisions(view: CheckpointView, report: PreflightReport) -> None:
    if max(map(len, view.locations.values()), default=0) < 2:
        return
    for key, shards in view.locations.items():
        if len(shards) > 1:
            report.add("collision", "duplicate_tensor", f"{key} is in {len(shards)} shard headers ({', '.join(shards)}); exactly one may hold it", file=shards[1], key=key)
