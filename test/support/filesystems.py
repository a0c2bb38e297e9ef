"""Real small filesystems for the tests of full, exactly-full and read-only outputs: a tmpfs
mounted for the duration of a ``with`` block (root only; the tests skip otherwise)."""

from __future__ import annotations

import contextlib
import os
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

__all__ = ["IS_ROOT", "needs_root", "tmpfs"]

IS_ROOT = hasattr(os, "geteuid") and os.geteuid() == 0
needs_root = pytest.mark.skipif(not IS_ROOT, reason="mounts a tmpfs: needs root")


@contextlib.contextmanager
def tmpfs(path: Path, size: str = "64m", *, read_only: bool = False) -> Iterator[Path]:
    """A tmpfs of ``size`` at ``path`` (made if absent), optionally remounted read-only; a test
    that cannot mount one is skipped."""
    path.mkdir(parents=True, exist_ok=True)
    mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(path)], check=False,
                             capture_output=True, text=True)
    if mounted.returncode:
        pytest.skip(f"cannot mount a tmpfs here: {mounted.stderr.strip()}")
    try:
        if read_only:
            subprocess.run(["mount", "-o", "remount,ro", str(path)], check=True)
        yield path
    finally:
        subprocess.run(["umount", "-l", str(path)], check=False)
