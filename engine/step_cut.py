"""The step an exception cut short: ``KeyboardInterrupt`` (Ctrl-C), an executor's error.

``EngineCore.step`` marks the steps it is taking (``step``: the first of them, an overlapped step
still in flight included), moves the mark past each step whose events are final (``whole``,
before the sink sees them: a sink never holds more than the mark keeps) and clears it when it
returns; an exception leaves it set. Those
steps' events are not whole steps (a ``model_step`` without its tokens, half a batch's block
allocations, placeholder token values), so ``rollback`` takes their buffered rows out of the
event buffer and sets its step counter back: a close then commits whole steps only, and the
trace ends incomplete, through the last whole step (``EngineCore.close``). The engine takes no
step after a cut one (its scheduler stopped mid-decision): ``refuse`` says so.
"""

from __future__ import annotations

from engine.errors import EngineClosedError
from tracing.events import EventBuffer


class StepCut:
    """The mark of the steps being taken; still set after ``step`` raised."""

    __slots__ = ("step",)

    def __init__(self) -> None:
        self.step: int | None = None

    def whole(self, step: int) -> None:
        """``step`` is over, its events final (the sink is yet to see them): keep them."""
        if self.step is not None:
            self.step = step + 1

    def refuse(self) -> None:
        raise EngineClosedError(f"step {self.step} was cut short by an exception: this engine "
                                "cannot go on; close() it (its trace ends with the last whole "
                                "step) and start a new LLM")

    def rollback(self, events: EventBuffer) -> bool:
        """Drop the buffered rows of the cut steps and set the step counter back to the first of
        them; False (nothing done) when no step was cut."""
        step, self.step = self.step, None
        if step is None:
            return False
        for cols in events.tables.values():
            steps = cols["step"]
            keep = len(steps)
            while keep and steps[keep - 1] >= step:  # rows are in emission order
                keep -= 1
            for values in cols.values():
                del values[keep:]
        events.step = step
        return True
