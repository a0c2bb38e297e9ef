"""The ``namespace``, ``dtype_shape`` and ``sidecar`` checks: exactly the tensors the profile names,
each with its dtype and shape, expert scales beside their weights.
"""

from __future__ import annotations

import itertools
import operator

from .. import format as fmt
from .. import other_formats
from .findings import PreflightReport
from .foreign import _foreign_advice
from .shards import _first_members
from .view import CheckpointView

__all__ = []


def _present_keys(view: CheckpointView) -> set[str]:
    return view.weight_map.keys() | view.locations.keys()


def _check_namespace(view: CheckpointView, report: PreflightReport) -> None:
    expected = view.expected()
    if expected is None:
        others = _present_keys(view)
    else:
        others = (view.weight_map.keys() - expected.keys()) | (view.locations.keys() - expected.keys())
    # names with a hint (derived, HF, legacy, stray scale) are found in one C-speed scan;
    # the rest are plain unexpected keys, reported up to the cap and counted exactly
    special = other_formats.hinted_names(others)
    for key in sorted(special):
        where = view.weight_map.get(key) or (view.locations.get(key) or [None])[0]
        reason = other_formats.derived_reason(key)
        foreign = other_formats.foreign_name(key)
        if reason:
            report.add("namespace", "derived_key", f"{key} is {reason} at load time and must not be stored: remove it", file=where, key=key)
        elif foreign:
            hint = (_foreign_advice(view) if foreign[0] == "hf_name" else None) or foreign[1]
            report.add("namespace", foreign[0], f"{key} is not a normalized name; {hint}", file=where, key=key)
        elif other_formats.is_stray_scale(key):
            report.add("sidecar", "stray_scale", f"{key} is a scale the format does not have (only the expert .scale sidecars exist): remove it", file=where, key=key)
        elif expected is not None:
            report.add("namespace", "unexpected_key", f"{key} is not part of the format: remove it", file=where, key=key)
    if expected is not None:
        plain = others - special
        shown = _first_members(plain, view.weight_map, view.locations)
        for key in shown:
            where = view.weight_map.get(key) or (view.locations.get(key) or [None])[0]
            report.add("namespace", "unexpected_key", f"{key} is not part of the format: remove it", file=where, key=key)
        report.add_omitted("namespace", "unexpected_key", len(plain) - len(shown))
    if expected is None or not expected.keys() - view.weight_map.keys() - view.locations.keys():
        return
    for key, spec in expected.items():
        if key in view.weight_map or key in view.locations:
            continue
        report.add("namespace", "missing_key", f"{key} ({spec.dtype}{list(spec.shape)}) is missing from the index and every shard", key=key)


_DTYPE, _BEGIN, _END = operator.itemgetter(1), operator.itemgetter(3), operator.itemgetter(4)  # of a TensorInfo


_DTYPE_SHAPE = operator.itemgetter(1, 2)  # (dtype, shape) of a TensorInfo


_SPEC_DTYPE_SHAPE = operator.attrgetter("dtype", "shape")  # (dtype, shape) of a TensorSpec


_EXPERT_SCALE_SUFFIXES = (f"{fmt.GATE_UP}.scale", f"{fmt.DOWN}.scale")  # fmt.is_expert_scale, at C speed


def _unique_locations(view: CheckpointView) -> bool:
    """Whether no tensor is in more than one shard header (then ``view.tensor(key)`` is its one place)."""
    return max(map(len, view.locations.values()), default=0) < 2


def _check_dtype_shape(view: CheckpointView, report: PreflightReport) -> None:
    expected = view.expected()
    if expected is None:
        return
    if _unique_locations(view):
        # the common case at C speed: every present key's (dtype, shape) as the format says
        found_types: dict[str, tuple[str, tuple[int, ...]]] = {}
        for header in view.headers.values():
            found_types.update(zip(header.tensors, map(_DTYPE_SHAPE, header.tensors.values()), strict=True))
        wanted = list(map(_SPEC_DTYPE_SHAPE, expected.values()))
        if list(map(found_types.get, expected, wanted)) == wanted:  # a missing key counts as wanted
            return
    for key, spec in expected.items():
        found = view.tensor(key)
        if found is None:
            continue
        shard, info = found
        if info.dtype != spec.dtype:
            report.add("dtype_shape", "wrong_dtype", f"{key} is {info.dtype}, the format requires {spec.dtype}", file=shard, key=key)
        if info.shape != spec.shape:
            report.add("dtype_shape", "wrong_shape", f"{key} has shape {list(info.shape)}, the format requires {list(spec.shape)}", file=shard, key=key)


def _sidecars_paired(view: CheckpointView) -> bool:
    """Whether no sidecar finding can arise, decided per shard at C speed (the common case):
    no tensor in two shards, every FP8 ``.weight`` has its scale in its own shard, and every
    expert scale has an FP8 weight in its own shard."""
    if not _unique_locations(view):
        return False
    for header in view.headers.values():
        keys = header.tensors
        fp8 = set(itertools.compress(keys, map(str.startswith, map(_DTYPE, keys.values()), itertools.repeat("F8_"))))
        weights = [key for key in fp8 if key.endswith(".weight")]
        scales = itertools.compress(keys, map(str.endswith, keys, itertools.repeat(_EXPERT_SCALE_SUFFIXES)))
        if not keys.keys() >= set(map(fmt.scale_key_for, weights)) or not fp8 >= set(map(fmt.weight_key_for, scales)):
            return False
    return True


def _check_sidecars(view: CheckpointView, report: PreflightReport) -> None:
    if _sidecars_paired(view):
        return
    # only FP8 tensors and expert scales have sidecar rules: select them cheaply, then sort
    candidates = {key for header in view.headers.values() for key, info in header.tensors.items()
                  if info.dtype.startswith("F8_") or fmt.is_expert_scale(key)}
    for key in sorted(candidates):
        shard, info = view.tensor(key)  # type: ignore[misc]
        if info.dtype.startswith("F8_") and key.endswith(".weight"):
            scale = fmt.scale_key_for(key)
            scale_at = view.tensor(scale) if scale else None
            if scale_at is None:
                report.add("sidecar", "missing_scale", f"FP8 weight {key} has no {scale} tensor", file=shard, key=key)
            elif scale_at[0] != shard:
                report.add("sidecar", "split_shard", f"{scale} is in {scale_at[0]} but its weight {key} is in {shard}: a weight and its scale must share a shard", file=scale_at[0], key=scale)
        elif fmt.is_expert_scale(key):
            weight = fmt.weight_key_for(key)
            weight_at = view.tensor(weight) if weight else None
            if weight_at is None or not weight_at[1].dtype.startswith("F8_"):
                report.add("sidecar", "orphan_scale", f"{key} has no FP8 weight {weight} beside it", file=shard, key=key)
