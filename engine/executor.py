"""The executor interface, and the null executor that needs no model."""

from __future__ import annotations

from typing import Any, Protocol

import numpy as np

from engine.batch import ScheduledBatch, StepOutput


class PendingStep(Protocol):
    """A launched step: its output once the device is done."""

    def launched_output(self) -> StepOutput:
        """What is known at launch (padded batch size, graph use); no tokens yet."""
        ...

    def result(self) -> StepOutput:
        """Wait for the step; its tokens and measurements (``wait_s``: time spent waiting)."""
        ...

    def launch_wait_s(self) -> float:
        """Seconds ``launch`` itself spent waiting for the device: a step computed synchronously
        waited there for its tokens (its ``wait_s``); a step in flight waits in ``result``."""
        ...


class Executor(Protocol):
    """Runs one scheduled batch and returns the sampled tokens (the real model, a trace, a sim).

    An executor with ``supports_overlap = True`` also has ``launch(batch, previous)``: start the
    step and return a :class:`PendingStep` without waiting. A sequence whose last token is
    ``PENDING_TOKEN`` takes its input from ``previous`` (the step launched just before, not yet
    resolved), where that token is being sampled.
    """

    num_kvcache_blocks: int

    def execute(self, batch: ScheduledBatch) -> StepOutput: ...

    def describe(self) -> dict[str, Any]: ...

    def close(self) -> None: ...


class DoneStep:
    """A step whose output exists at launch (executors that compute synchronously).

    ``seq_ids``: the sampled sequences, in output order (what a next step's pending input
    tokens are looked up by).
    """

    def __init__(self, output: StepOutput, seq_ids: list[int] | None = None) -> None:
        self.output = output
        self.seq_ids = seq_ids

    def launched_output(self) -> StepOutput:
        return self.output

    def result(self) -> StepOutput:
        return self.output

    def launch_wait_s(self) -> float:
        return self.output.wait_s


class NullExecutor:
    """Tokens from a seeded RNG, no model: measures the scheduler alone and drives tests.

    ``overlap``: accept ``launch`` (the tokens are drawn at launch), so EngineCore runs its
    overlapped path; the tokens, and so every decision, are the same either way.
    """

    def __init__(
        self,
        num_kvcache_blocks: int,
        vocab_size: int = 151936,
        seed: int = 0,
        overlap: bool = False,
    ) -> None:
        self.num_kvcache_blocks = num_kvcache_blocks
        self.vocab_size = vocab_size
        self.supports_overlap = overlap
        self._rng = np.random.default_rng(seed)

    def execute(self, batch: ScheduledBatch) -> StepOutput:
        num_sampled = len(batch.sampled_seqs)
        tokens = self._rng.integers(0, self.vocab_size, size=num_sampled).tolist()
        return StepOutput(token_ids=tokens, duration_s=0.0, padded_batch_size=len(batch.seqs))

    def launch(self, batch: ScheduledBatch, previous: PendingStep | None = None) -> DoneStep:
        return DoneStep(self.execute(batch), [seq.seq_id for seq in batch.sampled_seqs])

    def describe(self) -> dict[str, Any]:
        return {"executor": "null", "device": "none", "vocab_size": self.vocab_size}

    def close(self) -> None:
        pass
