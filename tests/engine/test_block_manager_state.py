"""Stateful Hypothesis test of the BlockManager (the KV-block pool and the prefix cache).

A ``RuleBasedStateMachine`` drives one BlockManager the way the Scheduler does: sequences are
admitted (``allocate`` then ``register_full_blocks``, whole prompt or a first chunk), their prefill
continues chunk by chunk, they decode (the sampled token is appended as
``Scheduler.postprocess`` does, then ``may_append`` makes room for it), they are
preempted (``deallocate``) and re-admitted later with their grown token list, and they finish.
Prompts copy prefixes of earlier sequences (live, preempted or finished) over a 4-token alphabet,
so prefix-cache hits are common, including hits on blocks that were freed but still hold their
hash.

After every rule the invariants of ``_check_*`` hold (each is named in the failure message so the
mutation check can say which invariant caught a mutant):

- ``accounting``: free + used = total; walking the free list gives exactly the free count, no
  duplicates.
- ``refcounts``: every refcount >= 0 and equals the number of live block tables holding the block
  (counted with multiplicity); no table holds a block twice.
- ``free_iff_unreferenced``: a block is on the free list exactly when its refcount is 0.
- ``hash_index``: the hash map points only at full blocks whose stored tokens and parent hash
  recompute (``chain_hash``) to the key, and whose whole token prefix, as registered, chains to it.
- ``copies``: without ``keep_duplicates`` none are kept; with it every block holding a hash is the
  index's block or one of its copies, once, and the holders of each hash, in order, equal the
  model's.
- ``block_tables``: a live sequence's table has ceil(len / block_size) entries; its cached tokens
  are a multiple of the block size and less than its length.
- ``live_hashes``: exactly the first ``num_hashed_blocks`` blocks of a live table are hashed, each
  with the hash chain of the sequence's own tokens and storing its own tokens.
- ``sharing``: two sequences share a block only at the same logical index and only if their token
  prefixes up to and including that block are equal; a shared block is always a full hashed one.
- ``preempted``: a deallocated sequence holds no blocks and no cached, computed or hashed tokens.
- ``model``: block tables, cache hits, the free-list order (oldest free block first, releases
  appended last block first) and the hash map equal those of a small reference model.

Inside the rules, the answer of ``can_allocate`` is compared with the model's (``can_allocate``)
and ``deallocate`` must return the number of blocks the sequence held (``deallocate``).

``DuplicatesMachine`` reruns it with ``keep_duplicates`` (``Config.prefix_cache_duplicates``):
every block holding a hash stays in the cache, the index's block first and its copies after, in
the order they entered; a hit takes the first copy in use, else the free one released last, and
the hash leaves the cache with its last copy (``copies``: every hashed block is the index's or a
copy, each once, and a hash held by a block in use is always cached).

``CollidingHashMachine`` reruns the machine with a deliberately weak hash (5 values), so that
different blocks collide in the index: it proves that a hit is taken only on a block storing the
very tokens requested (the token-equality check), the one defence the engine has against
collisions (``CollidingDuplicatesMachine``: among the copies too). Prefix-equality of shared
blocks (``sharing``), their parents and a table never holding a block twice rely on the 64-bit
hash being collision-free (under collisions the engine may serve block i and block j of one
prompt from one block with the same tokens), so that variant checks contents instead.
"""

from __future__ import annotations

import hypothesis.strategies as st
import numpy as np
import xxhash
from hypothesis import event, given
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    invariant,
    precondition,
    rule,
)

import engine.block_manager as bm_module
from engine.block_manager import BlockManager
from engine.sampling_params import SamplingParams
from engine.sequence import Sequence
from tracing.events import EventBuffer
from tracing.schema import NO_HASH

BM_TOKENS = st.integers(0, 3)
PARAMS = SamplingParams(temperature=0.0, max_tokens=1000, ignore_eos=True)


def ceil_div(a: int, b: int) -> int:
    return -(-a // b)


def expect(ok: bool, name: str, message: str) -> None:
    """A check made inside a rule (an answer of the BlockManager), reported like an invariant."""
    if not ok:
        raise AssertionError(f"invariants violated: {name}\n  {name}: {message}")


def weak_chain_hash(token_ids: list[int], parent_hash: int, seed: int) -> int:
    """A hash with 5 values: blocks of different contents and prefixes collide all the time."""
    return (parent_hash * 3 + sum(token_ids) + seed) % 5


class BlockManagerMachine(RuleBasedStateMachine):
    """Drives a BlockManager and checks its state against the invariants and a reference model."""

    #: Replace ``engine.block_manager.chain_hash`` for this machine (None: the real xxhash64).
    hash_override = None
    #: Whether the invariants may assume the block hash never collides (true of xxhash64 here).
    collision_free = True
    #: ``BlockManager(keep_duplicates=...)``: every block holding a hash serves it.
    keep_duplicates = False

    def __init__(self) -> None:
        super().__init__()
        self.bm: BlockManager | None = None
        self._saved_hash = bm_module.chain_hash
        if self.hash_override is not None:
            bm_module.chain_hash = type(self).hash_override

    def teardown(self) -> None:
        bm_module.chain_hash = self._saved_hash

    # --- the reference model ----------------------------------------------------------------------
    def chain(self, tokens: list[int], num_blocks: int) -> list[int]:
        """Hashes of the first ``num_blocks`` full blocks of ``tokens``, chained from NO_HASH."""
        hashes, parent, bs = [], NO_HASH, self.block_size
        for i in range(num_blocks):
            parent = bm_module.chain_hash(tokens[i * bs : (i + 1) * bs], parent, self.hash_seed)
            hashes.append(parent)
        return hashes

    def model_allocation(self, tokens: list[int]) -> tuple[list[int], int]:
        """The block table ``allocate`` must build for ``tokens`` and its number of cache hits."""
        bs = self.block_size
        num_full = len(tokens) // bs
        max_hits = num_full if num_full * bs < len(tokens) else num_full - 1
        hits: list[int] = []
        for i, h in enumerate(self.chain(tokens, max_hits)):
            chunk = tokens[i * bs : (i + 1) * bs]
            block_id = self.serving(h, chunk, hits) if self.keep_duplicates else self.index.get(h)
            if block_id is None or self.contents[block_id][2] != chunk:
                break
            hits.append(block_id)
        fresh_needed = ceil_div(len(tokens), bs) - len(hits)
        fresh = [b for b in self.free_order if b not in hits][:fresh_needed]
        return hits + fresh, len(hits)

    def serving(self, h: int, chunk: list[int], taken: list[int]) -> int | None:
        """With duplicates kept: the copy of ``h`` holding ``chunk`` that a hit takes (the first
        in use, else the free one released last), ``taken``: blocks this admission already hit."""
        copies = [b for b in self.holders.get(h, []) if self.contents[b][2] == chunk]
        live = [b for b in copies if self.refs[b] > 0 or b in taken]
        if live:
            return live[0]
        return max(copies, key=self.free_order.index, default=None)

    def model_take(self, block_id: int, fresh: bool) -> None:
        if block_id in self.free_order:
            self.free_order.remove(block_id)
        if fresh and block_id in self.contents:
            h = self.contents.pop(block_id)[0]
            self.registered_prefix.pop(block_id, None)
            if self.keep_duplicates:
                self.holders[h].remove(block_id)
                if not self.holders[h]:
                    del self.holders[h], self.index[h]
                else:
                    self.index[h] = self.holders[h][0]
            elif self.index.get(h) == block_id:
                del self.index[h]

    def model_register(self, seq: Sequence, upto_tokens: int) -> None:
        bs = self.block_size
        table = self.tables[seq.seq_id]
        first = self.hashed[seq.seq_id]
        last = min(upto_tokens, seq.num_tokens) // bs
        hashes = self.chain(seq.token_ids, last)
        for i in range(first, last):
            parent = hashes[i - 1] if i else NO_HASH
            block_id = table[i]
            self.contents[block_id] = (hashes[i], parent, seq.token_ids[i * bs : (i + 1) * bs])
            self.registered_prefix[block_id] = list(seq.token_ids[: (i + 1) * bs])
            tokens = seq.token_ids[i * bs : (i + 1) * bs]
            if self.keep_duplicates:  # a copy after the others; the index keeps the first
                self.holders.setdefault(hashes[i], []).append(block_id)
                self.index[hashes[i]] = self.holders[hashes[i]][0]
                continue
            existing = self.index.get(hashes[i])
            # A live block already holding these tokens keeps the index entry.
            if (
                existing is None
                or self.refs[existing] == 0
                or self.contents[existing][2] != tokens
            ):
                self.index[hashes[i]] = block_id
        self.hashed[seq.seq_id] = max(first, last)

    def model_release(self, seq_id: int) -> None:
        table = self.tables.pop(seq_id)
        for block_id in reversed(table):
            self.refs[block_id] -= 1
            if self.refs[block_id] == 0:
                self.free_order.append(block_id)
        del self.hashed[seq_id]
        del self.computed[seq_id]
        del self.cached[seq_id]

    # --- setup ------------------------------------------------------------------------------------
    @initialize(
        num_blocks=st.integers(1, 12),
        block_size=st.sampled_from([1, 2, 3, 4]),
        hash_seed=st.one_of(st.just(0), st.integers(0, 2**64 - 1)),
    )
    def setup(self, num_blocks: int, block_size: int, hash_seed: int) -> None:
        self.block_size = block_size
        self.hash_seed = hash_seed
        self.events = EventBuffer()
        self.bm = BlockManager(
            num_blocks, block_size, self.events, hash_seed=hash_seed, enable_prefix_caching=True,
            keep_duplicates=self.keep_duplicates,
        )
        self.num_blocks = num_blocks
        self.live: dict[int, Sequence] = {}
        self.parked: dict[int, Sequence] = {}
        self.history: list[list[int]] = []
        self.next_id = 0
        # Model state.
        self.free_order: list[int] = list(range(num_blocks))
        self.refs: list[int] = [0] * num_blocks
        self.tables: dict[int, list[int]] = {}
        self.index: dict[int, int] = {}
        self.holders: dict[int, list[int]] = {}  # with duplicates kept: hash -> its blocks
        self.contents: dict[int, tuple[int, int, list[int]]] = {}
        self.registered_prefix: dict[int, list[int]] = {}
        self.hashed: dict[int, int] = {}
        self.computed: dict[int, int] = {}
        self.cached: dict[int, int] = {}

    # --- rules ------------------------------------------------------------------------------------
    def _admit(self, seq: Sequence, data: st.DataObject) -> bool:
        """allocate + register the first chunk, as the scheduler admits a sequence."""
        bm = self.bm
        fits = len(self.free_order) >= ceil_div(seq.num_tokens, self.block_size)
        expect(
            bm.can_allocate(seq) == fits,
            "can_allocate",
            f"{seq.num_tokens} tokens with {len(self.free_order)} free blocks should be {fits}",
        )
        if not fits:
            event("allocation refused: pool too small")
            return False
        expected_table, hits = self.model_allocation(seq.token_ids)
        if hits:
            event("prefix-cache hit")
            if any(self.refs[b] == 0 for b in expected_table[:hits]):
                event("prefix-cache hit on a freed, still cached block")
        bm.allocate(seq)
        for i, block_id in enumerate(expected_table):
            self.model_take(block_id, fresh=i >= hits)
            self.refs[block_id] += 1
        self.tables[seq.seq_id] = list(expected_table)
        self.hashed[seq.seq_id] = hits
        self.cached[seq.seq_id] = hits * self.block_size
        # The model's first chunk starts after the model's hits (the engine's are checked by the
        # invariants: ``model`` and ``block_tables``).
        remaining = seq.num_tokens - self.cached[seq.seq_id]
        chunk = data.draw(st.one_of(st.just(remaining), st.integers(1, remaining)), label="chunk")
        self.computed[seq.seq_id] = self.cached[seq.seq_id] + chunk
        bm.register_full_blocks(seq, self.computed[seq.seq_id])
        self.model_register(seq, self.computed[seq.seq_id])
        self.live[seq.seq_id] = seq
        return True

    @precondition(lambda self: self.bm is not None)
    @rule(data=st.data())
    def admit_new(self, data: st.DataObject) -> None:
        """Admit a new prompt that copies a prefix of an earlier sequence (or of nothing)."""
        cap = (self.num_blocks + 1) * self.block_size
        length = data.draw(st.integers(1, cap), label="length")
        source: list[int] = []
        if self.history:
            source = data.draw(st.sampled_from(self.history), label="source")
        shared = data.draw(st.integers(0, min(length, len(source))), label="shared")
        fill = data.draw(st.lists(BM_TOKENS, min_size=length - shared, max_size=length - shared))
        seq = Sequence(self.next_id, source[:shared] + fill, PARAMS)
        self.next_id += 1
        if self._admit(seq, data):
            self.history.append(list(seq.token_ids))

    @precondition(lambda self: any(self.computed[s] < q.num_tokens for s, q in self.live.items()))
    @rule(data=st.data())
    def continue_prefill(self, data: st.DataObject) -> None:
        """Register the next prefill chunk of a sequence admitted with a partial chunk."""
        candidates = [s for s, q in self.live.items() if self.computed[s] < q.num_tokens]
        seq = self.live[data.draw(st.sampled_from(candidates), label="seq")]
        remaining = seq.num_tokens - self.computed[seq.seq_id]
        chunk = data.draw(st.integers(1, remaining), label="chunk")
        self.computed[seq.seq_id] += chunk
        self.bm.register_full_blocks(seq, self.computed[seq.seq_id])
        self.model_register(seq, self.computed[seq.seq_id])

    @precondition(lambda self: any(self.computed[s] == q.num_tokens for s, q in self.live.items()))
    @rule(data=st.data(), token=BM_TOKENS)
    def decode(self, data: st.DataObject, token: int) -> None:
        """Append a sampled token (``Sequence.append_token``, as ``Scheduler.postprocess``
        does), then make room for it (``may_append``).

        Without room (the token starts a block and no block is free) the sequence is preempted,
        as the scheduler does when no victim is left.
        """
        candidates = [s for s, q in self.live.items() if self.computed[s] == q.num_tokens]
        seq = self.live[data.draw(st.sampled_from(candidates), label="seq")]
        seq.append_token(token)
        table = self.tables[seq.seq_id]
        needs_block = seq.num_tokens > len(table) * self.block_size
        room = bool(self.free_order) or not needs_block
        if not room:
            event("decode without room: preempted")
            self._preempt(seq)
            return
        self.bm.may_append(seq)
        if needs_block:
            event("decode takes a new block")
            block_id = self.free_order[0]
            self.model_take(block_id, fresh=True)
            self.refs[block_id] += 1
            table.append(block_id)
        self.computed[seq.seq_id] = seq.num_tokens
        if seq.num_tokens % self.block_size == 0:
            self.model_register(seq, seq.num_tokens)

    def _preempt(self, seq: Sequence) -> None:
        held = len(seq.block_table)
        released = self.bm.deallocate(seq)
        expect(released == held, "deallocate", f"returned {released}, the table had {held}")
        self.model_release(seq.seq_id)
        del self.live[seq.seq_id]
        self.parked[seq.seq_id] = seq
        self.history.append(list(seq.token_ids))

    @precondition(lambda self: bool(self.live))
    @rule(data=st.data())
    def preempt(self, data: st.DataObject) -> None:
        """Preempt a live sequence: deallocate it and park it for re-admission."""
        seq_id = data.draw(st.sampled_from(sorted(self.live)), label="seq")
        self._preempt(self.live[seq_id])

    @precondition(lambda self: bool(self.parked))
    @rule(data=st.data())
    def readmit(self, data: st.DataObject) -> None:
        """Re-admit a preempted sequence with its grown token list (recompute, cache hits)."""
        seq_id = data.draw(st.sampled_from(sorted(self.parked)), label="seq")
        seq = self.parked[seq_id]
        if self._admit(seq, data):
            del self.parked[seq_id]

    @precondition(lambda self: bool(self.live))
    @rule(data=st.data())
    def finish(self, data: st.DataObject) -> None:
        """A sequence finishes: all its references are dropped; its full blocks stay cached."""
        seq_id = data.draw(st.sampled_from(sorted(self.live)), label="seq")
        seq = self.live.pop(seq_id)
        held = len(seq.block_table)
        released = self.bm.deallocate(seq)
        expect(released == held, "deallocate", f"returned {released}, the table had {held}")
        self.model_release(seq_id)
        self.history.append(list(seq.token_ids))

    @precondition(lambda self: bool(self.parked))
    @rule(data=st.data())
    def abort_parked(self, data: st.DataObject) -> None:
        """A preempted sequence is aborted while waiting: it holds nothing, nothing changes."""
        del self.parked[data.draw(st.sampled_from(sorted(self.parked)), label="seq")]

    # --- invariants -------------------------------------------------------------------------------
    def _check_accounting(self) -> None:
        bm = self.bm
        walked = list(bm.free_block_ids)
        assert len(walked) == len(set(walked)), "the free list holds a block twice"
        used = sum(1 for b in bm.blocks if b.ref_count > 0)
        assert len(walked) + used == bm.num_blocks == len(bm.blocks), (
            f"free {len(walked)} + used {used} != total {bm.num_blocks}"
        )

    def _check_refcounts(self) -> None:
        holders = [0] * self.num_blocks
        for seq in self.live.values():
            table = seq.block_table
            if self.collision_free:
                assert len(set(table)) == len(table), f"seq {seq.seq_id} holds a block twice"
            for block_id in table:
                holders[block_id] += 1
        for block in self.bm.blocks:
            assert block.ref_count >= 0, f"{block} has a negative refcount"
            assert block.ref_count == holders[block.block_id], (
                f"{block}: refcount {block.ref_count}, held by {holders[block.block_id]} tables"
            )

    def _check_free_iff_unreferenced(self) -> None:
        free = set(self.bm.free_block_ids)
        for block in self.bm.blocks:
            assert (block.block_id in free) == (block.ref_count == 0), (
                f"{block}: on free list {block.block_id in free}, refcount {block.ref_count}"
            )

    def _check_hash_index(self) -> None:
        bs, seed = self.block_size, self.hash_seed
        for h, block_id in self.bm.hash_to_block_id.items():
            block = self.bm.blocks[block_id]
            assert block.hash == h, f"index {h} -> {block} with another hash"
            assert len(block.token_ids) == bs, f"index {h} -> {block} that is not full"
            assert bm_module.chain_hash(block.token_ids, block.parent_hash, seed) == h, (
                f"{block}: tokens {block.token_ids} + parent {block.parent_hash} do not hash to {h}"
            )
            prefix = self.registered_prefix.get(block_id)
            assert prefix is not None, f"index {h} -> {block}, which was never registered"
            assert prefix[-bs:] == block.token_ids, f"{block} stores other tokens than registered"
            assert self.chain(prefix, len(prefix) // bs)[-1] == h, (
                f"{block}: the registered prefix {prefix} does not chain to {h}"
            )

    def _check_copies(self) -> None:
        bm = self.bm
        assert self.keep_duplicates or not bm.copies.by_hash, "copies kept without the setting"
        if not self.keep_duplicates:
            return
        holders: dict[int, list[int]] = {}
        for h, block_id in bm.hash_to_block_id.items():
            holders[h] = [block_id, *bm.copies.by_hash.get(h, [])]
        assert set(bm.copies.by_hash) <= set(holders), "copies of a hash the index lacks"
        for h, ids in holders.items():
            assert len(set(ids)) == len(ids), f"hash {h}: a block listed twice in {ids}"
            for block_id in ids:
                block = bm.blocks[block_id]
                assert block.hash == h, f"hash {h}: {block} holds another"
        listed = {b for ids in holders.values() for b in ids}
        for block in bm.blocks:
            assert block.hash == NO_HASH or block.block_id in listed, (
                f"{block} holds a hash but is neither indexed nor a copy"
            )
        assert holders == self.holders, f"holders {holders}, model {self.holders}"

    def _check_block_tables(self) -> None:
        bs = self.block_size
        for seq in self.live.values():
            assert len(seq.block_table) == ceil_div(seq.num_tokens, bs), (
                f"seq {seq.seq_id}: {seq.num_tokens} tokens in {len(seq.block_table)} blocks "
                f"of {bs}"
            )
            assert seq.num_cached_tokens % bs == 0, f"seq {seq.seq_id}: cached not block-aligned"
            assert 0 <= seq.num_cached_tokens < seq.num_tokens, (
                f"seq {seq.seq_id}: {seq.num_cached_tokens} cached of {seq.num_tokens} tokens"
            )

    def _check_live_hashes(self) -> None:
        bs = self.block_size
        for seq in self.live.values():
            hashed = seq.num_hashed_blocks
            assert hashed == self.hashed[seq.seq_id], (
                f"seq {seq.seq_id}: {hashed} hashed blocks, expected {self.hashed[seq.seq_id]}"
            )
            chain = self.chain(seq.token_ids, hashed)
            for i, block_id in enumerate(seq.block_table):
                block = self.bm.blocks[block_id]
                if i >= hashed:
                    assert block.hash == NO_HASH and not block.token_ids, (
                        f"seq {seq.seq_id} block {i} ({block}) is not computed yet but is hashed"
                    )
                    continue
                assert block.hash == chain[i], (
                    f"seq {seq.seq_id} block {i}: {block} is not the chain hash {chain[i]}"
                )
                assert block.token_ids == seq.token_ids[i * bs : (i + 1) * bs], (
                    f"seq {seq.seq_id} block {i}: {block} stores {block.token_ids}"
                )
                if self.collision_free:
                    parent = chain[i - 1] if i else NO_HASH
                    assert block.parent_hash == parent, f"{block}: parent hash is not {parent}"

    def _check_sharing(self) -> None:
        bs = self.block_size
        where: dict[int, list[tuple[Sequence, int]]] = {}
        for seq in self.live.values():
            for i, block_id in enumerate(seq.block_table):
                where.setdefault(block_id, []).append((seq, i))
        for block_id, users in where.items():
            if len(users) < 2:
                continue
            block = self.bm.blocks[block_id]
            assert block.hash != NO_HASH and len(block.token_ids) == bs, (
                f"{block} is shared by {[s.seq_id for s, _ in users]} but is not a full "
                "hashed block"
            )
            if not self.collision_free:
                continue
            (first, i0), *others = users
            for seq, i in others:
                assert i == i0, f"{block} is block {i0} of seq {first.seq_id}, {i} of {seq.seq_id}"
                end = (i + 1) * bs
                assert seq.token_ids[:end] == first.token_ids[:end], (
                    f"seqs {first.seq_id} and {seq.seq_id} share {block} with different prefixes"
                )

    def _check_preempted(self) -> None:
        for seq in self.parked.values():
            assert not seq.block_table, f"preempted seq {seq.seq_id} holds {seq.block_table}"
            assert (seq.num_cached_tokens, seq.num_computed_tokens, seq.num_hashed_blocks) == (
                0,
                0,
                0,
            ), f"preempted seq {seq.seq_id} keeps progress: {seq!r} cached={seq.num_cached_tokens}"

    def _check_model(self) -> None:
        for seq in self.live.values():
            assert seq.block_table == self.tables[seq.seq_id], (
                f"seq {seq.seq_id}: table {seq.block_table}, model {self.tables[seq.seq_id]}"
            )
            assert seq.num_cached_tokens == self.cached[seq.seq_id], (
                f"seq {seq.seq_id}: {seq.num_cached_tokens} tokens served from cache, model "
                f"{self.cached[seq.seq_id]}"
            )
        assert list(self.bm.free_block_ids) == self.free_order, (
            f"free list order {list(self.bm.free_block_ids)}, model {self.free_order}"
        )
        assert self.bm.hash_to_block_id == self.index, (
            f"hash index {self.bm.hash_to_block_id}, model {self.index}"
        )

    CHECKS = (
        "accounting",
        "refcounts",
        "free_iff_unreferenced",
        "hash_index",
        "copies",
        "block_tables",
        "live_hashes",
        "sharing",
        "preempted",
        "model",
    )

    @invariant()
    def invariants_hold(self) -> None:
        if self.bm is None:
            return
        failed = []
        for name in self.CHECKS:
            try:
                getattr(self, f"_check_{name}")()
            except AssertionError as exc:
                failed.append((name, str(exc)))
            except Exception as exc:  # a state so broken that the check itself cannot run
                failed.append((name, f"{type(exc).__name__}: {exc}"))
        if failed:
            detail = "\n".join(f"  {name}: {msg}" for name, msg in failed)
            raise AssertionError(
                f"invariants violated: {', '.join(n for n, _ in failed)}\n{detail}"
            )


class CollidingHashMachine(BlockManagerMachine):
    """The same machine with a 5-valued block hash: the index is full of collisions."""

    hash_override = staticmethod(weak_chain_hash)
    collision_free = False


class DuplicatesMachine(BlockManagerMachine):
    """The same machine with every block holding a hash kept in the cache."""

    keep_duplicates = True


class CollidingDuplicatesMachine(CollidingHashMachine):
    """Duplicates kept, under the 5-valued hash: a hit picks among copies of other tokens."""

    keep_duplicates = True


TestBlockManagerStateMachine = BlockManagerMachine.TestCase
TestBlockManagerWithHashCollisions = CollidingHashMachine.TestCase
TestBlockManagerKeepingDuplicates = DuplicatesMachine.TestCase
TestBlockManagerKeepingDuplicatesWithCollisions = CollidingDuplicatesMachine.TestCase


@given(
    tokens=st.lists(st.integers(0, 2**31 - 1), min_size=1, max_size=16),
    parent=st.one_of(st.just(NO_HASH), st.integers(-(2**63), 2**63 - 1)),
    seed=st.integers(0, 2**64 - 1),
)
def test_chain_hash_is_the_documented_xxhash64(tokens: list[int], parent: int, seed: int) -> None:
    """``chain_hash`` is xxhash64(seed) over (the parent hash as 8 little-endian bytes, unless
    NO_HASH, then the token ids as int32), as a signed 64-bit integer: the trace format's
    definition, computed here independently, so a hash that ignores the parent or the seed cannot
    pass."""
    h = xxhash.xxh64(seed=seed)
    if parent != NO_HASH:
        h.update(parent.to_bytes(8, "little", signed=True))
    h.update(np.asarray(tokens, dtype=np.int32).tobytes())
    expected = h.intdigest()
    expected = expected - (1 << 64) if expected >= 1 << 63 else expected
    assert bm_module.chain_hash(tokens, parent, seed) == expected


def test_live_hashed_block_stays_findable_after_its_duplicate_is_evicted() -> None:
    """While a sequence holds a full hashed block, a new prompt with the same first block hits it,
    even after another copy of that block (made by a prompt that recomputes its last block) was
    registered, freed and handed out again."""
    bm = BlockManager(6, 2, EventBuffer())
    params = SamplingParams(temperature=0.0, max_tokens=4)

    def admit(seq_id: int, tokens: list[int]) -> Sequence:
        seq = Sequence(seq_id, tokens, params)
        bm.allocate(seq)
        bm.register_full_blocks(seq, seq.num_tokens)
        return seq

    a = admit(0, [1, 2, 7])  # block 0 holds [1, 2], hashed and indexed
    b = admit(1, [1, 2])  # a one-block prompt recomputes its block: a copy, the index points to it
    bm.deallocate(b)  # the copy is free but still cached
    bm.deallocate(admit(2, [9] * 8))  # takes every free block: the copy is reused, entry deleted
    assert bm.blocks[a.block_table[0]].ref_count == 1  # a still holds the original
    d = admit(3, [1, 2, 5])
    assert d.num_cached_tokens == 2, "the live block [1, 2] of seq 0 was not hit"
