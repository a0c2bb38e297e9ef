"""Steps an interruption must not cut in half: Ctrl-C, SIGTERM and SIGHUP held until the step ends.

Python raises a signal's exception at whatever bytecode the main thread is running. Two steps
break when that happens inside them: importing a C extension (torch's initialisers swallow
the exception, and the signal is lost: the command runs on), and starting a worker process
(the parent stops halfway through sending the worker its start data, so the worker dies with
a multiprocessing traceback, and a worker not yet registered is never ended). Inside
``interrupts_held()`` such a signal is recorded; when the block ends the handlers that were
there before are restored and the signal is delivered again, to them. Stdlib only.
"""

from __future__ import annotations

import contextlib
import signal
import threading
from collections.abc import Iterator

__all__ = ["INTERRUPTS", "interrupts_held"]

INTERRUPTS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)


@contextlib.contextmanager
def interrupts_held() -> Iterator[None]:
    """Inside: SIGINT, SIGTERM and SIGHUP are recorded instead of handled; on leaving, the
    previous handlers are back and each recorded signal is raised again (once), so it acts
    as if it had arrived just then. Outside the main thread (where handlers cannot be set)
    nothing changes."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    received: list[int] = []

    def record(signum: int, _frame: object) -> None:
        received.append(signum)

    previous = {}
    for signum in INTERRUPTS:
        handler = signal.getsignal(signum)
        if handler is None:  # installed outside Python: it cannot be put back, so leave it
            continue
        previous[signum] = handler
        signal.signal(signum, record)
    try:
        yield
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)
        for signum in dict.fromkeys(received):
            signal.raise_signal(signum)
