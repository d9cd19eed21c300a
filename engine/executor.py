"""The executor interface, and the null executor that needs no model."""

from __future__ import annotations

from typing import Any, Protocol

import numpy as np

from engine.batch import ScheduledBatch, StepOutput


class Executor(Protocol):
    """Runs one scheduled batch and returns the sampled tokens (the real model, a trace, a sim)."""

    num_kvcache_blocks: int

    def execute(self, batch: ScheduledBatch) -> StepOutput: ...

    def describe(self) -> dict[str, Any]: ...

    def close(self) -> None: ...


class NullExecutor:
    """Tokens from a seeded RNG, no model: measures the scheduler alone and drives tests."""

    def __init__(self, num_kvcache_blocks: int, vocab_size: int = 151936, seed: int = 0) -> None:
        self.num_kvcache_blocks = num_kvcache_blocks
        self.vocab_size = vocab_size
        self._rng = np.random.default_rng(seed)

    def execute(self, batch: ScheduledBatch) -> StepOutput:
        num_sampled = len(batch.sampled_seqs)
        tokens = self._rng.integers(0, self.vocab_size, size=num_sampled).tolist()
        return StepOutput(token_ids=tokens, duration_s=0.0, padded_batch_size=len(batch.seqs))

    def describe(self) -> dict[str, Any]:
        return {"executor": "null", "device": "none", "vocab_size": self.vocab_size}

    def close(self) -> None:
        pass
