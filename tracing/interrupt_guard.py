"""Ctrl-C held back while the recorder moves rows: ``sigint_deferred``.

Python raises ``KeyboardInterrupt`` for SIGINT (a terminal's Ctrl-C, ``_thread.interrupt_main``)
at whatever bytecode boundary of the main thread its handler next runs. The recorder's step end,
idle flush and close move rows over many statements: the engine's buffer swapped for fresh
tables (``EventBuffer.drain``), each kind's rows converted and staged, a segment cut from the
staged tables, ``num_segments`` counted and the segment handed to the writer (a thread pool's
queue, or a JSON line down a pipe to the writer process). An interrupt between two of them lost
the rows in flight (drained, not staged; cut, not handed over), left ``num_segments`` past a
segment never written (the next one's marker then follows a gap, which the reader refuses),
or cut a line to the writer process short.

Why deferral and not an exception-safe rewrite of those statements: one assignment is atomic
(a handler runs between bytecodes, never inside one, nor inside a call into C), but a drain,
stage and hand-over is several objects changed in turn (the buffer's tables and its bound
appenders, the staged tables and their id range, the segment count, the writer's queue, whose
``ThreadPoolExecutor.submit`` and buffered pipe write are not themselves safe to interrupt).
Deferring the signal instead makes the whole of it atomic, and leaves it simple.

How: on the main thread (the only one a signal handler runs on; elsewhere nothing changes),
SIGINT's handler is swapped for one that only notes the signal, and the previous one is put
back afterwards; a signal noted meanwhile is raised again then (``signal.raise_signal``), so it
reaches that handler (``KeyboardInterrupt``, ``replayllm run``'s deferral, or the default
action) once the recorder's state is whole again. Every instant is covered: an interrupt before
the swap finds nothing changed yet; ``signal.signal`` runs a pending handler before it swaps,
so one arriving during either swap is handled by the old handler before anything changed or is
noted by the new one; none can be raised between the swap and the guarded block. A handler not
installed from Python (``signal.getsignal`` is None) cannot be put back: nothing is deferred
then. ``KeyboardInterrupt`` raised by code itself (not by a signal) is not deferred.
The cost: three calls (two ``sigaction``), a few microseconds, per staging or flush.
"""

from __future__ import annotations

import signal
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from types import FrameType

_noted: list[int] = []  # SIGINTs that arrived while deferred (main thread only)


def _note(signum: int, frame: FrameType | None) -> None:
    _noted.append(signum)


@contextmanager
def sigint_deferred() -> Iterator[None]:
    """Within the block SIGINT is only noted, then raised again on leaving it (see above).
    Nested blocks defer to the outermost."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = signal.getsignal(signal.SIGINT)
    if previous is None or previous is _note:  # not ours to put back; or nested
        yield
        return
    _noted.clear()
    signal.signal(signal.SIGINT, _note)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)
        if _noted:
            _noted.clear()
            signal.raise_signal(signal.SIGINT)
