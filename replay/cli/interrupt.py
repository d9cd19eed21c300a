"""Ctrl-C (SIGINT) and SIGTERM during ``replayllm run``: stop between steps, keep the trace.

A signal raised as ``KeyboardInterrupt`` lands anywhere, in the middle of a step whose events
are half emitted, and the clean ``close()`` that followed wrote a summary marking the trace
complete (a prefix of the workload read as a whole run); SIGTERM killed the process with no
message and lost the events since the last flush. ``deferred_signals`` turns the first signal
into a flag that the run's loop reads before each step (``check``); the run then ends its trace
as incomplete (``LLMEngine.close(interrupted=True)``: every event of the steps taken is
committed, no summary is written). A second signal while the traced run stops (``recording``)
is one line on stderr and changes nothing: raised as ``KeyboardInterrupt`` it landed mid-step,
and the close that followed committed half a step. Before the traced engine exists (the model
loading, a warm-up run) nothing is recorded and a second signal interrupts at once. SIGKILL
stops at once and keeps the committed segments, each of whole steps.
"""

from __future__ import annotations

import os
import signal
import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from types import FrameType

SIGNALS = (signal.SIGINT, signal.SIGTERM)


def exit_status(signum: int) -> int:
    """The exit status of a long-running command (run, workload, profile, loadgen) that a signal
    stopped, after it cleaned up as on Ctrl-C: the shell's convention for a process the signal
    ended, 128 + its number (130: Ctrl-C, SIGINT; 143: SIGTERM), so a script or a job scheduler
    tells a stopped run from a finished one and from a failed one. (``serve`` is stopped by a
    signal by design: its graceful shutdown exits 0, as uvicorn's does, so a service manager
    counts it a clean stop.)"""
    return 128 + signum


class Terminated(KeyboardInterrupt):
    """SIGTERM raised where the command was (``terminate_as_interrupt``): it unwinds through
    the same clean-ups as Ctrl-C (a ``KeyboardInterrupt``), and ``replayllm`` then exits 143."""


@contextmanager
def terminate_as_interrupt() -> Iterator[None]:
    """Within the block, SIGTERM raises ``Terminated`` where Python's default would end the
    process at once: no clean-up, a partial output left, no word (``whatif``, ``tune``,
    ``verify`` ... under a job scheduler's stop). A command that handles SIGTERM itself
    (``run``, ``loadgen``, ``workload``, ``serve``, ``profile``) installs its own handler
    inside and restores this one; off the main thread, or where SIGTERM is handled or ignored
    already, nothing changes. A second SIGTERM while the first unwinds is ignored, so it cannot
    cut the clean-up short (an ``OUT.partial`` left); SIGKILL still stops at once."""
    if (threading.current_thread() is not threading.main_thread()
            or signal.getsignal(signal.SIGTERM) is not signal.SIG_DFL):
        yield
        return

    def raise_terminated(signum: int, frame: FrameType | None) -> None:
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        raise Terminated()

    previous = signal.signal(signal.SIGTERM, raise_terminated)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


class RunInterrupted(Exception):
    """The run was asked to stop (``signum``: the signal) and stopped between two steps."""

    def __init__(self, signum: int) -> None:
        self.signum = signum
        self.name = signal.Signals(signum).name
        super().__init__(f"interrupted ({self.name})")

    @property
    def exit_status(self) -> int:
        """``exit_status`` of the signal."""
        return exit_status(self.signum)


class _Pending:
    signum: int | None = None
    recording = False  # a traced engine runs or closes: it must stop between two steps


_pending = _Pending()


def check() -> None:
    """Raise ``RunInterrupted`` when a deferred signal has arrived (call it between steps)."""
    if _pending.signum is not None:
        raise RunInterrupted(_pending.signum)


def _on_signal(signum: int, frame: FrameType | None) -> None:
    if _pending.signum is None:
        _pending.signum = signum
    elif _pending.recording:  # the run is already stopping: let it end the step and close
        _say(f"replayllm run: {signal.Signals(signum).name} again: already stopping after the "
             "step under way (the trace keeps every whole step; SIGKILL stops at once)")
    else:  # the second one before anything is recorded: the user means it, stop now
        raise KeyboardInterrupt


def _say(line: str) -> None:
    """``line`` on stderr from a signal handler: straight to the file descriptor, as the main
    thread may be inside a write to ``sys.stderr`` (a progress bar's), which a ``print`` here
    would re-enter (``RuntimeError: reentrant call``); on its own line."""
    try:
        fd = sys.stderr.fileno()
    except (AttributeError, ValueError, OSError):  # not a file (a test's StringIO)
        sys.stderr.write(f"\n{line}\n")
        return
    try:
        os.write(fd, f"\n{line}\n".encode())
    except OSError:  # stderr closed: the line is lost, the run goes on stopping
        pass


@contextmanager
def recording() -> Iterator[None]:
    """Within the block a traced engine runs and closes: a signal after the first one only
    says the run is stopping (``_on_signal``)."""
    _pending.recording = True
    try:
        yield
    finally:
        _pending.recording = False


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
