"""The engine thread's time outside the engine core: what a step's ``outside_s`` measures.

Between two ``EngineCore.step`` calls the driver runs on the same thread: it adds and aborts
requests, hands results on, builds the next prompts. That work delays the next step as surely as
the engine's own (``host_s``), and under arrivals it grows with the requests added, so the trace
measures it: each model step records the driver's time since the previous ``step`` call
returned, the waits for a later input excluded (a driver announces one with
``EngineCore.waiting``; the count restarts at the first input after it).
"""

from __future__ import annotations

from collections.abc import Callable


class OutsideTime:
    """Seconds on ``clock`` spent outside the core since the last model step took them."""

    def __init__(self, clock: Callable[[], float]) -> None:
        self.clock = clock
        self._since: float | None = None  # None: not counting (before any input, or waiting)
        self._pending = 0.0

    def left(self) -> None:
        """The core handed control back to the driver (``step`` returned)."""
        self._since = self.clock()

    def entered(self) -> None:
        """The driver called into the core for a step: count the time since it left."""
        if self._since is not None:
            self._pending += self.clock() - self._since
            self._since = None

    def waiting(self) -> None:
        """The driver is about to wait for a later input: stop counting until one comes."""
        self.entered()

    def input(self) -> None:
        """An input (an add or an abort) arrived: count from its start if nothing counts."""
        if self._since is None:
            self._since = self.clock()

    def take(self) -> float:
        """The time counted since the last call (for the model step being recorded)."""
        value, self._pending = self._pending, 0.0
        return value
