"""Release-order eviction without the heap hands out the blocks the heap would.

What this proves: a ``BlockManager`` on the default ``release_order`` (which takes the first block
of its free list, keeping no heap) makes the same decisions, event for event, as one ranking the
same keys through its eviction heap (a wrapper around ``release_order``, so the fast path is off),
over random admissions with shared prefixes (hits on free and on live blocks), decode growth and
releases in random order.
"""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from engine.block_manager import BlockManager
from engine.config import Config
from engine.policy import Policy, release_order
from engine.sampling_params import SamplingParams
from engine.scheduler import Scheduler
from engine.sequence import Sequence
from tracing.events import EventBuffer

BLOCK_SIZE = 4
NUM_BLOCKS = 24


def _drive(ops: list[tuple[int, int, int]], eviction_key) -> dict:
    """Run ``ops`` (prefix, length, action) on a fresh manager; return its event tables."""
    events = EventBuffer()
    manager = BlockManager(NUM_BLOCKS, BLOCK_SIZE, events, eviction_key=eviction_key)
    live: list[Sequence] = []
    prefixes = [list(range(100 * p, 100 * p + 12)) for p in range(3)]
    for number, (prefix, length, action) in enumerate(ops):
        if action == 0 and live:  # release one (last-admitted first, or the oldest)
            seq = live.pop(-1 if number % 2 else 0)
            manager.deallocate(seq)
        elif action == 1 and live:  # one decode token for the oldest
            seq = live[0]
            seq.append_token(7 + number)
            if manager.blocks_needed(seq.num_tokens) > len(seq.block_table) and \
                    not manager.free_block_ids:
                continue
            manager.may_append(seq)
        else:
            seq = Sequence(number, prefixes[prefix][:length] + [number], SamplingParams())
            if not manager.can_allocate(seq):
                continue
            manager.allocate(seq)
            manager.register_full_blocks(seq, seq.num_tokens)
            live.append(seq)
    return events.tables


@given(st.lists(st.tuples(st.integers(0, 2), st.integers(0, 12), st.integers(0, 3)),
                max_size=80))
def test_release_order_without_the_heap_decides_as_the_heap(ops) -> None:
    fast = _drive(ops, release_order)
    ranked = _drive(ops, lambda block: release_order(block))
    assert fast == ranked


def test_the_fast_path_is_taken_only_for_release_order() -> None:
    events = EventBuffer()
    assert BlockManager(4, 4, events)._fifo
    assert not BlockManager(4, 4, events, eviction_key=lambda b: release_order(b))._fifo


class _OwnEviction(Policy):
    """A policy that ranks free blocks itself (the heap must stay)."""

    def eviction_key(self, block):
        return -block.released


def test_the_scheduler_takes_the_fast_path_only_for_plain_release_order() -> None:
    events = EventBuffer()
    assert Scheduler(Config(num_kvcache_blocks=8), 8, events).block_manager._fifo
    assert not Scheduler(Config(num_kvcache_blocks=8, eviction="lru"), 8,
                         events).block_manager._fifo
    assert _OwnEviction(Config(num_kvcache_blocks=8)).block_eviction_key() != release_order
