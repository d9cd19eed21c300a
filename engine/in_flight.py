"""A step launched ahead of its tokens (``EngineCore``'s overlapped scheduling)."""

from __future__ import annotations

from dataclasses import dataclass

from engine.batch import ScheduledBatch
from engine.executor import PendingStep
from engine.overlap_scheduler import PendingTokens


@dataclass
class InFlight:
    """A launched step already post-processed with placeholder tokens."""

    batch: ScheduledBatch
    handle: PendingStep
    pending: PendingTokens
    model_row: int | None
    step: int
    launched: float
    host_s: float
