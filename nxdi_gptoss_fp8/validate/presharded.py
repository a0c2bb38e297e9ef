"""The manifest of NxDI's pre-sharded weights: what the hook wrote, checked before NxDI reads it.

With ``save_sharded_checkpoint=True`` NxDI writes ``COMPILED/weights/tp{rank}_sharded_checkpoint.safetensors``
at compile time and every later load hands those files to the device with a bare safetensors
``load_file``; the checkpoint loader (and so the preflight) never runs again. This module binds
those files to the compile that wrote them and to the checkpoint they came from:

* ``write_manifest`` (after NxDI's ``shard_weights``, in normalized mode) records, atomically and
  last, every rank file's size, header SHA-256, a sample digest and whole-file SHA-256 (hashed in
  parallel), the NeuronConfig settings that change what the shards hold, and the source
  checkpoint's path and fingerprint (``source_fingerprint``);
* ``check_presharded`` (before NxDI's ``load_weights``, and ``validate COMPILED``) refuses, as
  findings of the ``presharded`` check, a missing or foreign manifest, a missing, truncated,
  extra or replaced rank file, a changed header, different settings and a re-converted source.

The default check reads each rank's header and ``blocks`` sampled data blocks of ``block_size``
bytes (offsets fixed by the file size): every rank's header looks alike, the sampled data do not,
so a rank file replaced by another rank's file of the same size and header is caught. The writer
checks that the samples tell apart every two ranks whose bytes differ, doubling the blocks until
they do. Whole-file hashing at load runs only when asked for. Stdlib only.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import os
import re
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import Any

from .. import format as fmt
from .._version import __version__
from ..errors import IntegrityError, NotRegularFileError, ShardedWeightsError
from ..nxdi_config import config_attr, neuron_config_view
from ..progress import Progress
from ..safeio.files import FileIdentity, open_regular
from ..safeio.hashing import hash_files
from ..safeio.safetensors_header import MAX_HEADER_SIZE, PREFIX_SIZE, HeaderError, parse_header_bytes
from ..safeio.strict_json import JsonError, parse_json_strict
from ..units import format_bytes, format_duration, plural
from .findings import PreflightReport, Severity, printable
from .integrity import DIGESTS_KEY

logger = logging.getLogger(__name__)

WEIGHTS_DIR = "weights"
MANIFEST_FILE = "nxdi_gptoss_fp8_manifest.json"
MANIFEST_FORMAT = "nxdi_gptoss_fp8_sharded_weights"
MANIFEST_VERSION = 1
MAX_MANIFEST_BYTES = 16 * 1024 * 1024
MAX_RANKS = 1 << 16
SAMPLE_BLOCK = 4096
SAMPLE_BLOCKS = 8
MAX_SAMPLE_BLOCKS = 1024
RANK_FILE = re.compile(r"^tp(\d+)_sharded_checkpoint\.safetensors$")
_HEX64 = re.compile(r"^[0-9a-f]{64}$")
CHECK = "presharded"

# The NeuronConfig settings that change what the rank files hold (sharding, padding, quantization,
# fusion, dtypes): a load with any other value would read shards written for another model.
SHARD_SETTINGS = (
    "tp_degree", "world_size", "pp_degree", "ep_degree", "moe_tp_degree", "moe_ep_degree",
    "padded_hidden_size", "padded_intermediate_size", "quantized", "quantization_type",
    "quantization_dtype", "quantization_block_size", "quantization_block_axis",
    "quantization_scale_dtype", "modules_to_not_convert", "fused_qkv", "vocab_parallel",
    "attention_dp_degree", "cp_degree", "lm_head_pad", "lm_head_pad_alignment_size",
    "logical_nc_config", "torch_dtype", "cast_type", "is_mxfp4_compute", "hybrid_sharding_config",
)


def rank_file(rank: int) -> str:
    """NxDI's name of one rank's pre-sharded weights."""
    return f"tp{rank}_sharded_checkpoint.safetensors"


def manifest_path(compiled_dir: str) -> str:
    return os.path.join(compiled_dir, WEIGHTS_DIR, MANIFEST_FILE)


def _fix_reshard(compiled_dir: str) -> str:
    return (f"write the shards again through the hook: with CHECKPOINT_FORMAT=normalized_fp8 and "
            f"nxdi_gptoss_fp8.register(), call NxDI's shard_weights({compiled_dir!r}) on the model built "
            "from the current checkpoint (no recompile needed)")


# --------------------------------------------------------------------------- settings and source


def _jsonable(value: Any, depth: int = 0) -> Any:
    """A JSON value for a setting: torch dtypes by name, tuples as lists, objects as their attributes."""
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    if depth > 8:
        return str(value)
    if isinstance(value, (list, tuple)):
        return [_jsonable(item, depth + 1) for item in value]
    if isinstance(value, Mapping):
        return {str(key): _jsonable(item, depth + 1) for key, item in sorted(value.items(), key=lambda kv: str(kv[0]))}
    if type(value).__module__ == "torch" and type(value).__name__ == "dtype":
        return str(value).removeprefix("torch.")
    if hasattr(value, "__dict__") and not isinstance(value, type):
        return _jsonable(vars(value), depth + 1)
    return str(value)


def shard_settings(config: Any) -> dict[str, Any]:
    """The shard-relevant settings of an NxDI config object or its JSON (flat or nested)."""
    nc = neuron_config_view(config)
    return {name: _jsonable(config_attr(nc, name)) for name in SHARD_SETTINGS}


def _read_bounded(path: str, limit: int) -> bytes:
    with open_regular(path) as handle:
        raw = handle.read(limit + 1)
    if len(raw) > limit:
        raise IntegrityError(f"{path} is larger than {limit:,} bytes: not read")
    return raw


def source_fingerprint(checkpoint_dir: str) -> dict[str, Any]:
    """SHA-256 of a checkpoint's index and ``config.json``, and the index's ``shard_sha256`` map
    (None when it records none). ``OSError`` / ``IntegrityError`` when they cannot be read."""
    index_raw = _read_bounded(os.path.join(checkpoint_dir, fmt.INDEX_FILE), MAX_MANIFEST_BYTES * 4)
    config_raw = _read_bounded(os.path.join(checkpoint_dir, fmt.CONFIG_FILE), MAX_MANIFEST_BYTES)
    digests = None
    try:
        index = parse_json_strict(index_raw.decode("utf-8"), what=fmt.INDEX_FILE)
        metadata = index.get("metadata") if isinstance(index, dict) else None
        recorded = metadata.get(DIGESTS_KEY) if isinstance(metadata, dict) else None
        if isinstance(recorded, dict):
            digests = {str(k): v for k, v in sorted(recorded.items()) if isinstance(v, str)}
    except (UnicodeDecodeError, JsonError):
        pass  # the index digest still binds the bytes; the preflight reports the index itself
    return {
        "index_sha256": hashlib.sha256(index_raw).hexdigest(),
        "config_sha256": hashlib.sha256(config_raw).hexdigest(),
        "shard_sha256": digests,
    }


# --------------------------------------------------------------------------- the manifest


@dataclass(frozen=True)
class RankEntry:
    """One rank file as written: size, header digest, sample digest, whole-file digest."""

    rank: int
    file: str
    size: int
    header_sha256: str
    sample_sha256: str
    sha256: str


@dataclass(frozen=True)
class Source:
    """The checkpoint a set of shards was loaded from (two under fused speculation)."""

    path: str
    fingerprint: Mapping[str, Any]


@dataclass(frozen=True)
class Manifest:
    """What ``write_manifest`` recorded about one set of rank files."""

    tp_degree: int
    world_size: int
    ranks: Mapping[int, RankEntry]
    settings: Mapping[str, Any]
    sources: Sequence[Source]
    sample_blocks: int = SAMPLE_BLOCKS
    sample_block_size: int = SAMPLE_BLOCK
    package_version: str = __version__
    written_at: str = ""

    def to_dict(self) -> dict[str, Any]:
        return {
            "format": MANIFEST_FORMAT,
            "format_version": MANIFEST_VERSION,
            "checkpoint_format": fmt.FORMAT_NAME,
            "checkpoint_format_version": fmt.FORMAT_VERSION,
            "package_version": self.package_version,
            "written_at": self.written_at,
            "tp_degree": self.tp_degree,
            "world_size": self.world_size,
            "settings": dict(self.settings),
            "sources": [{"path": s.path, "fingerprint": dict(s.fingerprint)} for s in self.sources],
            "sample": {"blocks": self.sample_blocks, "block_size": self.sample_block_size},
            "ranks": [vars(self.ranks[rank]) for rank in sorted(self.ranks)],
        }

    @classmethod
    def from_dict(cls, data: Any) -> Manifest:
        """Validate a parsed manifest; ``ValueError`` naming the first field that is wrong."""
        if not isinstance(data, dict):
            raise ValueError("is not a JSON object")
        if data.get("format") != MANIFEST_FORMAT:
            raise ValueError(f"format is {printable(repr(data.get('format')))[:80]}, not {MANIFEST_FORMAT!r}")
        if data.get("format_version") != MANIFEST_VERSION:
            raise ValueError(f"format_version {printable(repr(data.get('format_version')))[:40]} is not "
                             f"{MANIFEST_VERSION} (written by another version of nxdi-gptoss-fp8?)")
        tp, world = _count(data, "tp_degree"), _count(data, "world_size")
        settings, sources, sample, ranks = (data.get(k) for k in ("settings", "sources", "sample", "ranks"))
        if not isinstance(settings, dict):
            raise ValueError("settings is not an object")
        if not isinstance(sources, list) or not all(
                isinstance(s, dict) and isinstance(s.get("path"), str) and isinstance(s.get("fingerprint"), dict)
                for s in sources):
            raise ValueError("sources is not a list of {path, fingerprint}")
        if not isinstance(sample, dict):
            raise ValueError("sample is not an object")
        blocks, block_size = _count(sample, "blocks"), _count(sample, "block_size")
        if not isinstance(ranks, list) or len(ranks) > MAX_RANKS:
            raise ValueError("ranks is not a list")
        entries: dict[int, RankEntry] = {}
        for item in ranks:
            entry = _rank_entry(item)
            if entry.rank in entries:
                raise ValueError(f"rank {entry.rank} is listed twice")
            entries[entry.rank] = entry
        return cls(tp, world, entries, settings, [Source(s["path"], s["fingerprint"]) for s in sources],
                   blocks, block_size, str(data.get("package_version", "")), str(data.get("written_at", "")))


def _count(data: Mapping[str, Any], key: str, high: int = fmt.MAX_BYTE_COUNT) -> int:
    value = data.get(key)
    if type(value) is not int or not 0 <= value <= high:
        raise ValueError(f"{key} is not an integer in 0 … {high:,}")
    return value


def _rank_entry(item: Any) -> RankEntry:
    if not isinstance(item, dict) or set(item) != {f for f in RankEntry.__dataclass_fields__}:
        raise ValueError(f"a ranks entry does not have exactly the fields {sorted(RankEntry.__dataclass_fields__)}")
    rank = _count(item, "rank", MAX_RANKS)
    if item["file"] != rank_file(rank):
        raise ValueError(f"rank {rank} names the file {printable(repr(item['file']))[:120]}, not {rank_file(rank)!r}")
    for key in ("header_sha256", "sample_sha256", "sha256"):
        if not isinstance(item[key], str) or not _HEX64.match(item[key]):
            raise ValueError(f"rank {rank}: {key} is not a lowercase hex SHA-256")
    return RankEntry(rank, item["file"], _count(item, "size"), item["header_sha256"], item["sample_sha256"], item["sha256"])


class ManifestError(IntegrityError):
    """The manifest of pre-sharded weights is missing or cannot be read (``code``: why)."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code = code


def read_manifest(compiled_dir: str) -> Manifest:
    """The manifest in ``compiled_dir/weights``: strict JSON, bounded, validated field by field.

    Raises ``ManifestError`` with code ``no_manifest`` or ``bad_manifest``."""
    path = manifest_path(compiled_dir)
    try:
        raw = _read_bounded(path, MAX_MANIFEST_BYTES)
    except FileNotFoundError:
        raise ManifestError("no_manifest", f"{path} does not exist: these pre-sharded weights were written "
                            "without the hook (compiled before nxdi-gptoss-fp8 recorded manifests, or not in "
                            f"normalized mode), so nothing vouches for them; {_fix_reshard(compiled_dir)}") from None
    except (OSError, IntegrityError) as exc:
        raise ManifestError("bad_manifest", f"{path} cannot be read ({getattr(exc, 'strerror', None) or exc}); "
                            f"{_fix_reshard(compiled_dir)}") from None
    try:
        return Manifest.from_dict(parse_json_strict(raw.decode("utf-8"), what=MANIFEST_FILE, max_bytes=MAX_MANIFEST_BYTES))
    except (UnicodeDecodeError, JsonError, ValueError) as exc:
        raise ManifestError("bad_manifest", f"{path}: {exc}; {_fix_reshard(compiled_dir)}") from None


def remove_manifest(compiled_dir: str) -> bool:
    """Delete the manifest before NxDI writes new shards (an interrupted set then has none)."""
    try:
        os.unlink(manifest_path(compiled_dir))
    except FileNotFoundError:
        return False
    return True


# --------------------------------------------------------------------------- reading a rank file


def sample_offsets(size: int, data_offset: int, blocks: int, block_size: int) -> list[tuple[int, int]]:
    """(offset, length) of the sampled data blocks of a file: ``blocks`` evenly spread blocks of
    the data section, or the whole section when it is not larger than the blocks."""
    data = size - data_offset
    if blocks <= 0:
        return []
    if data <= blocks * block_size:
        return [(data_offset, data)] if data > 0 else []
    spots = []
    for i in range(blocks):
        start = data_offset + (2 * i + 1) * data // (2 * blocks) - block_size // 2
        spots.append((min(max(start, data_offset), size - block_size), block_size))
    return spots


@dataclass(frozen=True)
class _RankRead:
    identity: FileIdentity
    header: bytes
    sample_sha256: str


def _read_rank(path: str, blocks: int, block_size: int) -> _RankRead:
    """The identity, header bytes and sample digest of one rank file (``HeaderError`` for a
    length prefix that does not fit; ``OSError`` / ``NotRegularFileError`` when unreadable)."""
    with open_regular(path, buffering=0) as handle:
        fd = handle.fileno()
        identity = FileIdentity.of(os.fstat(fd))
        prefix = os.pread(fd, PREFIX_SIZE, 0)
        if len(prefix) < PREFIX_SIZE:
            raise HeaderError("too_short", f"file is {identity.size} bytes, shorter than the 8-byte length prefix")
        length = int.from_bytes(prefix, "little")
        if length > MAX_HEADER_SIZE or PREFIX_SIZE + length > identity.size:
            raise HeaderError("header_beyond_file", f"header length {length:,} does not fit the {identity.size:,}-byte file")
        header = os.pread(fd, length, PREFIX_SIZE)
        digest = hashlib.sha256()
        for offset, count in sample_offsets(identity.size, PREFIX_SIZE + length, blocks, block_size):
            digest.update(os.pread(fd, count, offset))
    return _RankRead(identity, header, digest.hexdigest())


class _HeaderCache:
    """Parses each distinct header once: every rank's header is usually the same bytes."""

    def __init__(self) -> None:
        self._verdicts: dict[tuple[str, int], HeaderError | None] = {}

    def problem(self, path: str, read: _RankRead) -> HeaderError | None:
        key = (hashlib.sha256(read.header).hexdigest(), read.identity.size)
        if key not in self._verdicts:
            try:
                parse_header_bytes(read.header, path=path, identity=read.identity)
                self._verdicts[key] = None
            except HeaderError as exc:
                self._verdicts[key] = exc
        return self._verdicts[key]


# --------------------------------------------------------------------------- writing


def _workers() -> int:
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:
        return max(1, os.cpu_count() or 1)


def write_manifest(compiled_dir: str, *, ranks: Iterable[int], config: Any, sources: Sequence[Source],
                   workers: int | None = None, progress: bool | None = None) -> Manifest:
    """Hash the rank files NxDI just wrote and record them, atomically, in the manifest.

    Every rank file must exist and pass our header reader; otherwise ``IntegrityError`` and no
    manifest. Whole files are hashed in parallel threads (one per core by default).
    """
    weights = os.path.join(compiled_dir, WEIGHTS_DIR)
    names = {rank: rank_file(rank) for rank in ranks}
    paths = {str(rank): os.path.join(weights, name) for rank, name in names.items()}
    headers: dict[int, str] = {}
    for rank, path in paths.items():
        try:
            read = _read_rank(path, 0, SAMPLE_BLOCK)
            parse_header_bytes(read.header, path=path, identity=read.identity)
            headers[int(rank)] = hashlib.sha256(read.header).hexdigest()
        except (OSError, HeaderError) as exc:
            raise IntegrityError(f"NxDI's shard step left {path} unusable ({getattr(exc, 'strerror', None) or exc}); "
                                 "no manifest was written: shard again") from None
    total = sum(os.stat(path).st_size for path in paths.values())
    with Progress(total, "sha256 pre-sharded weights", show=progress) as shown:
        digests = hash_files(paths, workers=workers or _workers(), progress=shown.update)
    blocks = SAMPLE_BLOCKS
    while True:
        samples = {int(rank): _read_rank(path, blocks, SAMPLE_BLOCK).sample_sha256 for rank, path in paths.items()}
        if _samples_separate(samples, {int(rank): digest for rank, digest in digests.items()}) or blocks >= MAX_SAMPLE_BLOCKS:
            break
        blocks *= 2
    if not _samples_separate(samples, {int(rank): digest for rank, digest in digests.items()}):
        logger.warning("the sampled check cannot tell every two differing rank files in %s apart; only "
                       "whole-file verification (%s=1) can", weights, fmt.VERIFY_AT_LOAD_ENV)
    entries = {rank: RankEntry(rank, names[rank], os.stat(paths[str(rank)]).st_size, headers[rank],
                               samples[rank], digests[str(rank)]) for rank in names}
    nc = neuron_config_view(config)
    manifest = Manifest(
        tp_degree=int(config_attr(nc, "tp_degree", 1)),
        world_size=int(config_attr(nc, "world_size", None) or config_attr(nc, "tp_degree", 1)),
        ranks=entries, settings=shard_settings(config), sources=list(sources), sample_blocks=blocks,
        written_at=datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
    )
    _write_atomically(manifest_path(compiled_dir), json.dumps(manifest.to_dict(), indent=1).encode("utf-8"))
    return manifest


def _samples_separate(samples: Mapping[int, str], digests: Mapping[int, str]) -> bool:
    """Whether ranks whose bytes differ always have different sample digests."""
    by_sample: dict[str, str] = {}
    return all(by_sample.setdefault(sample, digests[rank]) == digests[rank] for rank, sample in samples.items())


def _write_atomically(path: str, data: bytes) -> None:
    directory = os.path.dirname(path)
    temporary = os.path.join(directory, f".{os.path.basename(path)}.tmp-{os.getpid()}")
    try:
        with open(temporary, "wb") as handle:
            handle.write(data)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(temporary, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(temporary)
        raise
    try:
        fd = os.open(directory, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
    except OSError:
        pass  # a file system without directory fsync: the rename itself is atomic


# --------------------------------------------------------------------------- checking


@dataclass
class ShardedCheck:
    """The outcome of checking one set of pre-sharded weights (findings in ``report``)."""

    compiled_dir: str
    report: PreflightReport
    manifest: Manifest | None = None
    ranks: list[int] = field(default_factory=list)
    identities: dict[int, FileIdentity] = field(default_factory=dict)
    bytes_hashed: int = 0
    elapsed_s: float = 0.0

    @property
    def ok(self) -> bool:
        return self.report.clean

    def add(self, reason: str, message: str, *, file: str | None = None, key: str | None = None,
            severity: Severity = Severity.ERROR) -> None:
        self.report.add(CHECK, reason, message, file=file, key=key, severity=severity)

    def to_dict(self) -> dict[str, Any]:
        data = self.report.to_dict()
        data.update({"ok": self.ok, "complete": True, "ranks_checked": self.ranks, "bytes_hashed": self.bytes_hashed,
                     "manifest": manifest_summary(self.manifest) if self.manifest else None})
        return data

    def render_text(self, limit: int | None = None) -> str:
        lines = self.report.render_text(limit=limit).splitlines()[:-1]
        verdict = "VALID" if self.ok else "INVALID"
        hashed = f", {format_bytes(self.bytes_hashed)} hashed" if self.bytes_hashed else ""
        lines.append(printable(f"{verdict}: {self.compiled_dir}: pre-sharded weights, {plural(len(self.ranks), 'rank')} "
                               f"checked, {plural(self.report.error_count, 'error')}, "
                               f"{plural(self.report.warning_count, 'warning')}{hashed}; {format_duration(self.elapsed_s)}"))
        return "\n".join(lines)


def check_presharded(compiled_dir: str, *, ranks: Iterable[int] | None, config: Any, verify: bool = False,
                     workers: int | None = None, progress: bool | None = False,
                     exists: Callable[[str], bool] = os.path.exists) -> ShardedCheck:
    """Check the rank files ``ranks`` (None: every rank of the manifest and of ``world_size``)
    of ``compiled_dir/weights`` against the manifest, ``config``'s shard settings (None: not
    compared) and the source checkpoint when it still exists; hash them whole when ``verify``."""
    started = time.perf_counter()
    check = ShardedCheck(compiled_dir, PreflightReport(path=compiled_dir))
    weights = os.path.join(compiled_dir, WEIGHTS_DIR)
    try:
        manifest = check.manifest = read_manifest(compiled_dir)
    except ManifestError as exc:
        check.add(exc.code, str(exc), file=f"{WEIGHTS_DIR}/{MANIFEST_FILE}")
        check.elapsed_s = time.perf_counter() - started
        return check
    wanted = sorted(set(ranks) if ranks is not None else set(manifest.ranks) | set(range(manifest.world_size)))
    check.ranks = wanted
    if config is not None:
        _check_settings(check, manifest, shard_settings(config))
    cache = _HeaderCache()
    for rank in wanted:
        _check_rank(check, manifest, weights, rank, cache)
    _check_unlisted(check, manifest, weights)
    _check_sources(check, manifest, exists)
    if verify and check.report.clean:
        _verify_digests(check, manifest, weights, workers, progress)
    check.report.shards = len(wanted)
    check.elapsed_s = check.report.elapsed_s = time.perf_counter() - started
    return check


def _check_settings(check: ShardedCheck, manifest: Manifest, current: Mapping[str, Any]) -> None:
    for name in SHARD_SETTINGS:
        if name in manifest.settings and manifest.settings[name] != current.get(name):
            check.add("settings_mismatch",
                      f"{name} is {_shown(current.get(name))} in this NeuronConfig but the shards were written with "
                      f"{_shown(manifest.settings[name])}: these weights belong to another configuration; load with "
                      f"the compiled configuration, or {_fix_reshard(check.compiled_dir)} with this one",
                      file=f"{WEIGHTS_DIR}/{MANIFEST_FILE}", key=f"settings.{name}")


def _shown(value: Any) -> str:
    return printable(json.dumps(value))[:120]


def _check_rank(check: ShardedCheck, manifest: Manifest, weights: str, rank: int, cache: _HeaderCache) -> None:
    name = rank_file(rank)
    where = f"{WEIGHTS_DIR}/{name}"
    path = os.path.join(weights, name)
    entry = manifest.ranks.get(rank)
    if entry is None:
        check.add("rank_not_in_manifest",
                  f"rank {rank} is not among the {plural(len(manifest.ranks), 'rank')} the manifest records "
                  f"(tp_degree {manifest.tp_degree}, world_size {manifest.world_size}): it was not written with this "
                  f"set; {_fix_reshard(check.compiled_dir)}", file=where)
        return
    try:
        read = _read_rank(path, manifest.sample_blocks, manifest.sample_block_size)
    except FileNotFoundError:
        check.add("missing_rank_file", f"{path} does not exist (a partial copy?): copy the whole compiled "
                  f"directory again, or {_fix_reshard(check.compiled_dir)}", file=where)
        return
    except NotRegularFileError as exc:
        check.add("not_a_file", f"{exc}: a rank file must be a regular file", file=where)
        return
    except HeaderError as exc:
        check.add("bad_header", f"{path}: {exc} (truncated or not a safetensors file): copy it again", file=where)
        return
    except OSError as exc:
        check.add("unreadable", f"cannot read {path}: {exc.strerror or exc}", file=where)
        return
    check.identities[rank] = read.identity
    if read.identity.size != entry.size:
        what = "truncated" if read.identity.size < entry.size else "grown"
        check.add("size_mismatch", f"{path} is {read.identity.size:,} bytes, the manifest records {entry.size:,} "
                  f"({what}: a partial or foreign copy): copy it again from the compiled directory", file=where)
        return
    if hashlib.sha256(read.header).hexdigest() != entry.header_sha256:
        problem = cache.problem(path, read)
        detail = f" and our header reader refuses it ({problem})" if problem else ""
        check.add("header_mismatch", f"{path}: its safetensors header differs from the one written{detail}: the file "
                  "was changed or comes from another compile; copy it again from the compiled directory", file=where)
        return
    problem = cache.problem(path, read)
    if problem is not None:
        check.add("bad_header", f"{path}: {problem}", file=where)
        return
    if read.sample_sha256 != entry.sample_sha256:
        other = next((e.rank for e in manifest.ranks.values() if e.sample_sha256 == read.sample_sha256 and e.rank != rank), None)
        why = (f"they match rank {other}'s: this is tp{other}'s file under rank {rank}'s name" if other is not None
               else "the file's data changed since it was written")
        check.add("data_mismatch", f"{path}: same size and header as written, but the sampled data blocks differ "
                  f"({why}); copy it again from the compiled directory, or {_fix_reshard(check.compiled_dir)}", file=where)


def _check_unlisted(check: ShardedCheck, manifest: Manifest, weights: str) -> None:
    try:
        names = os.listdir(weights)
    except OSError as exc:
        check.add("unreadable", f"cannot list {weights}: {exc.strerror or exc}", file=WEIGHTS_DIR)
        return
    for name in sorted(names):
        match = RANK_FILE.match(name)
        if match and int(match.group(1)) not in manifest.ranks:
            check.add("unlisted_rank_file",
                      f"{os.path.join(weights, name)} is not part of the set the manifest records (ranks "
                      f"{_ranges(manifest.ranks)}, tp_degree {manifest.tp_degree}): a file from another compile "
                      "mixed in; remove it, or copy the whole compiled directory again", file=f"{WEIGHTS_DIR}/{name}")


def _ranges(ranks: Iterable[int]) -> str:
    ordered = sorted(ranks)
    if not ordered:
        return "none"
    return f"{ordered[0]}…{ordered[-1]}" if ordered == list(range(ordered[0], ordered[-1] + 1)) else ", ".join(map(str, ordered))


def _check_sources(check: ShardedCheck, manifest: Manifest, exists: Callable[[str], bool]) -> None:
    for source in manifest.sources:
        if not exists(source.path):
            check.add("source_gone", f"the source checkpoint {source.path} is not here (the compiled directory moved to "
                      "another host?): only the manifest vouches for the shards", severity=Severity.INFO)
            logger.info("pre-sharded weights in %s: their source checkpoint %s is not on this host; checked against "
                        "the manifest only", check.compiled_dir, source.path)
            continue
        try:
            current: Mapping[str, Any] = source_fingerprint(source.path)
        except (OSError, IntegrityError) as exc:
            current = {"unreadable": getattr(exc, "strerror", None) or str(exc)}
        changed = [word for key, word in (("index_sha256", fmt.INDEX_FILE), ("config_sha256", fmt.CONFIG_FILE))
                   if current.get(key) != source.fingerprint.get(key)]
        shards = _changed_shards(source.fingerprint.get("shard_sha256"), current.get("shard_sha256"))
        if shards:
            changed.append(f"the digests of {plural(len(shards), 'shard')} ({', '.join(shards[:3])}{', ...' if len(shards) > 3 else ''})")
        elif current.get("shard_sha256") != source.fingerprint.get("shard_sha256"):
            changed.append("its shard_sha256 record")
        if changed:
            what = f"{', '.join(changed)} changed"
            if "unreadable" in current:
                what = f"it cannot be read ({current['unreadable']})"
            check.add("stale_source",
                      f"the source checkpoint {source.path} is no longer the one these shards were written from "
                      f"({what}): the shards are stale; recompile, or {_fix_reshard(check.compiled_dir)}",
                      file=f"{WEIGHTS_DIR}/{MANIFEST_FILE}", key="sources")


def _changed_shards(before: Any, after: Any) -> list[str]:
    if not isinstance(before, dict) or not isinstance(after, dict):
        return []
    return sorted(name for name in set(before) | set(after) if before.get(name) != after.get(name))


def _verify_digests(check: ShardedCheck, manifest: Manifest, weights: str, workers: int | None,
                    progress: bool | None) -> None:
    entries = [manifest.ranks[rank] for rank in check.ranks if rank in manifest.ranks]
    paths = {str(e.rank): os.path.join(weights, e.file) for e in entries}
    total = sum(e.size for e in entries)
    started = time.perf_counter()
    try:
        with Progress(total, "sha256 pre-sharded weights", show=progress) as shown:
            actual = hash_files(paths, workers=workers or _workers(), progress=shown.update)
    except OSError as exc:
        check.add("unreadable", f"cannot hash {exc.filename}: {exc.strerror or exc}", file=exc.filename)
        return
    elapsed = time.perf_counter() - started
    check.bytes_hashed = total
    check.report.bytes_read += total
    for entry in entries:
        if actual[str(entry.rank)] != entry.sha256:
            check.add("digest_mismatch", f"{paths[str(entry.rank)]} has SHA-256 {actual[str(entry.rank)]}, the manifest "
                      f"records {entry.sha256}: its data changed after it was written; copy it again from the "
                      "compiled directory", file=f"{WEIGHTS_DIR}/{entry.file}")
    check.add("verified", f"hashed {plural(len(entries), 'rank file')} ({format_bytes(total)}) in {format_duration(elapsed)}"
              f" ({total / elapsed / 1e6 if elapsed > 0 else 0:,.0f} MB/s)", severity=Severity.INFO)


def changed_since(check: ShardedCheck) -> list[str]:
    """The rank files whose identity changed since ``check`` read them (a swap during NxDI's read)."""
    changes = []
    weights = os.path.join(check.compiled_dir, WEIGHTS_DIR)
    for rank, before in sorted(check.identities.items()):
        path = os.path.join(weights, rank_file(rank))
        try:
            now = FileIdentity.of(os.stat(path))
        except OSError as exc:
            changes.append(f"{path}: {exc.strerror or exc}")
            continue
        if now.changes_since(before):
            changes.append(f"{path}: {'; '.join(now.changes_since(before))}")
    return changes


def refusal(check: ShardedCheck) -> ShardedWeightsError:
    """The error the hook raises for a failed check: the compiled directory, then every error."""
    errors = check.report.errors
    lines = [f"refusing the pre-sharded weights of {check.compiled_dir} ({plural(len(errors), 'problem')}); "
             "nothing was handed to NxDI:"]
    lines.extend(f"  {finding.render()}" for finding in errors[:20])
    if len(errors) > 20:
        lines.append(f"  ... and {len(errors) - 20} more (nxdi-gptoss-fp8 validate {check.compiled_dir} lists them)")
    return ShardedWeightsError("\n".join(lines), check)


# --------------------------------------------------------------------------- summary (inspect)


def manifest_summary(manifest: Manifest) -> dict[str, Any]:
    """What ``inspect`` shows of a manifest."""
    return {
        "tp_degree": manifest.tp_degree,
        "world_size": manifest.world_size,
        "ranks": _ranges(manifest.ranks),
        "bytes": sum(e.size for e in manifest.ranks.values()),
        "written_at": manifest.written_at,
        "package_version": manifest.package_version,
        "sources": [s.path for s in manifest.sources],
        "settings": {k: v for k, v in manifest.settings.items() if v is not None},
    }


def describe_presharded(compiled_dir: str) -> dict[str, Any] | None:
    """``inspect``'s view of a compiled directory's pre-sharded weights: the manifest summary, or
    why there is none and how to get one (None when there are no pre-sharded weights)."""
    weights = os.path.join(compiled_dir, WEIGHTS_DIR)
    try:
        files = sorted(name for name in os.listdir(weights) if RANK_FILE.match(name))
    except OSError:
        files = []
    if not files and not os.path.lexists(manifest_path(compiled_dir)):
        return None
    try:
        return {"rank_files": len(files), "manifest": manifest_summary(read_manifest(compiled_dir)), "problem": None}
    except ManifestError as exc:
        if exc.code == "no_manifest":
            problem = (f"the {plural(len(files), 'rank file')} in {WEIGHTS_DIR}/ were written without a manifest (compiled "
                       "before this release, or not through the hook in normalized mode): such a set is refused at "
                       f"load in normalized mode; to give them one, {_fix_reshard(compiled_dir)}")
        else:
            problem = str(exc)
        return {"rank_files": len(files), "manifest": None, "problem": problem, "code": exc.code}


__all__ = [
    "MANIFEST_FILE", "SHARD_SETTINGS", "Manifest", "ManifestError", "RankEntry", "ShardedCheck",
    "ShardedWeightsError", "Source", "changed_since", "check_presharded", "describe_presharded", "manifest_summary",
    "read_manifest", "refusal", "remove_manifest", "shard_settings", "source_fingerprint", "write_manifest",
]
