"""Integrity: shard digests verified in parallel on request; a checkpoint without digests is
never silently fine (a warning by default, an error when verification was asked for)."""

from __future__ import annotations

import hashlib
import os
from pathlib import Path
from typing import Any

import pytest
from ckpt_edit import edit_index, read_json, shards

from nxdi_gptoss_fp8 import cli
from nxdi_gptoss_fp8 import format as fmt
from nxdi_gptoss_fp8.machine import usable_cpus
from nxdi_gptoss_fp8.validate import integrity
from nxdi_gptoss_fp8.validate.findings import Severity
from nxdi_gptoss_fp8.validate.pipeline import preflight


def _drop_digests(ckpt: Path) -> None:
    edit_index(ckpt, lambda index: index["metadata"].pop("shard_sha256"))


def test_valid_digests_verify_and_report_the_rate(tiny_template: Path) -> None:
    report = preflight(tiny_template, allow_custom_model=True, verify_checksums=True)
    assert report.ok, report.render_text()
    (info,) = [f for f in report.findings if f.code == "integrity.verified"]
    assert info.severity is Severity.INFO
    count = len(shards(tiny_template))
    assert f"hashed {count} shards" in info.message and "MB/s" in info.message
    assert f"{count} match their digests" in info.message


def test_default_preflight_hashes_nothing(tiny_template: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(integrity, "hash_files", lambda *a, **k: pytest.fail("hashed without being asked"))
    report = preflight(tiny_template, allow_custom_model=True)
    assert report.ok and not report.findings


def test_missing_digests_warn_by_default(tiny_checkpoint: Path, capsys: pytest.CaptureFixture[str]) -> None:
    _drop_digests(tiny_checkpoint)
    report = preflight(tiny_checkpoint, allow_custom_model=True)
    assert report.ok
    assert [(f.code, f.severity) for f in report.findings] == [("integrity.no_digests", Severity.WARNING)]
    assert cli.main(["validate", str(tiny_checkpoint), "--allow-custom-model"]) == cli.EXIT_OK
    assert "WARNING integrity.no_digests" in capsys.readouterr().out


def test_missing_digests_fail_when_verification_is_asked(tiny_checkpoint: Path, capsys: pytest.CaptureFixture[str]) -> None:
    _drop_digests(tiny_checkpoint)
    report = preflight(tiny_checkpoint, allow_custom_model=True, verify_checksums=True)
    assert [f.code for f in report.errors] == ["integrity.no_digests"]
    assert cli.main(["validate", str(tiny_checkpoint), "--allow-custom-model", "--verify-checksums"]) == cli.EXIT_FINDINGS
    assert "ERROR integrity.no_digests" in capsys.readouterr().out


@pytest.mark.parametrize("which", [0, 1, 2, 3])
def test_a_changed_byte_is_found_in_exactly_its_shard(tiny_checkpoint: Path, which: int) -> None:
    shard = shards(tiny_checkpoint)[which]
    path = tiny_checkpoint / shard
    data = bytearray(path.read_bytes())
    data[-1] ^= 0x01  # the last data byte: the header and every other check stay valid
    path.write_bytes(bytes(data))
    assert preflight(tiny_checkpoint, allow_custom_model=True).ok
    report = preflight(tiny_checkpoint, allow_custom_model=True, verify_checksums=True)
    mismatches = [f for f in report.errors if f.code == "integrity.digest_mismatch"]
    assert [f.file for f in mismatches] == [shard]
    assert hashlib.sha256(bytes(data)).hexdigest() in mismatches[0].message


@pytest.mark.parametrize("workers", [None, 1, 3, 64])
def test_shards_are_hashed_in_parallel_threads(tiny_template: Path, monkeypatch: pytest.MonkeyPatch, workers: int | None) -> None:
    seen: dict[str, Any] = {}
    real = integrity.hash_files

    def spy(paths: dict[str, str], **kwargs: Any) -> dict[str, str]:
        seen.update(kwargs, paths=paths)
        return real(paths, **kwargs)

    monkeypatch.setattr(integrity, "hash_files", spy)
    report = preflight(tiny_template, allow_custom_model=True)
    stats = integrity.check_digests(report.view, report, verify=True, workers=workers)
    assert stats is not None and report.ok
    count = len(shards(tiny_template))
    assert sorted(seen["paths"]) == shards(tiny_template)
    assert seen["workers"] == stats.workers == min(count, workers or usable_cpus())
    assert stats.bytes_hashed == sum((tiny_template / s).stat().st_size for s in shards(tiny_template))


def test_a_shard_deleted_before_hashing_is_a_finding(tiny_checkpoint: Path) -> None:
    report = preflight(tiny_checkpoint, allow_custom_model=True)
    (tiny_checkpoint / shards(tiny_checkpoint)[2]).unlink()
    integrity.check_digests(report.view, report, verify=True)
    assert "filesystem.unreadable" in report.codes()


def test_only_shards_with_a_readable_header_are_hashed(tiny_checkpoint: Path) -> None:
    broken = shards(tiny_checkpoint)[1]
    (tiny_checkpoint / broken).write_bytes(b"\x00" * 4)
    report = preflight(tiny_checkpoint, allow_custom_model=True, verify_checksums=True)
    assert "header.too_short" in report.codes()
    assert "integrity.digest_mismatch" not in report.codes()
    (info,) = [f for f in report.findings if f.code == "integrity.verified"]
    assert f"hashed {len(shards(tiny_checkpoint)) - 1} shards" in info.message


@pytest.mark.parametrize("value", [[], "abc", None, 7])
def test_malformed_digest_field_is_an_index_error_not_missing(tiny_checkpoint: Path, value: Any) -> None:
    edit_index(tiny_checkpoint, lambda index: index["metadata"].__setitem__("shard_sha256", value))
    report = preflight(tiny_checkpoint, allow_custom_model=True, verify_checksums=True)
    assert "index.wrong_metadata_type" in report.codes()
    assert "integrity.no_digests" not in report.codes()


def test_digests_recorded_by_the_writer_are_what_is_verified(tiny_template: Path) -> None:
    recorded = read_json(tiny_template / fmt.INDEX_FILE)["metadata"]["shard_sha256"]
    assert recorded == {s: hashlib.sha256((tiny_template / s).read_bytes()).hexdigest() for s in shards(tiny_template)}


def test_a_set_cancel_flag_stops_hashing_after_the_current_chunk(tmp_path: Path) -> None:
    import threading

    from nxdi_gptoss_fp8.safeio.hashing import Cancelled, sha256_file

    path = tmp_path / "big.bin"
    path.write_bytes(bytes(64 * 1024))
    cancel, chunks = threading.Event(), []

    def progress(count: int) -> None:
        chunks.append(count)
        cancel.set()

    with pytest.raises(Cancelled):
        sha256_file(str(path), chunk=1024, progress=progress, cancel=cancel)
    assert chunks == [1024]


def test_ctrl_c_while_waiting_stops_every_hashing_thread(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """KeyboardInterrupt in the waiting thread: the workers stop at their next chunk (not at
    the end of their file) and the interrupt propagates."""
    import time

    from nxdi_gptoss_fp8.safeio import hashing

    paths = {}
    for name in ("a", "b", "c"):
        (tmp_path / name).write_bytes(bytes(256 * 1024))
        paths[name] = str(tmp_path / name)
    real_wait, calls, hashed = hashing.wait, [], []

    def interrupted_wait(*args: Any, **kwargs: Any) -> Any:
        calls.append(1)
        if len(calls) > 2:
            raise KeyboardInterrupt
        return real_wait(*args, **{**kwargs, "timeout": 0.01})

    def slow_progress(count: int) -> None:  # a slow disk: 10 ms a chunk
        hashed.append(count)
        time.sleep(0.01)

    monkeypatch.setattr(hashing, "wait", interrupted_wait)
    started = time.perf_counter()
    with pytest.raises(KeyboardInterrupt):
        hashing.hash_files(paths, workers=2, progress=slow_progress, chunk=1024)
    assert time.perf_counter() - started < 1.0
    assert sum(hashed) < 3 * 256 * 1024 / 4


def _bytes_read(pid: int) -> int:
    """Bytes process ``pid`` has read so far (Linux /proc), 0 before it is visible."""
    try:
        with open(f"/proc/{pid}/io") as handle:
            return next(int(line.split()[1]) for line in handle if line.startswith("rchar:"))
    except (OSError, StopIteration):
        return 0


@pytest.mark.skipif(not os.path.exists("/proc/self/io"), reason="watches the child's reads in /proc")
def test_sigint_during_verify_checksums_stops_promptly(tmp_path: Path) -> None:
    """A real Ctrl-C: ``validate --verify-checksums`` of a 32 GB (sparse) shard is interrupted
    within a chunk's time, not after the shard is hashed to its end (seconds more)."""
    import json
    import signal
    import struct
    import subprocess
    import sys
    import time

    ckpt = tmp_path / "ckpt"
    ckpt.mkdir()
    size = 32 << 30
    header = json.dumps({"x": {"dtype": "U8", "shape": [size], "data_offsets": [0, size]}}).encode()
    with open(ckpt / "a.safetensors", "wb") as handle:
        handle.write(struct.pack("<Q", len(header)) + header)
        handle.truncate(8 + len(header) + size)  # a hole: reads as zeros, costs no disk
    (ckpt / fmt.INDEX_FILE).write_text(json.dumps({
        "metadata": {"shard_sha256": {"a.safetensors": "0" * 64}}, "weight_map": {"x": "a.safetensors"}}))
    child = subprocess.Popen([sys.executable, "-m", "nxdi_gptoss_fp8.cli", "validate", str(ckpt), "--verify-checksums"],
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 60
    while _bytes_read(child.pid) < 64 << 20:  # imports, preflight, then the hashing has begun
        assert child.poll() is None and time.monotonic() < deadline, child.communicate()
        time.sleep(0.02)
    interrupted = time.perf_counter()
    child.send_signal(signal.SIGINT)
    _, stderr = child.communicate(timeout=30)
    assert time.perf_counter() - interrupted < 1.5, "hashing went on after Ctrl-C"
    assert child.returncode == 130 and "interrupted" in stderr
