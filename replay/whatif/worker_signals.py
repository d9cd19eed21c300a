"""Ctrl-C and the what-if's worker processes (a grid's variants, the plot worker).

A terminal's Ctrl-C reaches every process of the foreground group, workers included. A
``ProcessPoolExecutor`` worker interrupted while it wrote a large result (a variant's metrics,
hundreds of KB) to the result pipe left a partial message there: the parent's reader then
waited forever for its rest, and ``replayllm whatif --grid`` hung after Ctrl-C instead of
exiting 130. So a worker is interruptible only while it computes (``interruptible``): a
SIGINT between tasks or while it sends a result is remembered, and every task it starts
afterwards stops at once; the parent cancels what has not started (``stop_pool``).
"""

from __future__ import annotations

import contextlib
import os
import signal
from collections.abc import Iterator
from typing import Any

# One worker process's state: whether it runs a task now, and whether it was interrupted.
_STATE = {"computing": False, "interrupted": False}


def _on_sigint(_signum: int, _frame: Any) -> None:
    _STATE["interrupted"] = True
    if _STATE["computing"]:  # inside the task: its exception goes back as its small result
        # Once: a second signal (the group's SIGTERM, then the parent's SIGINT) while the first
        # unwinds would land in the pool's own code and end the worker with a traceback.
        _STATE["computing"] = False
        raise KeyboardInterrupt


def install_worker_handler() -> None:
    """In a pool worker (its initializer): SIGINT, and SIGTERM (a service manager stopping the
    whole group), stop only the task being computed."""
    _STATE.update(computing=False, interrupted=False)
    for signum in (signal.SIGINT, signal.SIGTERM):
        signal.signal(signum, _on_sigint)


def ignore_sigint() -> None:
    """In a worker whose parent ends it (the plot worker): Ctrl-C and SIGTERM are the parent's
    to handle, never a worker's traceback or a half-sent result."""
    for signum in (signal.SIGINT, signal.SIGTERM):
        signal.signal(signum, signal.SIG_IGN)


@contextlib.contextmanager
def interruptible() -> Iterator[None]:
    """Around a worker's task: an earlier SIGINT stops it before it starts, one arriving
    during it raises ``KeyboardInterrupt`` in it (and nowhere else)."""
    if _STATE["interrupted"]:
        raise KeyboardInterrupt
    _STATE["computing"] = True
    try:
        yield
    finally:
        _STATE["computing"] = False


def stop_pool(pool: Any) -> None:
    """The parent was interrupted: cancel the tasks not started, stop the running ones (a
    SIGINT each, as a terminal sends; also when only the parent was signalled), and wait for
    the workers, which answer at once."""
    processes = getattr(pool, "_processes", None) or {}  # the executor's own map of workers
    for process in list(processes.values()):
        with contextlib.suppress(OSError, TypeError):  # gone already, or never started
            os.kill(process.pid, signal.SIGINT)
    pool.shutdown(wait=True, cancel_futures=True)
