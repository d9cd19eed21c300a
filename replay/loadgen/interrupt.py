"""Ctrl-C (SIGINT) in a load run: the run stops early and keeps what it measured.

One process: the event loop's SIGINT handler cancels the run's task, which returns the requests
answered so far. Several: the client processes ignore SIGINT; the parent, on SIGINT, sends each
a stop over its pipe (readable on the worker's side: the same cancellation) and collects what
they have. A second Ctrl-C is a KeyboardInterrupt, for a stop that hangs.
"""

from __future__ import annotations

import asyncio
import contextlib
import signal
from multiprocessing.connection import Connection
from typing import Any


class Interrupt:
    """While entered: the first SIGINT (or ``stop_fd`` readable) cancels the current task and
    sets ``fired``; a second SIGINT is a KeyboardInterrupt (a stop that hangs can be forced).
    """

    def __init__(self, stop_fd: int | None) -> None:
        self.stop_fd, self.fired = stop_fd, False
        self.task: asyncio.Task = asyncio.current_task()  # type: ignore[assignment]
        self.loop = asyncio.get_running_loop()
        self.installed = False

    def _fire(self) -> None:
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
                self.loop.add_signal_handler(signal.SIGINT, self._fire)
            self.installed = True
        except (ValueError, RuntimeError, NotImplementedError):
            pass  # not the main thread: Ctrl-C is the caller's
        return self

    def __exit__(self, *exc: object) -> None:
        if self.installed:
            if self.stop_fd is not None:
                self.loop.remove_reader(self.stop_fd)
            else:
                self.loop.remove_signal_handler(signal.SIGINT)


class StopWorkersOnSigint:
    """While entered (in the main thread): SIGINT sends each worker in ``conns`` its stop (and
    sets ``sent``); a second SIGINT is a KeyboardInterrupt."""

    def __init__(self, conns: list[Connection]) -> None:
        self.conns, self.sent, self.previous = conns, False, None

    def _handle(self, signum: int, frame: Any) -> None:
        if self.sent:
            raise KeyboardInterrupt
        self.sent = True
        for conn in self.conns:
            with contextlib.suppress(OSError):
                conn.send("stop")

    def __enter__(self) -> StopWorkersOnSigint:
        with contextlib.suppress(ValueError):  # not the main thread: Ctrl-C is the caller's
            self.previous = signal.signal(signal.SIGINT, self._handle)
        return self

    def __exit__(self, *exc: object) -> None:
        if self.previous is not None:
            signal.signal(signal.SIGINT, self.previous)
