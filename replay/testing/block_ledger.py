"""The invariant checker's shadow of the KV pool: refcounts, contents, the free list in its
eviction order, rebuilt from block events alone."""

from __future__ import annotations

import heapq
from collections.abc import Callable
from typing import Any

from engine.policy import FreeBlock
from tracing.schema import NO_HASH


class BlockLedger:
    """Every block's holders count, hash and last use; the free blocks and, where the eviction
    order is known (``order``), which one a fresh allocation must take."""

    def __init__(self, num_blocks: int, order: Callable[[FreeBlock], Any] | None) -> None:
        self.refs = [0] * num_blocks
        self.block_hash = [NO_HASH] * num_blocks
        self.last_used = [-1] * num_blocks
        self.order = order
        self.free: dict[int, int] = {}  # block -> release stamp
        # (eviction key, stamp, block) per release; stale once the block's stamp changes.
        self.heap: list[tuple[Any, int, int]] = []
        self.releases = 0
        for block in range(num_blocks):
            self._to_free_list(block)

    def _to_free_list(self, block: int) -> None:
        stamp = self.releases
        self.releases += 1
        self.free[block] = stamp
        if self.order is not None:
            info = FreeBlock(block, stamp, self.last_used[block], self.block_hash[block] != NO_HASH)
            heapq.heappush(self.heap, (self.order(info), stamp, block))

    def next_evicted(self) -> int | None:
        """The free block the eviction order ranks first (None: order unknown or none free)."""
        heap = self.heap
        while heap and self.free.get(heap[0][2]) != heap[0][1]:
            heapq.heappop(heap)
        return heap[0][2] if heap else None

    def take(self, block: int) -> None:
        """A holder takes ``block`` (fresh or a hit)."""
        self.free.pop(block, None)
        self.refs[block] += 1

    def release(self, block: int, last_scheduled: int) -> None:
        """A holder last scheduled at step ``last_scheduled`` lets ``block`` go."""
        self.refs[block] -= 1
        self.last_used[block] = max(self.last_used[block], last_scheduled)
        if self.refs[block] == 0 and block not in self.free:
            self._to_free_list(block)
