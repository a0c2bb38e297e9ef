"""Progress for long work (deep scan, shard hashing, conversion), on stderr only.

On a terminal: a tqdm bar (when tqdm is installed). Elsewhere (CI logs, services, pipes): a
plain line every ``interval_s`` seconds, and none at all for work that ends sooner, so short
runs stay quiet. Stdlib only; tqdm is imported lazily. Example::

    with Progress(total_bytes, "sha256") as progress:
        for chunk in chunks:
            ...
            progress.update(len(chunk))

``update`` may be called from several threads at once.
"""

from __future__ import annotations

import sys
import threading
import time
from typing import Any, TextIO

from .units import format_bytes, format_duration

__all__ = ["INTERVAL_S", "Progress"]

INTERVAL_S = 5.0


class Progress:
    """A progress display for ``total`` units of work named ``desc``.

    Args:
        total: the amount of work (bytes when ``unit`` is ``"B"``).
        desc: a short name shown before the figures ("deep scan", "sha256").
        unit: ``"B"`` (shown in decimal units: kB, MB, GB) or a word ("layer").
        show: None shows a bar on a terminal and plain lines elsewhere; False shows nothing;
            True shows a bar even when stderr is not a terminal.
        interval_s: seconds between plain lines, and before the first one (default ``INTERVAL_S``).
        stream: where to write (default ``sys.stderr``).
    """

    def __init__(self, total: int, desc: str, *, unit: str = "B", show: bool | None = None,
                 interval_s: float | None = None, stream: TextIO | None = None) -> None:
        self.total, self.desc, self.unit = total, desc, unit
        self.done = 0
        self.stream = stream if stream is not None else sys.stderr
        self.interval_s = INTERVAL_S if interval_s is None else interval_s
        self._lock = threading.Lock()
        self._started = time.monotonic()
        self._next_line = self._started + self.interval_s
        self._bar: Any = None
        self._lines = False
        if show is False or total <= 0:
            return
        terminal = bool(getattr(self.stream, "isatty", lambda: False)())
        if terminal or show:
            self._bar = _tqdm(total, desc, unit, self.stream)
        self._lines = self._bar is None  # no terminal, or no tqdm: plain lines

    def __enter__(self) -> Progress:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def set_description(self, desc: str) -> None:
        """Rename the work in progress (e.g. "convert 3/36 layers")."""
        self.desc = desc
        if self._bar is not None:
            self._bar.set_description(desc)

    def update(self, amount: int) -> None:
        """Record ``amount`` more units done."""
        if self._bar is not None:
            with self._lock:
                self._bar.update(amount)
            return
        with self._lock:
            self.done += amount
            now = time.monotonic()
            if not self._lines or now < self._next_line:
                return
            self._next_line = now + self.interval_s
            line = self._line(now)
        print(line, file=self.stream, flush=True)

    def close(self) -> None:
        """Remove the bar; a plain-line display prints nothing more."""
        if self._bar is not None:
            self._bar.close()
            self._bar = None

    def _line(self, now: float) -> str:
        if self.unit == "B":
            figures = f"{format_bytes(self.done)} of {format_bytes(self.total)}"
        else:
            figures = f"{self.done:,} of {self.total:,} {self.unit}s"
        percent = 100.0 * self.done / self.total if self.total else 100.0
        return f"{self.desc}: {figures} ({percent:.0f}%), {format_duration(now - self._started)}"


def _tqdm(total: int, desc: str, unit: str, stream: TextIO) -> Any:
    try:
        from tqdm import tqdm
    except ImportError:
        return None
    if unit == "B":
        return tqdm(total=total, desc=desc, unit="B", unit_scale=True, unit_divisor=1000, leave=False,
                    file=stream, dynamic_ncols=True)
    return tqdm(total=total, desc=desc, unit=unit, leave=False, file=stream, dynamic_ncols=True)
