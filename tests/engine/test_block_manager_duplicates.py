"""Duplicate blocks in the prefix cache (``Config.prefix_cache_duplicates``).

Two sequences hold blocks with the same tokens when the second computed them before the first's
were cached, or recomputed its prompt's last block (a prompt always computes a token). Without
the setting (the engine of traces recorded before it) the index keeps one block per hash, and
handing that block out again drops the hash though a copy still holds the tokens: a later prompt
misses a prefix the pool holds. With it every copy serves the hash until the last one goes.
Each case runs at the block manager, then through the scheduler and the tiny CPU model, whose
traces record the setting and verify.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from engine.block_manager import BlockManager
from engine.config import Config
from engine.sampling_params import SamplingParams
from engine.sequence import Sequence
from tracing.events import EventBuffer

PARAMS = SamplingParams(temperature=0.0, max_tokens=4)


class Pool:
    """A block manager of ``num_blocks`` blocks of 2 tokens, admitting whole prompts."""

    def __init__(self, num_blocks: int, keep_duplicates: bool) -> None:
        self.bm = BlockManager(num_blocks, 2, EventBuffer(), keep_duplicates=keep_duplicates)
        self.next_id = 0

    def admit(self, tokens: list[int]) -> Sequence:
        """``allocate`` + ``register_full_blocks`` over the whole prompt, as a prefill does."""
        seq = Sequence(self.next_id, tokens, PARAMS)
        self.next_id += 1
        self.bm.allocate(seq)
        self.bm.register_full_blocks(seq, seq.num_tokens)
        return seq

    def churn(self, blocks: int) -> None:
        """A prompt of ``blocks`` distinct blocks comes and goes: the oldest free blocks are
        handed out fresh (their cached contents forgotten)."""
        self.bm.deallocate(self.admit([1000 + self.next_id * 100 + i for i in range(2 * blocks)]))


@pytest.mark.parametrize("keep", [True, False])
def test_a_live_copy_keeps_the_hash_cached_when_the_indexed_block_is_reused(keep: bool) -> None:
    """a and b hold [1, 2] in two blocks (b recomputed its last block); a finishes and its block
    is handed out again. b still holds [1, 2]: with duplicates kept c hits b's block; with one
    block per hash (the old rule) the hash left with a's block and c misses."""
    pool = Pool(6, keep)
    a = pool.admit([1, 2, 7])
    b = pool.admit([1, 2])  # a one-block prompt recomputes its block: a copy of a's
    first = a.block_table[0]
    assert first != b.block_table[0]
    pool.bm.deallocate(a)
    pool.churn(5)  # every free block, a's [1, 2] among them
    assert pool.bm.blocks[first].hash != pool.bm.blocks[b.block_table[0]].hash
    c = pool.admit([1, 2, 5])
    if keep:
        assert c.num_cached_tokens == 2 and c.block_table[0] == b.block_table[0]
    else:
        assert c.num_cached_tokens == 0


def test_a_free_copy_keeps_the_hash_cached_when_the_indexed_block_is_reused() -> None:
    """Both copies free, released in turn: the index's block goes first, the copy still serves."""
    pool = Pool(6, keep_duplicates=True)
    a = pool.admit([1, 2, 7])
    b = pool.admit([1, 2])
    first, copy = a.block_table[0], b.block_table[0]
    pool.bm.deallocate(a)
    pool.bm.deallocate(b)
    pool.churn(5)  # the three blocks free before a's, then a's two: b's copy is left
    assert pool.bm.blocks[first].hash != pool.bm.blocks[copy].hash
    c = pool.admit([1, 2, 5])
    assert c.num_cached_tokens == 2 and c.block_table[0] == copy


def test_a_hit_takes_a_copy_in_use_before_a_free_one() -> None:
    """a's block indexed [1, 2] first, then a finished (its block free, still cached) while b's
    copy is in use: c's hit shares b's block and leaves a's on the free list (one more block for
    the next admission), where the old rule took a's off it."""
    for keep, taken, free_after in ((True, "copy", 4), (False, "first", 3)):
        pool = Pool(6, keep)
        a = pool.admit([1, 2, 7])
        b = pool.admit([1, 2])
        first = a.block_table[0]
        pool.bm.deallocate(a)
        c = pool.admit([1, 2, 5])
        want = b.block_table[0] if taken == "copy" else first
        assert c.block_table[0] == want and c.num_cached_tokens == 2
        assert len(pool.bm.free_block_ids) == free_after


def test_of_free_copies_a_hit_takes_the_one_released_last() -> None:
    """Three free copies of [1, 2]: the hit takes the last released, so the copies released
    before it (handed out first) go before blocks that hold anything else."""
    pool = Pool(8, keep_duplicates=True)
    seqs = [pool.admit([1, 2, 7]), pool.admit([1, 2]), pool.admit([1, 2])]
    blocks = [s.block_table[0] for s in seqs]
    assert len(set(blocks)) == 3
    for seq in (seqs[2], seqs[0], seqs[1]):  # seqs[1]'s copy released last
        pool.bm.deallocate(seq)
    c = pool.admit([1, 2, 5])
    assert c.block_table[0] == blocks[1]


def _hits_by_request(tables: dict, seq_ids: list[int]) -> list[int]:
    hits = list(tables["block_hit"]["seq_id"])
    return [hits.count(s) for s in seq_ids]


# Two 3-block prompts alike: the second hits the first's first two blocks and recomputes the last
# (a copy). The first finishes at once, four prompts take its blocks, and a last prompt extends
# the shared one while the second still decodes.
SHARED = list(range(1, 13))
PROMPTS = ([SHARED, SHARED] + [[200 + 20 * i + t for t in range(8)] for i in range(4)]
           + [[*SHARED, 99]])
MAX_TOKENS = [1, 12, 1, 1, 1, 1, 1]
SMALL = dict(num_kvcache_blocks=10, kvcache_block_size=4, max_num_seqs=2, max_model_len=64,
             max_num_batched_tokens=256)


@pytest.mark.parametrize("keep", [True, False])
def test_the_scheduler_hits_a_live_copy_and_replays(keep: bool) -> None:
    """Through ``EngineCore`` (null executor): the last prompt hits 3 blocks with duplicates
    kept, 2 under the old rule; each run verifies."""
    from engine.engine_core import EngineCore
    from engine.executor import NullExecutor
    from replay.verify import verify_events
    from tracing.sink import MemorySink

    sink = MemorySink()
    core = EngineCore(Config(**SMALL, prefix_cache_duplicates=keep),
                      NullExecutor(10, vocab_size=1000), sink=sink)
    seqs = [core.add_request(p, SamplingParams(temperature=0.0, max_tokens=m, ignore_eos=True))
            for p, m in zip(PROMPTS, MAX_TOKENS)]
    core.run_until_idle()
    core.close()
    assert sink.header["config"]["prefix_cache_duplicates"] is keep
    hits = _hits_by_request(sink.tables, [s.seq_id for s in seqs])
    assert hits == [0, 2, 0, 0, 0, 0, 3 if keep else 2]
    result = verify_events(sink.header, sink.tables)
    assert result.identical, result.report()


def test_the_tiny_model_records_the_setting_and_a_trace_without_it_replays_the_old_rule(
        tmp_path: Path) -> None:
    """The embedded tiny model on the CPU, greedy: the default keeps duplicates (the last prompt
    hits all 3 blocks) and the header says so; the same trace with the field removed from its
    header (as recorded before it existed) no longer verifies: it replays the old rule."""
    import json

    from engine import LLM
    from replay.verify import verify
    from tracing import read_trace

    trace_dir = tmp_path / "t"
    llm = LLM(None, trace_dir=str(trace_dir), **SMALL)
    try:
        llm.generate(PROMPTS, [SamplingParams(temperature=0.0, max_tokens=m, ignore_eos=True)
                               for m in MAX_TOKENS])
    finally:
        llm.close()
    trace = read_trace(trace_dir)
    assert trace.header["config"]["prefix_cache_duplicates"] is True
    added = trace.columns("request_added")["seq_id"].tolist()
    assert _hits_by_request({"block_hit": trace.columns("block_hit")}, added)[-1] == 3
    assert verify(trace_dir).identical
    header_path = trace_dir / "run.json"
    header = json.loads(header_path.read_text())
    del header["config"]["prefix_cache_duplicates"]
    header_path.write_text(json.dumps(header))
    result = verify(trace_dir)
    assert not result.identical and "block_hit" in result.report()
