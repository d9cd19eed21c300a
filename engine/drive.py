"""The one loop that feeds inputs (arrivals, aborts) into an engine and steps it.

Every driver runs this loop: live (inputs due on the wall clock), replay (due at a recorded
step) and simulate (due on a simulated clock). What differs is only where "now" comes from,
which inputs are due, and what the engine does while it waits for the next one.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol

from engine.engine_core import EngineCore, StepResult


class Inputs(Protocol):
    """The requests and aborts a driver feeds an engine, each due at a point of its clock."""

    def feed(self, core: EngineCore, now: float) -> None:
        """Add and abort, on ``core``, everything due at or before ``now``."""
        ...

    def next_due(self) -> float | None:
        """When the next input not yet fed is due; None: every input has been fed."""
        ...

    def on_result(self, result: StepResult, now: float) -> None:
        """See a completed step (a later input may depend on it: a conversation's next turn)."""
        ...


def drive(
    core: EngineCore,
    inputs: Inputs,
    now: Callable[[], float],
    wait_until: Callable[[float], None],
    on_result: Callable[[StepResult], None] | None = None,
) -> None:
    """Feed ``inputs`` as they fall due on ``now()`` and step ``core`` until both are done.

    When the engine has nothing to do and the next input is not yet due, ``wait_until(due)``
    waits for it (sleeps, moves a simulated clock, or lets the step count through); the core is
    told first (``EngineCore.waiting``), so a step's ``outside_s`` holds the driver's work and
    not its waits. Emits only what ``EngineCore`` emits for each input and step.
    """
    while True:
        inputs.feed(core, now())
        result = core.step()
        if result is not None:
            inputs.on_result(result, now())
            if on_result is not None:
                on_result(result)
            continue
        if core.has_unfinished():  # a step is in flight: its result comes with the next call
            continue
        due = inputs.next_due()
        if due is None:
            return
        core.waiting()  # the wait is not the driver's work (``outside_s``)
        wait_until(due)
