"""The manifest of NxDI's pre-sharded weights: its data model, how it is read, and how it is written.

``write_manifest`` (after NxDI's ``shard_weights``, in normalized mode) records, atomically and
last, every rank file's size, header SHA-256, a sample digest and whole-file SHA-256 (hashed in
parallel), the NeuronConfig settings that change what the shards hold (``shard_settings``), and
the source checkpoint's path and fingerprint (``checkpoint_identity``). ``read_manifest`` reads it
back strictly (``ManifestError``). The check against the files on disk is ``validate.presharded``;
the two share the rank-file reader here (``read_rank``, ``sample_offsets``). The writer checks
that the samples tell apart every two ranks whose bytes differ, doubling the blocks until they
do. Stdlib only.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import Any

from .. import format as fmt
from .._version import __version__
from ..errors import FileTooLargeError, IntegrityError
from ..machine import usable_cpus
from ..progress import Progress
from ..safeio.files import FileIdentity, open_regular, read_bounded, write_atomically
from ..safeio.hashing import hash_files
from ..safeio.json_file import JsonFileError, read_json_file
from ..safeio.safetensors_header import PREFIX_SIZE, HeaderError, parse_header_bytes, read_header_bytes
from ..safeio.strict_json import JsonError, parse_json_strict
from ..units import plural, printable
from .integrity import DIGESTS_KEY
from .nxdi_config import config_attr, neuron_config_view

__all__ = [
    "MANIFEST_FILE",
    "MANIFEST_FORMAT",
    "MANIFEST_VERSION",
    "MAX_MANIFEST_BYTES",
    "MAX_RANKS",
    "MAX_SAMPLE_BLOCKS",
    "RANK_FILE",
    "SAMPLE_BLOCK",
    "SAMPLE_BLOCKS",
    "SHARD_SETTINGS",
    "WEIGHTS_DIR",
    "HeaderCache",
    "Manifest",
    "ManifestError",
    "ManifestSource",
    "RankEntry",
    "RankRead",
    "checkpoint_identity",
    "fix_reshard",
    "manifest_path",
    "rank_file",
    "read_manifest",
    "read_rank",
    "remove_manifest",
    "sample_offsets",
    "shard_settings",
    "write_manifest",
]

logger = logging.getLogger(f"{__package__}.presharded")  # one logger for the pre-sharded weights

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


def fix_reshard(compiled_dir: str) -> str:
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
    try:
        return read_bounded(path, limit)[0]
    except FileTooLargeError:
        raise IntegrityError(f"{path} is larger than {plural(limit, 'byte')}: not read") from None


def checkpoint_identity(checkpoint_dir: str) -> dict[str, Any]:
    """What identifies the normalized checkpoint a set of shards was loaded from (not the
    converter's ``provenance_fingerprint`` of a source): SHA-256 of its index and ``config.json``,
    and the index's ``shard_sha256`` map (None when it records none). ``OSError`` / ``IntegrityError`` when they cannot be read."""
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
class ManifestSource:
    """The checkpoint a set of shards was loaded from (two under fused speculation), as the
    manifest records it (not ``convert.source.Source``, the converter's detected source)."""

    path: str
    fingerprint: Mapping[str, Any]


@dataclass(frozen=True)
class Manifest:
    """What ``write_manifest`` recorded about one set of rank files."""

    tp_degree: int
    world_size: int
    ranks: Mapping[int, RankEntry]
    settings: Mapping[str, Any]
    sources: Sequence[ManifestSource]
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
        if tp < 1 or world < tp:
            raise ValueError(f"tp_degree {tp} and world_size {world} do not describe a compile (1 ≤ tp_degree ≤ world_size)")
        for key, value in (("tp_degree", tp), ("world_size", world)):
            if key in settings and settings[key] != value:
                raise ValueError(f"{key} is {value} but settings.{key} is {printable(repr(settings[key]))[:40]}: "
                                 "the manifest contradicts itself")
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
            if entry.rank >= world:
                raise ValueError(f"rank {entry.rank} is outside world_size {world}")
            entries[entry.rank] = entry
        return cls(tp, world, entries, settings, [ManifestSource(s["path"], s["fingerprint"]) for s in sources],
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
        document = read_json_file(path, what=MANIFEST_FILE, max_bytes=MAX_MANIFEST_BYTES)
    except JsonFileError as exc:
        if isinstance(exc.cause, FileNotFoundError):
            raise ManifestError("no_manifest", f"{path} does not exist: these pre-sharded weights were written "
                                "without the hook (compiled before nxdi-gptoss-fp8 recorded manifests, or not in "
                                f"normalized mode), so nothing vouches for them; {fix_reshard(compiled_dir)}") from None
        if exc.not_read or exc.oversized:
            reason = getattr(exc.cause, "strerror", None) or exc
            raise ManifestError("bad_manifest", f"{path} cannot be read ({reason}); {fix_reshard(compiled_dir)}") from None
        raise ManifestError("bad_manifest", f"{path}: {exc.cause or exc}; {fix_reshard(compiled_dir)}") from None
    try:
        return Manifest.from_dict(document)
    except ValueError as exc:
        raise ManifestError("bad_manifest", f"{path}: {exc}; {fix_reshard(compiled_dir)}") from None


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
class RankRead:
    identity: FileIdentity
    header: bytes
    sample_sha256: str


def read_rank(path: str, blocks: int, block_size: int) -> RankRead:
    """The identity, header bytes and sample digest of one rank file (``HeaderError`` for a
    length prefix that does not fit; ``OSError`` / ``NotRegularFileError`` when unreadable)."""
    with open_regular(path, buffering=0) as handle:
        fd = handle.fileno()
        identity = FileIdentity.of(os.fstat(fd))
        header = read_header_bytes(handle, identity.size)
        digest = hashlib.sha256()
        for offset, count in sample_offsets(identity.size, PREFIX_SIZE + len(header), blocks, block_size):
            digest.update(os.pread(fd, count, offset))
    return RankRead(identity, header, digest.hexdigest())


class HeaderCache:
    """Parses each distinct header once: every rank's header is usually the same bytes."""

    def __init__(self) -> None:
        self._verdicts: dict[tuple[str, int], HeaderError | None] = {}

    def problem(self, path: str, read: RankRead) -> HeaderError | None:
        key = (hashlib.sha256(read.header).hexdigest(), read.identity.size)
        if key not in self._verdicts:
            try:
                parse_header_bytes(read.header, path=path, identity=read.identity)
                self._verdicts[key] = None
            except HeaderError as exc:
                self._verdicts[key] = exc
        return self._verdicts[key]


# --------------------------------------------------------------------------- writing


def write_manifest(compiled_dir: str, *, ranks: Iterable[int], config: Any, sources: Sequence[ManifestSource],
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
            read = read_rank(path, 0, SAMPLE_BLOCK)
            parse_header_bytes(read.header, path=path, identity=read.identity)
            headers[int(rank)] = hashlib.sha256(read.header).hexdigest()
        except (OSError, HeaderError) as exc:
            raise IntegrityError(f"NxDI's shard step left {path} unusable ({getattr(exc, 'strerror', None) or exc}); "
                                 "no manifest was written: shard again") from None
    total = sum(os.stat(path).st_size for path in paths.values())
    with Progress(total, "sha256 pre-sharded weights", show=progress) as shown:
        digests = hash_files(paths, workers=workers or usable_cpus(), progress=shown.update)
    blocks = SAMPLE_BLOCKS
    while True:
        samples = {int(rank): read_rank(path, blocks, SAMPLE_BLOCK).sample_sha256 for rank, path in paths.items()}
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
    write_atomically(manifest_path(compiled_dir), json.dumps(manifest.to_dict(), indent=1).encode("utf-8"))
    return manifest


def _samples_separate(samples: Mapping[int, str], digests: Mapping[int, str]) -> bool:
    """Whether ranks whose bytes differ always have different sample digests."""
    by_sample: dict[str, str] = {}
    return all(by_sample.setdefault(sample, digests[rank]) == digests[rank] for rank, sample in samples.items())


