"""Ctrl-C (SIGINT) and SIGTERM during ``replayllm run``: stop between steps, keep the trace.

A signal raised as ``KeyboardInterrupt`` lands anywhere, in the middle of a step whose events
are half emitted, and the clean ``close()`` that followed wrote a summary marking the trace
complete (a prefix of the workload read as a whole run); SIGTERM killed the process with no
message and lost the events since the last flush. ``deferred_signals`` turns the first signal
into a flag that the run's loop reads before each step (``check``); the run then ends its trace
as incomplete (``LLMEngine.close(interrupted=True)``: every event of the steps taken is
committed, no summary is written). A second signal interrupts at once.
"""

from __future__ import annotations

import signal
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from types import FrameType

SIGNALS = (signal.SIGINT, signal.SIGTERM)


class RunInterrupted(Exception):
    """The run was asked to stop (``signum``: the signal) and stopped between two steps."""

    def __init__(self, signum: int) -> None:
        self.signum = signum
        self.name = signal.Signals(signum).name
        super().__init__(f"interrupted ({self.name})")

    @property
    def exit_status(self) -> int:
        """The shell's convention for a process ended by the signal: 128 + its number."""
        return 128 + self.signum


class _Pending:
    signum: int | None = None


_pending = _Pending()


def check() -> None:
    """Raise ``RunInterrupted`` when a deferred signal has arrived (call it between steps)."""
    if _pending.signum is not None:
        raise RunInterrupted(_pending.signum)


def _on_signal(signum: int, frame: FrameType | None) -> None:
    if _pending.signum is not None:  # the second one: the user means it, stop now
        raise KeyboardInterrupt
    _pending.signum = signum


@contextmanager
def deferred_signals() -> Iterator[None]:
    """Within the block, SIGINT and SIGTERM only set the flag ``check`` reads (on the main
    thread; elsewhere nothing changes). The previous handlers come back afterwards."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = {signum: signal.getsignal(signum) for signum in SIGNALS}
    _pending.signum = None
    for signum in SIGNALS:
        signal.signal(signum, _on_signal)
    try:
        yield
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)
        _pending.signum = None
