"""The ``integrity`` check: shard files against the SHA-256 digests the index records.

``shard_sha256`` is optional in the format, so its absence is never an error by itself; but it
is never silent either: the preflight warns that the shards cannot be verified, and it is an
error when the caller asked for verification (``verify_checksums=True``), because a check that
was requested and could not run must fail closed. Shards are hashed in parallel threads
(hashlib releases the GIL) and the rate is reported. Stdlib only.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import TYPE_CHECKING

from .. import format as fmt
from ..machine import usable_cpus
from ..progress import Progress
from ..safeio.hashing import hash_files
from ..units import format_bytes, format_duration, plural
from .findings import PreflightReport, Severity

if TYPE_CHECKING:
    from .view import CheckpointView

__all__ = ["DIGESTS_KEY", "HashStats", "check_digests"]

DIGESTS_KEY = "shard_sha256"


@dataclass(frozen=True)
class HashStats:
    """What one verification pass did: shards and bytes hashed, time, threads."""

    shards: int
    bytes_hashed: int
    elapsed_s: float
    workers: int

    @property
    def rate_mb_s(self) -> float:
        return self.bytes_hashed / self.elapsed_s / 1e6 if self.elapsed_s > 0 else 0.0


def check_digests(
    view: CheckpointView,
    report: PreflightReport,
    *,
    verify: bool,
    workers: int | None = None,
) -> HashStats | None:
    """Report a missing ``shard_sha256`` and, when ``verify``, hash every readable shard.

    Args:
        view: the preflight's view (metadata and the shards whose headers were read).
        report: where findings go (``integrity.no_digests``, ``integrity.digest_mismatch``,
            an info ``integrity.verified`` with the hashing rate).
        verify: hash the shards; without digests this is an error instead of a warning.
        workers: hashing threads (default: one per shard up to the CPU count).

    Returns:
        The hashing statistics when shards were hashed, else None.
    """
    if view.index is None:
        return None  # no index: the index findings say why
    digests = view.metadata.get(DIGESTS_KEY)
    if DIGESTS_KEY in view.metadata and not isinstance(digests, dict):
        return None  # malformed: an index finding already
    if digests is None:
        if verify:
            report.add(
                "integrity", "no_digests",
                f"{fmt.INDEX_FILE} has no metadata.{DIGESTS_KEY}, so --verify-checksums cannot "
                "check any shard: re-write the checkpoint with a tool that records digests, or "
                "validate without --verify-checksums",
                file=fmt.INDEX_FILE, key=f"metadata.{DIGESTS_KEY}",
            )
        else:
            report.add(
                "integrity", "no_digests",
                f"{fmt.INDEX_FILE} has no metadata.{DIGESTS_KEY}: a corrupted or partly copied "
                "shard whose header is intact cannot be detected (the deep scan checks values only)",
                file=fmt.INDEX_FILE, key=f"metadata.{DIGESTS_KEY}", severity=Severity.WARNING,
            )
        return None
    if not verify:
        return None
    expected = {
        shard: digest for shard, digest in digests.items()
        if shard in view.headers and isinstance(digest, str)
    }
    if not expected:
        return None
    recorded = view.reader.recorded_sha256(sorted(expected))
    if recorded is not None:
        _compare_recorded(view, report, expected, recorded)
        return None
    paths = {shard: view.headers[shard].path for shard in expected}
    threads = max(1, min(len(paths), workers or usable_cpus()))
    total = sum(view.headers[shard].identity.size for shard in paths)
    started = time.perf_counter()
    try:
        actual = _hash_with_progress(paths, total, threads)
    except OSError as exc:
        report.add("filesystem", "unreadable", f"cannot hash {exc.filename}: {exc.strerror or exc}", file=exc.filename)
        return None
    stats = HashStats(len(paths), total, time.perf_counter() - started, threads)
    report.bytes_read += total
    for shard in sorted(expected):
        if actual[shard] != expected[shard]:
            report.add(
                "integrity", "digest_mismatch",
                f"{shard} has SHA-256 {actual[shard]}, the index records {expected[shard]}: the "
                "file changed after it was written (a partial copy or corruption); copy it again "
                "from the source",
                file=shard, key=f"metadata.{DIGESTS_KEY}",
            )
    matched = sum(actual[shard] == expected[shard] for shard in expected)
    report.add(
        "integrity", "verified",
        f"hashed {plural(stats.shards, 'shard')} ({format_bytes(stats.bytes_hashed)}) in "
        f"{format_duration(stats.elapsed_s)} with {plural(stats.workers, 'thread')} ({stats.rate_mb_s:,.0f} MB/s): "
        f"{matched} of {len(expected)} match their digests",
        file=fmt.INDEX_FILE, severity=Severity.INFO,
    )
    return stats


def _hash_with_progress(paths: dict[str, str], total: int, threads: int) -> dict[str, str]:
    with Progress(total, "sha256") as progress:
        return hash_files(paths, workers=threads, progress=progress.update)


def _compare_recorded(view: CheckpointView, report: PreflightReport, expected: dict[str, str],
                      recorded: dict[str, str | None]) -> None:
    """The index's digests against the SHA-256 the store records for each shard (a Hub repo's
    LFS records): not a byte of a shard read."""
    where = view.reader.root
    for shard in sorted(expected):
        actual = recorded.get(shard)
        if actual is None:
            report.add(
                "integrity", "no_digests",
                f"{where} records no SHA-256 for {shard} (not stored with Git LFS), so it cannot be checked "
                "without reading it: download the checkpoint and validate the directory with --verify-checksums",
                file=shard, key=f"metadata.{DIGESTS_KEY}",
            )
        elif actual != expected[shard]:
            report.add(
                "integrity", "digest_mismatch",
                f"{shard} has SHA-256 {actual} on {where} (its LFS record), the index records {expected[shard]}: "
                "the shard uploaded is not the one the index was written with; upload it again",
                file=shard, key=f"metadata.{DIGESTS_KEY}",
            )
    matched = sum(recorded.get(shard) == expected[shard] for shard in expected)
    report.add(
        "integrity", "verified",
        f"compared {plural(len(expected), 'shard')} with the SHA-256 {where} records (0 bytes read): "
        f"{matched} of {len(expected)} match their digests",
        file=fmt.INDEX_FILE, severity=Severity.INFO,
    )
