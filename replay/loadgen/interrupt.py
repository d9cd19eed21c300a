"""Ctrl-C (SIGINT) or SIGTERM in a load run: the run stops early and keeps what it measured.

One process: the event loop's handler of both cancels the run's task, which returns the
requests answered so far. Several: the client processes ignore both; the parent, on either,
sends each a stop over its pipe (readable on the worker's side: the same cancellation) and
collects what they have. A second signal is a KeyboardInterrupt, for a stop that hangs.
SIGTERM is what ``timeout``, ``kill`` and job schedulers send: it killed the run at once, the
measurements of every request lost and no result written.
"""

from __future__ import annotations

import asyncio
import contextlib
import signal
from multiprocessing.connection import Connection
from typing import Any

# The signals that stop a load run early, keeping what it measured.
STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM)


class _Received:
    signum: int | None = None  # the first stop signal of this process's latest load run


_received = _Received()


def stop_signal() -> int | None:
    """The signal that stopped this process's latest load run early (None: none did): the
    command's exit status is that signal's (``replay.cli.interrupt.exit_status``)."""
    return _received.signum


def _note(signum: int) -> None:
    if _received.signum is None:
        _received.signum = signum


class Interrupt:
    """While entered: the first SIGINT or SIGTERM (or ``stop_fd`` readable) cancels the current
    task and sets ``fired``; a second signal is a KeyboardInterrupt (a stop that hangs can be
    forced)."""

    def __init__(self, stop_fd: int | None) -> None:
        self.stop_fd, self.fired = stop_fd, False
        self.task: asyncio.Task = asyncio.current_task()  # type: ignore[assignment]
        self.loop = asyncio.get_running_loop()
        self.installed = False

    def _fire(self, signum: int | None = None) -> None:
        """A stop: ``signum`` (None: the parent's message on ``stop_fd``)."""
        if signum is not None:
            _note(signum)
        if self.fired:
            if self.stop_fd is None:
                raise KeyboardInterrupt
            return
        self.fired = True
        if self.stop_fd is not None:  # it stays readable: once is enough
            self.loop.remove_reader(self.stop_fd)
            self.installed = False
        self.task.cancel()

    def __enter__(self) -> Interrupt:
        try:
            if self.stop_fd is not None:
                self.loop.add_reader(self.stop_fd, self._fire)
            else:
                _received.signum = None
                for signum in STOP_SIGNALS:
                    self.loop.add_signal_handler(signum, self._fire, signum)
            self.installed = True
        except (ValueError, RuntimeError, NotImplementedError):
            pass  # not the main thread: Ctrl-C is the caller's
        return self

    def __exit__(self, *exc: object) -> None:
        if self.installed:
            if self.stop_fd is not None:
                self.loop.remove_reader(self.stop_fd)
            else:
                for signum in STOP_SIGNALS:
                    self.loop.remove_signal_handler(signum)


class StopWorkersOnSigint:
    """While entered (in the main thread): SIGINT or SIGTERM sends each worker in ``conns`` its
    stop (and sets ``sent``); a second signal is a KeyboardInterrupt."""

    def __init__(self, conns: list[Connection]) -> None:
        self.conns, self.sent = conns, False
        self.previous: dict[int, Any] = {}

    def _handle(self, signum: int, frame: Any) -> None:
        _note(signum)
        if self.sent:
            raise KeyboardInterrupt
        self.sent = True
        for conn in self.conns:
            with contextlib.suppress(OSError):
                conn.send("stop")

    def __enter__(self) -> StopWorkersOnSigint:
        _received.signum = None
        with contextlib.suppress(ValueError):  # not the main thread: Ctrl-C is the caller's
            for signum in STOP_SIGNALS:
                self.previous[signum] = signal.signal(signum, self._handle)
        return self

    def __exit__(self, *exc: object) -> None:
        for signum, handler in self.previous.items():
            signal.signal(signum, handler)
