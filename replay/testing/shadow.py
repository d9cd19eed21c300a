"""The invariant checker's shadow of one sequence (``replay.testing.invariants``): what the
engine's ``Sequence`` holds, rebuilt from events alone, with its prefix-hash chain."""

from __future__ import annotations

from dataclasses import dataclass, field

from engine.block_hash import chain_hash
from tracing.schema import NO_HASH


@dataclass
class ShadowSeq:
    """One sequence as the invariant checker's shadow of the engine holds it: its tokens,
    block table, computed count and status, rebuilt from the events alone."""

    seq_id: int
    tokens: list[int]
    prompt_len: int
    max_tokens: int
    ignore_eos: bool
    priority: int
    arrival_step: int
    status: str = "waiting"
    table: list[int] = field(default_factory=list)
    hashed: set[int] = field(default_factory=set)
    computed: int = 0
    released: int = 0  # blocks released since its last preemption or finish
    freed: int = 0  # of those, blocks its release put back on the free list
    sampled: int = 0
    reason: str | None = None  # the finish reason, once finished
    chain: list[int] = field(default_factory=list)

    def block_hash(self, index: int, block_size: int, seed: int) -> int:
        while len(self.chain) <= index:
            i = len(self.chain)
            parent = self.chain[-1] if self.chain else NO_HASH
            self.chain.append(chain_hash(self.tokens[i * block_size : (i + 1) * block_size],
                                         parent, seed))
        return self.chain[index]
