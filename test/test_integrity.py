"""Integrity: shard digests verified in parallel on request; a checkpoint without digests is
never silently fine (a warning by default, an error when verification was asked for)."""

from __future__ import annotations

import hashlib
import os
from pathlib import Path
from typing import Any

import pytest
from ckpt_edit import edit_index, read_json, shards

from nxdi_gptoss_fp8 import cli, integrity
from nxdi_gptoss_fp8 import format as fmt
from nxdi_gptoss_fp8.checks import preflight
from nxdi_gptoss_fp8.findings import Severity


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
    assert seen["workers"] == stats.workers == min(count, workers or os.cpu_count() or 1)
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
