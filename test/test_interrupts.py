"""Interruptions held across a step that must not be cut in half: recorded inside, delivered
to the previous handler once the step ends, whatever the signal."""

from __future__ import annotations

import signal
import sys
import threading
import types
from collections.abc import Iterator

import pytest

from nxdi_gptoss_fp8 import deps
from nxdi_gptoss_fp8.interrupts import INTERRUPTS, interrupts_held


class Caught(Exception):
    def __init__(self, signum: int) -> None:
        super().__init__(signum)
        self.signum = signum


@pytest.fixture
def raising_handlers() -> Iterator[None]:
    """Each of the interrupt signals raises ``Caught`` (as the command line's handlers raise)."""
    def handler(signum: int, _frame: object) -> None:
        raise Caught(signum)

    previous = {signum: signal.signal(signum, handler) for signum in INTERRUPTS}
    yield
    for signum, old in previous.items():
        signal.signal(signum, old)


@pytest.mark.parametrize("signum", INTERRUPTS)
def test_a_signal_inside_waits_for_the_end_of_the_block(raising_handlers: None, signum: int) -> None:
    steps = []
    with pytest.raises(Caught) as caught, interrupts_held():
        signal.raise_signal(signum)
        steps.append("the step ran to its end")
    assert steps == ["the step ran to its end"] and caught.value.signum == signum


def test_the_handlers_are_back_after_the_block(raising_handlers: None) -> None:
    before = {signum: signal.getsignal(signum) for signum in INTERRUPTS}
    with interrupts_held():
        assert all(signal.getsignal(signum) != before[signum] for signum in INTERRUPTS)
    assert {signum: signal.getsignal(signum) for signum in INTERRUPTS} == before


def test_a_repeated_signal_is_delivered_once(raising_handlers: None) -> None:
    with pytest.raises(Caught), interrupts_held():
        signal.raise_signal(signal.SIGTERM)
        signal.raise_signal(signal.SIGTERM)
    with interrupts_held():
        pass


def test_outside_the_main_thread_nothing_changes(raising_handlers: None) -> None:
    seen: list[object] = []

    def run() -> None:
        with interrupts_held():
            seen.append(signal.getsignal(signal.SIGTERM))

    thread = threading.Thread(target=run)
    thread.start()
    thread.join()
    assert seen == [signal.getsignal(signal.SIGTERM)]


def test_an_import_is_not_cut_in_half(raising_handlers: None, monkeypatch: pytest.MonkeyPatch) -> None:
    """``require``: a signal while the module imports (torch's C initialisers would swallow the
    exception) is delivered once the import is done, so it is neither lost nor mid-import."""
    module = types.ModuleType("slow_to_import")
    imported = []

    def import_module(name: str) -> types.ModuleType:
        signal.raise_signal(signal.SIGTERM)
        imported.append(name)
        return module

    monkeypatch.setattr(deps.importlib, "import_module", import_module)
    with pytest.raises(Caught):
        deps.require("slow_to_import")
    assert imported == ["slow_to_import"]
    assert "slow_to_import" not in sys.modules
