"""``inspect``: a readable summary of a checkpoint (shards, tensors, bytes by dtype, profile,
padding) built from the same preflight run that ``validate`` uses. Stdlib only."""

from __future__ import annotations

import os
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from .checks import CheckpointView, preflight
from .findings import PreflightReport


@dataclass
class ShardSummary:
    name: str
    file_size: int
    tensors: int
    tensor_bytes: int


@dataclass
class CheckpointSummary:
    report: PreflightReport
    shards: list[ShardSummary] = field(default_factory=list)
    bytes_by_dtype: dict[str, int] = field(default_factory=dict)
    tensors_by_dtype: dict[str, int] = field(default_factory=dict)
    dims: dict[str, int] | None = None
    padding: dict[str, list[int]] | None = None

    def to_dict(self) -> dict[str, Any]:
        return {
            "path": self.report.path,
            "ok": self.report.ok,
            "profile": self.report.profile,
            "dims": self.dims,
            "padding": self.padding,
            "shards": [vars(s) for s in self.shards],
            "tensors_by_dtype": self.tensors_by_dtype,
            "bytes_by_dtype": self.bytes_by_dtype,
            "total_tensor_bytes": sum(self.bytes_by_dtype.values()),
            "summary": self.report.summary(),
        }

    def render_text(self) -> str:
        lines = [f"checkpoint  {self.report.path}", f"profile     {self.report.profile or 'unknown'}"]
        if self.dims:
            lines.append("dims        " + ", ".join(f"{k}={v}" for k, v in self.dims.items()))
        if self.padding:
            lines.append("padding     " + ", ".join(
                f"{name} {base} -> {padded}" + ("" if base == padded else f" (+{padded - base})")
                for name, (base, padded) in self.padding.items()))
        total_file = sum(s.file_size for s in self.shards)
        lines.append(f"shards      {len(self.shards)} files, {_human(total_file)} on disk")
        for shard in self.shards:
            lines.append(f"  {shard.name:<40} {shard.tensors:>6} tensors {_human(shard.tensor_bytes):>11}")
        lines.append(f"tensors     {sum(self.tensors_by_dtype.values())}")
        for dtype, size in sorted(self.bytes_by_dtype.items(), key=lambda item: -item[1]):
            lines.append(f"  {dtype:<8} {self.tensors_by_dtype[dtype]:>6} tensors {_human(size):>11}")
        errors = len(self.report.errors)
        lines.append(f"verdict     {'VALID' if self.report.ok else f'INVALID ({errors} errors: run validate for the list)'}")
        return "\n".join(lines)


def _human(size: int) -> str:
    value = float(size)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if value < 1024 or unit == "TiB":
            return f"{value:.1f} {unit}" if unit != "B" else f"{size} B"
        value /= 1024
    return f"{size} B"


def inspect_checkpoint(path: str | os.PathLike[str], *, allow_custom_model: bool = True) -> CheckpointSummary:
    """Summarize ``path`` from one preflight run; works on invalid checkpoints too."""
    report = preflight(path, allow_custom_model=allow_custom_model)
    view: CheckpointView = report.view
    summary = CheckpointSummary(report=report)
    by_bytes: Counter[str] = Counter()
    by_count: Counter[str] = Counter()
    for name, header in sorted(view.headers.items()):
        tensor_bytes = sum(info.nbytes for info in header.tensors.values())
        summary.shards.append(ShardSummary(name, header.identity.size, len(header.tensors), tensor_bytes))
        for info in header.tensors.values():
            by_bytes[info.dtype] += info.nbytes
            by_count[info.dtype] += 1
    summary.bytes_by_dtype, summary.tensors_by_dtype = dict(by_bytes), dict(by_count)
    if view.dims is not None:
        summary.dims = view.dims.as_dict()
    if view.layout is not None:
        summary.padding = {
            "hidden": [view.dims.hidden_size, view.layout.padded_hidden_size],  # type: ignore[union-attr]
            "intermediate": [view.dims.intermediate_size, view.layout.padded_intermediate_size],  # type: ignore[union-attr]
        }
    return summary
