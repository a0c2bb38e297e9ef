"""Regular-file-only opening: FIFOs, sockets, devices and directories are refused at once."""

from __future__ import annotations

import dataclasses
import os
import socket
from pathlib import Path
from typing import Any

import pytest

from nxdi_gptoss_fp8.errors import FileTooLargeError, NotRegularFileError
from nxdi_gptoss_fp8.safeio.files import FileIdentity, not_regular_reason, open_regular, read_bounded


def _fifo(tmp: Path) -> Path:
    path = tmp / "fifo"
    os.mkfifo(path)
    return path


def _socket(tmp: Path) -> Path:
    path = tmp / "sock"
    server = socket.socket(socket.AF_UNIX)
    server.bind(str(path))
    server.close()
    return path


def _directory(tmp: Path) -> Path:
    path = tmp / "dir"
    path.mkdir()
    return path


@pytest.mark.parametrize(("make", "kind"), [
    (_fifo, "FIFO"), (_socket, "socket"), (_directory, "directory"), (lambda tmp: Path("/dev/null"), "character device"),
])
def test_non_regular_files_are_refused_without_blocking(tmp_path: Path, make, kind: str) -> None:
    path = make(tmp_path)
    assert kind in (not_regular_reason(path) or "")
    with pytest.raises(NotRegularFileError, match=kind):
        open_regular(path)


def test_a_link_to_a_fifo_is_refused(tmp_path: Path) -> None:
    link = tmp_path / "link"
    link.symlink_to(_fifo(tmp_path))
    with pytest.raises(NotRegularFileError, match="FIFO"):
        open_regular(link)


def test_regular_files_open_and_read(tmp_path: Path) -> None:
    path = tmp_path / "f.json"
    path.write_bytes(b"{}")
    assert not_regular_reason(path) is None
    with open_regular(path) as handle:
        assert handle.read() == b"{}"


def test_missing_path_is_an_os_error(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError):
        open_regular(tmp_path / "absent")
    with pytest.raises(FileNotFoundError):
        not_regular_reason(tmp_path / "absent")


@pytest.mark.parametrize("make", [_fifo, _socket, _directory, lambda tmp: Path("/dev/null")])
def test_non_regular_files_are_refused_before_they_are_opened(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, make) -> None:
    """Opening a device can act on it and opening a FIFO wakes its writer: stat first, never open."""
    path = make(tmp_path)
    opened: list[str] = []
    real_open = os.open

    def spy(target: Any, flags: int, *args: Any) -> int:
        opened.append(os.fspath(target))
        return real_open(target, flags, *args)

    monkeypatch.setattr(os, "open", spy)
    with pytest.raises(NotRegularFileError):
        open_regular(path)
    assert opened == []


def test_a_swap_after_the_stat_is_caught_on_the_opened_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from nxdi_gptoss_fp8.safeio import files

    monkeypatch.setattr(files, "_reason_or_none", lambda path: None)  # as if it was a file when stat looked
    with pytest.raises(NotRegularFileError, match="FIFO"):
        open_regular(_fifo(tmp_path))


@pytest.mark.parametrize(("field", "value", "words"), [
    ("device", 9, "the file was replaced"),
    ("inode", 9, "the file was replaced"),
    ("size", 50, "truncated"),
    ("size", 200, "grown"),
    ("mtime_ns", 9, "modification time changed"),
    ("ctime_ns", 9, "change time changed"),
])
def test_file_identity_names_every_change(field: str, value: int, words: str) -> None:
    before = FileIdentity(device=1, inode=2, size=100, mtime_ns=3, ctime_ns=4)
    assert before.changes_since(before) == []
    (change,) = dataclasses.replace(before, **{field: value}).changes_since(before)
    assert words in change


@pytest.mark.parametrize("size, limit", [(0, 0), (10, 10), (10, 11), (11, 10), (5000, 4096)])
def test_read_bounded_reads_the_whole_file_or_refuses_it(tmp_path: Path, size: int, limit: int) -> None:
    path = tmp_path / "f"
    path.write_bytes(b"x" * size)
    if size <= limit:
        raw, identity = read_bounded(path, limit)
        assert raw == b"x" * size and identity.size == size
        return
    seen: list[bytes] = []
    with pytest.raises(FileTooLargeError) as caught:
        read_bounded(path, limit, on_read=lambda raw, identity: seen.append(raw))
    assert (caught.value.size, caught.value.limit, caught.value.grew) == (size, limit, False)
    assert f"{size:,} bytes, above the {limit:,}-byte limit" in str(caught.value) and seen == []  # nothing read


def test_read_bounded_refuses_a_fifo_before_opening_it(tmp_path: Path) -> None:
    with pytest.raises(NotRegularFileError):
        read_bounded(_fifo(tmp_path), 100)
