"""Progress: a bar on a terminal, a plain line every few seconds elsewhere, nothing when asked."""

from __future__ import annotations

import io
import re
import threading
from pathlib import Path

import pytest

from nxdi_gptoss_fp8 import progress as progress_module
from nxdi_gptoss_fp8.progress import Progress


class Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_plain_lines_when_stderr_is_not_a_terminal() -> None:
    stream = io.StringIO()
    with Progress(4_000_000, "sha256", stream=stream, interval_s=0.0) as progress:
        progress.update(1_000_000)
        progress.update(3_000_000)
    lines = stream.getvalue().splitlines()
    assert lines[0].startswith("sha256: 1.00 MB of 4.00 MB (25%), ") and lines[0].endswith(" ms")
    assert lines[1].startswith("sha256: 4.00 MB of 4.00 MB (100%)")


def test_short_work_prints_nothing_off_a_terminal() -> None:
    stream = io.StringIO()
    with Progress(10, "deep scan", stream=stream) as progress:
        progress.update(10)
    assert stream.getvalue() == ""


def test_units_other_than_bytes() -> None:
    stream = io.StringIO()
    with Progress(36, "verify", unit="layer", stream=stream, interval_s=0.0) as progress:
        progress.set_description("verify layer 1")
        progress.update(1)
    assert stream.getvalue().startswith("verify layer 1: 1 of 36 layers (3%), ")


def test_a_bar_on_a_terminal() -> None:
    pytest.importorskip("tqdm")
    stream = Terminal()
    with Progress(2_000_000, "deep scan", stream=stream) as progress:
        progress.update(2_000_000)
    assert "deep scan" in stream.getvalue() and "/2.00M" in stream.getvalue()  # decimal: 2,000,000 is 2.00M


def test_without_tqdm_a_terminal_gets_plain_lines(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(progress_module, "_tqdm", lambda *a: None)
    stream = Terminal()
    with Progress(100, "sha256", stream=stream, interval_s=0.0) as progress:
        progress.update(50)
    assert stream.getvalue().startswith("sha256: 50 B of 100 B (50%)")


def test_show_false_is_silent_everywhere() -> None:
    for stream in (io.StringIO(), Terminal()):
        with Progress(100, "x", show=False, stream=stream, interval_s=0.0) as progress:
            progress.update(100)
        assert stream.getvalue() == ""


def test_updates_from_threads_add_up() -> None:
    progress = Progress(8_000, "sha256", show=False)
    threads = [threading.Thread(target=lambda: [progress.update(1) for _ in range(1000)]) for _ in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert progress.done == 8_000


@pytest.fixture
def every_update(monkeypatch: pytest.MonkeyPatch) -> None:
    """Plain progress lines at every update instead of every few seconds."""
    monkeypatch.setattr(progress_module, "INTERVAL_S", 0.0)


def test_deep_scan_checksums_and_writer_hashing_report_progress_off_a_terminal(
        every_update: None, tiny_template: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from nxdi_gptoss_fp8 import preflight
    from nxdi_gptoss_fp8.synthetic.tiny_stdlib import make_tiny_stdlib

    assert preflight(tiny_template, allow_custom_model=True, deep=True, verify_checksums=True).ok
    make_tiny_stdlib(tmp_path / "t")
    err = capsys.readouterr().err
    for desc in ("deep scan", "sha256", "sha256 shards"):
        assert re.search(rf"^{desc}: [\d.]+ [k]?B of [\d.]+ [k]?B \(\d+%\), ", err, re.MULTILINE), (desc, err)


def test_hashing_reports_progress_chunk_by_chunk(tmp_path: Path) -> None:
    """A single large shard moves the display while it is hashed, not only when it is done."""
    from nxdi_gptoss_fp8.safeio.hashing import CHUNK, hash_buffers, hash_files

    path = tmp_path / "shard"
    path.write_bytes(bytes(2 * CHUNK + 5))
    steps: list[int] = []
    hash_files({"shard": str(path)}, progress=steps.append)
    assert steps == [CHUNK, CHUNK, 5]
    steps.clear()
    hash_buffers({"a": bytearray(CHUNK + 1), "b": b"xyz"}, progress=steps.append)
    assert sorted(steps) == [1, 3, CHUNK]
