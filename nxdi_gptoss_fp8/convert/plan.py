"""Plan a conversion before a byte moves: what is read, what is written and where, whether it
fits, and the expected peak memory.

``convert --dry-run`` prints the plan; every real run makes the same plan first and refuses at
once, with its numbers, when the free space (of OUT's filesystem, and of the Hub cache for the
shards still to download) or the machine's memory is short. The written side comes from the
writer's own shard plan and headers (``CheckpointWriter.planned_files``): every file the output
will hold, exact except the index and the model card, which carry figures known only at the end
and are counted at a bound. The free space is compared with what those files occupy on disk
(``output_target.space_needed``: whole blocks, plus two for the directories), the same figure a
real run checks. Whether OUT can be written at all is decided before planning, by the same
check as a real run (``output_target.check_writable``).
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from typing import Any

from .. import format as fmt
from ..errors import ConversionError
from ..output_target.space import free_bytes, space_needed
from ..padding import TARGETS
from ..units import format_bytes, plural
from ..writer import CheckpointWriter
from .fp8 import BLOCK_VALUES
from .output import CHUNK_BYTES, Workspace

__all__ = [
    "BASE_PROCESS_BYTES", "ConversionPlan", "PlannedFile", "SpaceCheck", "local_reads", "peak_memory",
    "plan_conversion",
]

# what a Python process with torch and safetensors imported holds before any tensor (measured
# with scripts/bench_convert.py: RSS at the start of convert() on CPU torch 2.x)
BASE_PROCESS_BYTES = 320_000_000


@dataclass
class PlannedFile:
    """One file read or written: its name, size (None: unknown), for a Hub source whether the
    local cache already holds it (None: a local file) and, for a written file, whether the size
    is exact (False: an upper bound, for files holding figures known only at the end)."""

    name: str
    bytes: int | None
    cached: bool | None = None
    exact: bool = True


@dataclass
class SpaceCheck:
    """Free space of one filesystem against what the run puts on it."""

    path: str
    needed: int
    free: int
    what: str

    @property
    def short(self) -> bool:
        return self.needed > self.free


@dataclass
class ConversionPlan:
    """Everything a conversion will read and write, where, and whether it fits."""

    source: str
    source_format: str | None
    out: str
    written_in: str  # the directory the work folder is made in (OUT itself when it exists)
    replaces: list[str]
    profile: str
    layers: int
    padded_hidden_size: int
    padded_intermediate_size: int
    reads: list[PlannedFile]
    shards: list[PlannedFile]
    files: list[PlannedFile]  # the other files written: config, index, card, companion files
    peak_memory: int
    memory_total: int | None
    space: list[SpaceCheck] = field(default_factory=list)
    download_dir: str | None = None
    target: str | None = None  # the named conversion target (format.TARGETS), if any

    @property
    def read_bytes(self) -> int:
        return sum(f.bytes or 0 for f in self.reads)

    @property
    def download_bytes(self) -> int | None:
        """Bytes still to fetch from the Hub (0 for a local source; None when a size is unknown)."""
        pending = [f for f in self.reads if f.cached is False]
        if any(f.bytes is None for f in pending):
            return None
        return sum(f.bytes or 0 for f in pending)

    @property
    def write_bytes(self) -> int:
        """Bytes of every file written (the sum of ``shards`` and ``files``; at most this)."""
        return sum(f.bytes or 0 for f in (*self.shards, *self.files))

    @property
    def problems(self) -> list[str]:
        found = [f"{check.what} needs {format_bytes(check.needed)} ({plural(check.needed, 'byte')}) on the filesystem "
                 f"holding {check.path}, which has {format_bytes(check.free)} free" for check in self.space if check.short]
        if self.memory_total is not None and self.peak_memory > self.memory_total:
            found.append(f"expected peak memory {format_bytes(self.peak_memory)} exceeds this machine's "
                         f"{format_bytes(self.memory_total)}")
        return found

    @property
    def ok(self) -> bool:
        return not self.problems

    def check(self) -> None:
        """Raise ``ConversionError`` (one line, with the numbers) when the run cannot finish."""
        if self.problems:
            raise ConversionError(f"cannot convert into {self.out}: " + "; ".join(self.problems)
                                  + ": free some space, choose another OUT, or use smaller padded sizes")

    def to_dict(self) -> dict[str, Any]:
        document = asdict(self)
        document.update(read_bytes=self.read_bytes, download_bytes=self.download_bytes,
                        write_bytes=self.write_bytes, ok=self.ok, problems=self.problems)
        for check in document["space"]:
            check["short"] = check["needed"] > check["free"]
        return document

    def render_text(self) -> str:
        download = self.download_bytes
        lines = [f"plan: convert {self.source} ({self.source_format or 'format known after the download'}) → {self.out}",
                 f"  profile {self.profile}, {plural(self.layers, 'layer')}, H'={self.padded_hidden_size}, "
                 f"I'={self.padded_intermediate_size}",
                 *_target_lines(self.target),
                 f"  read: {plural(len(self.reads), 'file')}, {format_bytes(self.read_bytes)}"
                 + ("" if all(f.cached is None for f in self.reads) else
                    f"; to download: {'unknown' if download is None else format_bytes(download)}"
                    + (f" into {self.download_dir}" if self.download_dir else ""))]
        for f in self.reads:
            state = "" if f.cached is None else " (in the cache)" if f.cached else " (to download)"
            lines.append(f"    {f.name}: {'size unknown' if f.bytes is None else format_bytes(f.bytes)}{state}")
        written = [*self.shards, *self.files]
        bound = "" if all(f.exact for f in written) else "at most "
        lines.append(f"  write: {plural(len(written), 'file')} ({plural(len(self.shards), 'shard')}), {bound}"
                     f"{format_bytes(self.write_bytes)} ({plural(self.write_bytes, 'byte')}) in all, in {self.written_in}"
                     + (f" (replacing {plural(len(self.replaces), 'entry', 'entries')} of an earlier output)" if self.replaces else ""))
        lines += [f"    {f.name}: {'' if f.exact else 'at most '}{format_bytes(f.bytes or 0)}" for f in written]
        for check in self.space:
            lines.append(f"  free space: {format_bytes(check.free)} ({plural(check.free, 'byte')}) on the filesystem holding "
                         f"{check.path}; {check.what} needs {format_bytes(check.needed)} ({plural(check.needed, 'byte')}) "
                         f"on disk{' — SHORT' if check.short else ''}")
        memory = f" of {format_bytes(self.memory_total)}" if self.memory_total else ""
        lines.append(f"  expected peak memory: {format_bytes(self.peak_memory)}{memory} (an upper estimate)")
        lines.append("  OK: the conversion fits" if self.ok else "  REFUSED: " + "; ".join(self.problems))
        return "\n".join(lines)


def _target_lines(target: str | None) -> list[str]:
    """What a named target is for and who loads it, for the plan's text."""
    known = TARGETS.get(target) if target else None
    if known is None:
        return []
    return [f"  target {known.name}: {known.purpose}", f"    {known.status}"]


def peak_memory(kind: str, layout: fmt.Layout) -> int:
    """The expected peak resident memory of a conversion: the process itself, each compute
    lane's reused output buffers (one per expert shape) and tools, the experts in flight and
    the source window mapped between releases, the scale rows, and the non-expert copy chunks."""
    d, hp, ip = layout.dims, layout.padded_hidden_size, layout.padded_intermediate_size
    h, i, lanes = d.hidden_size, d.intermediate_size, Workspace.LANES
    buffers = lanes * (hp * 2 * ip + ip * hp)
    if kind == "hf-mxfp4":
        groups = (h + i) // 32
        tools = lanes * 9 * 1024 * 16 * groups  # mxfp4.ExpertEncoder's buffers, per lane and block count
        in_flight = (lanes + 1) * (2 * i * h + h * i) // 2  # packed FP4 bytes of the experts being encoded
    elif kind == "hf-bf16":  # fp8.DenseEncoder's row-block buffers per lane, the BF16 experts being encoded
        tools = lanes * 18 * BLOCK_VALUES
        in_flight = (lanes + 1) * 2 * (2 * i * h + h * i)
    else:  # compressed-tensors: each expert's FP8 weights read whole, plus a halving block per lane
        tools = lanes * 2 * (1 << 18)
        in_flight = (lanes + 1) * 3 * h * i
    scales = 4 * d.num_local_experts * (2 * ip + hp)
    copy = 3 * CHUNK_BYTES
    return BASE_PROCESS_BYTES + buffers + tools + in_flight + 2 * CHUNK_BYTES + scales + copy


def _memory_total() -> int | None:
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):
        return None


def _device(path: str) -> int | None:
    try:
        return os.stat(path).st_dev
    except OSError:
        return None


def plan_conversion(*, source: str, source_format: str | None, writer: CheckpointWriter,
                    reads: list[PlannedFile], download_dir: str | None = None) -> ConversionPlan:
    """The plan of a conversion whose output ``writer`` has planned (not yet entered) and whose
    source files are ``reads`` (``cached`` False for those still to download into
    ``download_dir``). Free space is checked per filesystem: the output and the download are
    added up when they share one."""
    layout = writer.layout
    planned = writer.planned_files()
    shards = [PlannedFile(name, size) for name, size in planned.items() if name in writer.shard_sizes]
    bounded = {fmt.INDEX_FILE, *writer.reserved}
    files = [PlannedFile(name, planned[name], exact=name not in bounded)
             for name in sorted(planned) if name not in writer.shard_sizes]
    where = writer.target.existing_ancestor()
    needs: dict[Any, SpaceCheck] = {}
    needs[_device(where) or where] = SpaceCheck(where, space_needed(planned.values(), where), free_bytes(where),
                                                f"the output ({plural(len(planned), 'file')})")
    pending_files = [f.bytes or 0 for f in reads if f.cached is False]
    pending = space_needed(pending_files, download_dir) if pending_files and download_dir is not None else 0
    if pending and download_dir is not None:
        key = _device(download_dir) or download_dir
        if key in needs:
            needs[key].needed += pending
            needs[key].what += " and the download"
        else:
            needs[key] = SpaceCheck(download_dir, pending, free_bytes(download_dir), "the download")
    return ConversionPlan(
        source=source, source_format=source_format, out=writer.out, written_in=writer.target.work_parent,
        replaces=list(writer.target.replaced), profile=writer.profile, layers=layout.dims.num_hidden_layers,
        padded_hidden_size=layout.padded_hidden_size, padded_intermediate_size=layout.padded_intermediate_size,
        reads=reads, shards=shards, files=files,
        peak_memory=peak_memory(source_format or "hf-mxfp4", layout), memory_total=_memory_total(),
        space=list(needs.values()), download_dir=download_dir, target=writer.conversion_target,
    )


def local_reads(root: str, tensors: Mapping[str, tuple[str, Any]], extra_files: Mapping[str, str]) -> list[PlannedFile]:
    """The files a local conversion reads: config, index (if any), every shard, the companions."""
    names = [fmt.CONFIG_FILE]
    if os.path.isfile(os.path.join(root, fmt.INDEX_FILE)):
        names.append(fmt.INDEX_FILE)
    names += sorted({os.path.basename(path) for path, _info in tensors.values()})
    names += sorted(os.path.basename(path) for path in extra_files.values())
    files = []
    for name in names:
        try:
            size: int | None = os.stat(os.path.join(root, name)).st_size
        except OSError:
            size = None
        files.append(PlannedFile(name, size))
    return files
