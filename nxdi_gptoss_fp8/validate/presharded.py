"""The pre-sharded weights of NxDI checked against their manifest before NxDI reads them.

With ``save_sharded_checkpoint=True`` NxDI writes ``COMPILED/weights/tp{rank}_sharded_checkpoint.safetensors``
at compile time and every later load hands those files to the device with a bare safetensors
``load_file``; the checkpoint loader (and so the preflight) never runs again. This module binds
those files to the compile that wrote them and to the checkpoint they came from:

* ``write_manifest`` (after NxDI's ``shard_weights``, in normalized mode) records, atomically and
  last, every rank file's size, header SHA-256, a sample digest and whole-file SHA-256 (hashed in
  parallel), the NeuronConfig settings that change what the shards hold, and the source
  checkpoint's path and fingerprint (``checkpoint_identity``) — the manifest and its writing live
  in ``presharded_manifest``;
* ``check_presharded`` (this module; before NxDI's ``load_weights``, and ``validate COMPILED``)
  refuses, as findings of the ``presharded`` check, a missing or foreign manifest, a missing, truncated,
  extra or replaced rank file, a changed header, different settings, a re-converted source and an
  application built from another checkpoint than the one the shards were written from (a copy
  at another path with the same fingerprint is the same checkpoint); it warns of a partial copy
  or temporary file beside the ranks (rsync's ``.tp0_sharded_checkpoint.safetensors.AbCdEf``);
* ``compiled_verdict`` is the one verdict on a compiled directory, shared by ``validate`` and
  ``inspect``.

Rank files and ``weights/`` may be symbolic links, inside or outside the compiled directory:
NxDI's ``load_file`` follows them, so the check reads (and binds) the file they lead to.

The default check reads each rank's header and ``blocks`` sampled data blocks of ``block_size``
bytes (offsets fixed by the file size): every rank's header looks alike, the sampled data do not,
so a rank file replaced by another rank's file of the same size and header is caught. The writer
checks that the samples tell apart every two ranks whose bytes differ, doubling the blocks until
they do. Whole-file hashing at load runs only when asked for. Stdlib only.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import re
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from .. import format as fmt
from ..errors import IntegrityError, NotRegularFileError, ShardedWeightsError
from ..machine import usable_cpus
from ..progress import Progress
from ..safeio.files import FileIdentity
from ..safeio.hashing import hash_files
from ..safeio.safetensors_header import HeaderError
from ..units import format_bytes, format_duration, plural, printable
from .findings import PreflightReport, Severity
from .nxdi_config import config_attr, neuron_config_view
from .presharded_manifest import (
    MANIFEST_FILE,
    MAX_RANKS,
    RANK_FILE,
    SHARD_SETTINGS,
    WEIGHTS_DIR,
    HeaderCache,
    Manifest,
    ManifestError,
    ManifestSource,
    checkpoint_identity,
    fix_reshard,
    manifest_path,
    rank_file,
    read_manifest,
    read_rank,
    shard_settings,
)

__all__ = [
    "CHECK", "LEFTOVER_FILE", "NoShardedWeights", "ShardedCheck", "ShardedWeightsError", "changed_since",
    "check_presharded", "compiled_verdict", "describe_presharded", "loader_source", "manifest_summary", "refusal", "verdict_hint",
]

logger = logging.getLogger(__name__)
MAX_LISTED = 1 << 17  # names of weights/ looked at (a real set has one per rank and the manifest)
CHECK = "presharded"
# a name that holds a rank file's or the manifest's name but is not it: rsync's ".NAME.AbCdEf",
# "NAME.tmp", "NAME~", "NAME.partial", our own ".MANIFEST.tmp-PID" — what a copy or shard step leaves
LEFTOVER_FILE = re.compile(rf"tp\d+_sharded_checkpoint\.safetensors|{re.escape(MANIFEST_FILE)}")


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
        """``validate COMPILED --json``: the findings, what was checked and the one-line ``hint``."""
        data = self.report.to_dict()
        del data["hint"]  # this check's own verdict line, last
        data.update({"ok": self.ok, "complete": True, "ranks_checked": self.ranks, "bytes_hashed": self.bytes_hashed,
                     "manifest": manifest_summary(self.manifest) if self.manifest else None,
                     "hint": verdict_hint(self.compiled_dir, self)})
        return data

    def render_text(self, limit: int | None = None) -> str:
        lines = self.report.render_text(limit=limit).splitlines()[:-1]
        verdict = "VALID" if self.ok else "INVALID"
        hashed = f", {format_bytes(self.bytes_hashed)} hashed" if self.bytes_hashed else ""
        lines.append(printable(f"{verdict}: {self.compiled_dir}: pre-sharded weights, {plural(len(self.ranks), 'rank')} "
                               f"checked, {plural(self.report.error_count, 'error')}, "
                               f"{plural(self.report.warning_count, 'warning')}{hashed}; {format_duration(self.elapsed_s)}"))
        return "\n".join(lines)


@dataclass(frozen=True)
class NoShardedWeights:
    """``validate COMPILED``'s result for a compiled directory without pre-sharded weights
    (``compiled_verdict`` is None): nothing to check here, NxDI shards ``source`` at load."""

    compiled_dir: str
    source: str  # the checkpoint the config names, or what to look for

    ok = True

    def render_text(self) -> str:
        return (f"{self.compiled_dir}: no pre-sharded weights (save_sharded_checkpoint is off): NxDI's weights are "
                f"sharded at load from the checkpoint, where the preflight runs; validate {self.source}")

    def to_dict(self) -> dict[str, Any]:
        return {"ok": True, "path": self.compiled_dir, "findings": [], "message": self.render_text(),
                "hint": verdict_hint(self.compiled_dir, None)}


def loader_source(config: Any, model_path: str | os.PathLike[str] | None = None) -> str | None:
    """The checkpoint an application built with ``config`` (object or JSON) names, as NxDI's
    ``checkpoint_loader_fn`` picks it: ``quantized_checkpoints_path`` when quantized, else the
    config's ``_name_or_path`` when it exists, else ``model_path`` (None: none named)."""
    nc = neuron_config_view(config)
    quantized = config_attr(nc, "quantized_checkpoints_path") if config_attr(nc, "quantized", False) else None
    if isinstance(quantized, (str, os.PathLike)):
        return os.fspath(quantized)
    name = config_attr(config, "_name_or_path")
    if isinstance(name, str) and os.path.exists(name):
        return name
    return os.fspath(model_path) if model_path is not None else (name if isinstance(name, str) else None)


def check_presharded(compiled_dir: str, *, ranks: Iterable[int] | None, config: Any, verify: bool = False,
                     workers: int | None = None, progress: bool | None = False,
                     exists: Callable[[str], bool] = os.path.exists, checkpoint: str | None = None) -> ShardedCheck:
    """Check the rank files ``ranks`` (None: every rank of the manifest and of ``world_size``)
    of ``compiled_dir/weights`` against the manifest, ``config``'s shard settings (None: not
    compared), the checkpoint the application names (``checkpoint``: its fingerprint must be a
    recorded source's) and the recorded sources that still exist; hash them whole when ``verify``."""
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
    cache = HeaderCache()
    for rank in wanted:
        _check_rank(check, manifest, weights, rank, cache)
    _check_unlisted(check, manifest, weights)
    _check_sources(check, manifest, exists, checkpoint)
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
                      f"the compiled configuration, or {fix_reshard(check.compiled_dir)} with this one",
                      file=f"{WEIGHTS_DIR}/{MANIFEST_FILE}", key=f"settings.{name}")


def _shown(value: Any) -> str:
    return printable(json.dumps(value))[:120]


def _check_rank(check: ShardedCheck, manifest: Manifest, weights: str, rank: int, cache: HeaderCache) -> None:
    name = rank_file(rank)
    where = f"{WEIGHTS_DIR}/{name}"
    path = os.path.join(weights, name)
    entry = manifest.ranks.get(rank)
    if entry is None:
        check.add("rank_not_in_manifest",
                  f"rank {rank} is not among the {plural(len(manifest.ranks), 'rank')} the manifest records "
                  f"(tp_degree {manifest.tp_degree}, world_size {manifest.world_size}): it was not written with this "
                  f"set; {fix_reshard(check.compiled_dir)}", file=where)
        return
    try:
        read = read_rank(path, manifest.sample_blocks, manifest.sample_block_size)
    except FileNotFoundError:
        link = f" (a symbolic link to {_link_target(path)}, which does not exist)" if os.path.islink(path) else ""
        check.add("missing_rank_file", f"{path} does not exist{link} (a partial copy?): copy the whole compiled "
                  f"directory again, or {fix_reshard(check.compiled_dir)}; a host that holds only its own ranks "
                  "checks those (validate COMPILED --ranks START-END, the ranks its load reads)", file=where)
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
        check.add("size_mismatch", f"{path} is {plural(read.identity.size, 'byte')}, the manifest records {entry.size:,} "
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
                  f"({why}); copy it again from the compiled directory, or {fix_reshard(check.compiled_dir)}", file=where)


def _check_unlisted(check: ShardedCheck, manifest: Manifest, weights: str) -> None:
    try:
        names = os.listdir(weights)
    except OSError as exc:
        check.add("unreadable", f"cannot list {weights}: {exc.strerror or exc}", file=WEIGHTS_DIR)
        return
    for name in sorted(names)[:MAX_LISTED]:
        match = RANK_FILE.match(name)
        if match and int(match.group(1)) not in manifest.ranks:
            check.add("unlisted_rank_file",
                      f"{os.path.join(weights, name)} is not part of the set the manifest records (ranks "
                      f"{_ranges(manifest.ranks)}, tp_degree {manifest.tp_degree}): a file from another compile "
                      "mixed in; remove it, or copy the whole compiled directory again", file=f"{WEIGHTS_DIR}/{name}")
        elif not match and name != MANIFEST_FILE and (leftover := LEFTOVER_FILE.search(name)):
            check.add("partial_file",
                      f"{os.path.join(weights, name)} is not a rank file NxDI reads but a temporary or partial copy of "
                      f"{leftover.group(0)} (rsync's .NAME.XXXXXX, an interrupted copy or shard step): a copy may still "
                      "be running or have stopped; let it finish, then remove the file", file=f"{WEIGHTS_DIR}/{name}",
                      severity=Severity.WARNING)


def _ranges(ranks: Iterable[int]) -> str:
    ordered = sorted(ranks)
    if not ordered:
        return "none"
    return f"{ordered[0]}…{ordered[-1]}" if ordered == list(range(ordered[0], ordered[-1] + 1)) else ", ".join(map(str, ordered))


def _link_target(path: str) -> str:
    try:
        return printable(os.readlink(path))[:300]
    except OSError:
        return "an unreadable target"


def _fingerprint(path: str) -> Mapping[str, Any]:
    try:
        return checkpoint_identity(path)
    except (OSError, IntegrityError) as exc:
        return {"unreadable": getattr(exc, "strerror", None) or str(exc)}


def _same_checkpoint(current: Mapping[str, Any], recorded: Mapping[str, Any]) -> bool:
    return "unreadable" not in current and all(current.get(key) == recorded.get(key)
                                                for key in ("index_sha256", "config_sha256", "shard_sha256"))


def _named_source(check: ShardedCheck, manifest: Manifest, exists: Callable[[str], bool],
                  checkpoint: str | None) -> ManifestSource | None:
    """The recorded source the application's checkpoint is (same fingerprint, any path), or None;
    an error when it names a checkpoint, at another path, that is none of them."""
    if checkpoint is None or not manifest.sources or not exists(checkpoint):
        return None  # nothing named, or not on this host: NxDI never reads it with pre-sharded weights
    current = _fingerprint(checkpoint)
    bound = next((source for source in manifest.sources if _same_checkpoint(current, source.fingerprint)), None)
    recorded = {os.path.realpath(source.path) for source in manifest.sources}
    if bound is None and os.path.realpath(checkpoint) not in recorded:
        written = " and ".join(source.path for source in manifest.sources)
        why = f"it cannot be read ({current['unreadable']})" if "unreadable" in current else \
            "its index, config.json or shard digests differ from the recorded fingerprint"
        check.add("other_checkpoint",
                  f"the model is built from the checkpoint {checkpoint}, but the pre-sharded weights of "
                  f"{check.compiled_dir} were written from {written} and {checkpoint} is not that checkpoint ({why}): "
                  f"loading would run {written}'s weights; build the model from {written} "
                  f"(quantized_checkpoints_path), or {fix_reshard(check.compiled_dir)}",
                  file=f"{WEIGHTS_DIR}/{MANIFEST_FILE}", key="sources")
    return bound


def _check_sources(check: ShardedCheck, manifest: Manifest, exists: Callable[[str], bool], checkpoint: str | None) -> None:
    bound = _named_source(check, manifest, exists, checkpoint)
    for source in manifest.sources:
        if source is bound:  # the checkpoint the application names has this fingerprint (moved or not)
            continue
        if not exists(source.path):
            check.add("source_gone", f"the source checkpoint {source.path} is not here (the compiled directory moved to "
                      "another host?): only the manifest vouches for the shards", severity=Severity.INFO)
            logger.info("pre-sharded weights in %s: their source checkpoint %s is not on this host; checked against "
                        "the manifest only", check.compiled_dir, source.path)
            continue
        try:
            current: Mapping[str, Any] = checkpoint_identity(source.path)
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
                      f"({what}): the shards are stale; recompile, or {fix_reshard(check.compiled_dir)}",
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
            actual = hash_files(paths, workers=workers or usable_cpus(), progress=shown.update)
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


def compiled_verdict(compiled_dir: str, config: Any, *, ranks: Iterable[int] | None = None, verify: bool = False,
                     workers: int | None = None, progress: bool | None = False) -> ShardedCheck | None:
    """The one verdict on a compiled directory, for ``validate COMPILED`` and ``inspect COMPILED``:
    None when it holds no pre-sharded weights (``save_sharded_checkpoint`` off in ``config`` and
    no rank file or manifest in ``weights/``), else ``check_presharded`` of ``ranks`` against
    ``config`` (its ``neuron_config.json`` or another NeuronConfig) and the checkpoint it names."""
    nc = neuron_config_view(config)
    if not config_attr(nc, "save_sharded_checkpoint", False) and describe_presharded(compiled_dir) is None:
        return None
    if ranks is None:  # every rank: the manifest's, and those a load with this config reads
        try:
            manifest = read_manifest(compiled_dir)
            ranks = set(manifest.ranks) | set(range(manifest.world_size)) | _config_ranks(nc)
        except ManifestError:
            pass  # check_presharded reports it
    return check_presharded(compiled_dir, ranks=ranks, config=config, verify=verify, workers=workers, progress=progress,
                            checkpoint=loader_source(config))


def _config_ranks(nc: Any) -> set[int]:
    """The ranks NxDI's ``load_weights`` reads with this NeuronConfig (``start_rank_id`` … +
    ``local_ranks_size``, which defaults to ``world_size``); empty when they are not numbers."""
    start = config_attr(nc, "start_rank_id", 0)
    count = config_attr(nc, "local_ranks_size") or config_attr(nc, "world_size") or config_attr(nc, "tp_degree", 1)
    if type(start) is not int or type(count) is not int or not (start >= 0 and count > 0 and start + count <= MAX_RANKS):
        return set()
    return set(range(start, start + count))


def verdict_hint(compiled_dir: str, check: ShardedCheck | None) -> str:
    """The one line ``validate COMPILED --json`` gives as ``hint`` (and ``inspect``'s verdict)."""
    if check is None:
        return (f"{compiled_dir} holds no pre-sharded weights (save_sharded_checkpoint is off): NxDI shards the "
                "checkpoint at load, where the preflight runs; validate that checkpoint")
    if check.ok:
        return (f"{compiled_dir}: the pre-sharded weights of ranks {_ranges(check.ranks)} match their manifest; pass it "
                "to NxDI as the compiled model path")
    first = check.report.errors[0]
    more = len(check.report.errors) - 1
    return printable(f"{compiled_dir}: pre-sharded weights refused ({first.code}{f' and {more} more' if more else ''}): "
                     f"{first.message}")[:2000]


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
                       f"load in normalized mode; to give them one, {fix_reshard(compiled_dir)}")
        else:
            problem = str(exc)
        return {"rank_files": len(files), "manifest": None, "problem": problem, "code": exc.code}


