"""The KV-block pool: allocation, reference counts and the prefix cache.

A deterministic state machine: free blocks are kept in an insertion-ordered map and handed out
in the order of an eviction key fixed when each is released (by default the release order: the
oldest free block first), block hashes are xxhash64 chains with a fixed seed, and every change is
emitted to the event buffer.
"""

from __future__ import annotations

import heapq
from collections import OrderedDict
from collections.abc import Callable
from itertools import repeat
from typing import Any

from engine.block_hash import TokenIds, chain_hash
from engine.cache_copies import CacheCopies
from engine.policy import FreeBlock, release_order
from engine.sequence import PENDING_TOKEN, Sequence
from tracing.events import EventBuffer
from tracing.schema import NO_HASH


class Block:
    """One physical KV block. ``token_ids`` and ``hash`` are set only once the block is full."""

    __slots__ = ("block_id", "ref_count", "hash", "parent_hash", "token_ids", "last_used")

    def __init__(self, block_id: int) -> None:
        self.block_id = block_id
        self.ref_count = 0
        self.hash = NO_HASH
        self.parent_hash = NO_HASH
        self.token_ids: TokenIds = []  # in its sequence's form (``Sequence.block``)
        self.last_used = -1  # the last step a scheduled holder held it (-1: never)

    def __repr__(self) -> str:
        return f"Block(id={self.block_id}, ref={self.ref_count}, hash={self.hash})"


class BlockManager:
    """Owns ``num_blocks`` blocks of ``block_size`` token slots and the prefix-cache index.

    Public methods in the order a sequence meets them: ``can_allocate`` and ``allocate`` at
    admission, ``register_full_blocks`` as its prompt is computed, ``may_append`` as it decodes,
    ``resolve_pending`` after an overlapped step, ``deallocate`` when it is preempted or finishes.
    """

    def __init__(
        self,
        num_blocks: int,
        block_size: int,
        events: EventBuffer,
        hash_seed: int = 0,
        enable_prefix_caching: bool = True,
        eviction_key: Callable[[FreeBlock], Any] = release_order,
        hold_decode_blocks: bool = False,
        keep_duplicates: bool = False,
    ) -> None:
        self.num_blocks = num_blocks
        self.block_size = block_size
        self.events = events
        self.hash_seed = hash_seed
        self.enable_prefix_caching = enable_prefix_caching
        self.eviction_key = eviction_key
        # A block filled by a decode's token enters the cache at the end of the schedule
        # (``settle_held``), not in ``may_append`` (``Config.overlap_mixed_steps``).
        self.hold_decode_blocks = hold_decode_blocks
        self.blocks = [Block(i) for i in range(num_blocks)]
        self.hash_to_block_id: dict[int, int] = {}
        # Every block holding a cached hash stays in the cache, the index's block and its copies
        # (engine/cache_copies.py, ``Config.prefix_cache_duplicates``); False: the index's only.
        self.keep_duplicates = keep_duplicates
        self.copies = CacheCopies()
        # Free block id -> its release stamp, in release order. The heap holds (eviction key,
        # stamp, block id) per release; an entry whose stamp is no longer the block's is stale
        # (the block was hit, or released again since).
        self.free_block_ids: OrderedDict[int, int] = OrderedDict()
        self._evictable: list[tuple[Any, int, int]] = []
        # Release order (the default) ranks free blocks by their stamp, which is the free list's
        # own order: its first block is the one to evict, and the heap is not kept.
        self._fifo = eviction_key is release_order
        # Whether an eviction may read the last step a holder was scheduled (``touch``).
        self.tracks_last_use = not self._fifo
        self._releases = 0
        for block in self.blocks:
            self._release(block)
        # Sequence id -> the last step it was scheduled (``touch``), read when it lets go.
        self._last_scheduled: dict[int, int] = {}
        # Blocks completed by a token whose value is still on the device, or held to the end of
        # the schedule (``hold_decode_blocks``): (seq, logical index, parent hash, block_hashed
        # event row). Entered into the cache by ``resolve_pending``.
        self.pending_hashes: list[tuple[Sequence, int, int, int]] = []

    # --- admission --------------------------------------------------------------------------------
    def can_allocate(self, seq: Sequence) -> bool:
        """Room for every block of the sequence, counting cache hits as needing room (Nano-vLLM).

        Emits: nothing.
        """
        return len(self.free_block_ids) >= self.blocks_needed(seq.num_tokens)

    def allocate(self, seq: Sequence) -> None:
        """Give ``seq`` a block table: prefix-cache hits first, fresh blocks from the first miss on.

        Sets ``seq.num_cached_tokens``. A prompt that is cached completely still recomputes its
        last block, so every admitted sequence computes at least one token. Hashes of the new full
        blocks are registered later by ``register_full_blocks``, once their KV is being computed.
        Where several blocks hold a hash (``keep_duplicates``) the hit takes the one
        ``CacheCopies.serving`` picks from their state (in use, release order), not their history.

        Emits: ``block_hit`` per cached block, then ``block_allocated`` per fresh block.
        """
        if seq.block_table:
            raise RuntimeError(f"sequence {seq.seq_id} already has blocks {seq.block_table}")
        block_size = self.block_size
        num_blocks = self.blocks_needed(seq.num_tokens)
        num_full = seq.num_tokens // block_size
        # The last block is never served from cache when that would leave nothing to compute.
        max_hits = num_full if num_full * block_size < seq.num_tokens else num_full - 1
        parent = NO_HASH
        index = 0
        copies = self.copies
        if self.enable_prefix_caching:
            while index < max_hits:
                chunk = seq.block(index, block_size)
                block_hash = chain_hash(chunk, parent, self.hash_seed)
                block_id = self.hash_to_block_id.get(block_hash, -1)
                if block_hash in copies.by_hash:  # several blocks hold it (keep_duplicates)
                    block_id = copies.serving(block_id, block_hash, chunk, self.blocks,
                                              self.free_block_ids)
                if block_id < 0:
                    break
                block = self.blocks[block_id]
                if block.token_ids != chunk:
                    break
                if block.ref_count == 0:
                    self._take_free_block(block_id)
                else:
                    block.ref_count += 1
                seq.block_table.append(block_id)
                self.events.emit_block_hit(
                    seq_id=seq.seq_id, block_id=block_id, logical_index=index,
                    block_hash=block_hash, refcount=block.ref_count,
                    free_blocks=len(self.free_block_ids),
                )
                parent = block_hash
                index += 1
        seq.num_cached_tokens = index * block_size
        seq.num_computed_tokens = seq.num_cached_tokens
        seq.num_hashed_blocks = index
        self._allocate_fresh_blocks(seq, index, num_blocks)

    def register_full_blocks(self, seq: Sequence, num_tokens: int, hold_last: bool = False
                             ) -> None:
        """Enter into the prefix cache every full block within the first ``num_tokens`` tokens;
        ``hold_last``: the last of them waits in ``pending_hashes`` like a pending one.

        Emits: ``block_hashed`` per newly full block (hash ``NO_HASH`` for a block completed by a
        pending token or held, patched by ``resolve_pending``); nothing with prefix caching off.
        """
        if not self.enable_prefix_caching:
            return
        block_size = self.block_size
        last_full = min(num_tokens, seq.num_tokens) // block_size
        index = seq.num_hashed_blocks
        if index >= last_full:
            return
        blocks = self.blocks
        table = seq.block_table
        parent = blocks[table[index - 1]].hash if index > 0 else NO_HASH
        while index < last_full:
            chunk = seq.block(index, block_size)
            if chunk[-1] == PENDING_TOKEN or (hold_last and index == last_full - 1):
                # Completed by a token still on the device: only the last token of a block can
                # be pending, and no later block exists yet. Hashed when the value is in.
                row = self.events.emit_block_hashed(
                    seq_id=seq.seq_id, block_id=table[index], logical_index=index,
                    block_hash=NO_HASH, parent_hash=parent,
                )
                self.pending_hashes.append((seq, index, parent, row))
                index += 1
                break
            block_hash = chain_hash(chunk, parent, self.hash_seed)
            self._enter(blocks[table[index]], chunk, block_hash, parent)
            self.events.emit_block_hashed(
                seq_id=seq.seq_id, block_id=table[index], logical_index=index,
                block_hash=block_hash, parent_hash=parent,
            )
            parent = block_hash
            index += 1
        seq.num_hashed_blocks = index

    # --- decode growth ----------------------------------------------------------------------------
    def may_append(self, seq: Sequence) -> None:
        """Make room for the KV of the sequence's last token; hash the block it completes.

        The caller has made sure a free block exists when the token starts a new block.

        Emits: ``block_allocated`` when the token starts a block, ``block_hashed`` when it fills
        one (see ``register_full_blocks``).
        """
        if seq.num_tokens > len(seq.block_table) * self.block_size:
            self._allocate_fresh(seq, len(seq.block_table))
        if seq.num_tokens % self.block_size == 0:
            self.register_full_blocks(seq, seq.num_tokens, self.hold_decode_blocks)

    def settle_held(self) -> None:
        """The end of a schedule under ``hold_decode_blocks``: enter the held blocks now when
        every value is in; while one is still on the device, all wait for ``resolve_pending``
        (the same moment for the cache: only a launch comes between), in their order.

        Emits: nothing new; patches the ``block_hashed.hash`` of each held block.
        """
        held = self.pending_hashes
        if held and all(self._value_in(seq, index) for seq, index, _, _ in held):
            self.resolve_pending()

    def _settle_held_of(self, seq: Sequence) -> None:
        """Enter ``seq``'s held blocks before it lets them go (preempted in the schedule that
        held them, so their values are in), as ``may_append`` would have at once; a block whose
        value is still on the device stays for ``resolve_pending`` (it only patches the event)."""
        kept = []
        for entry in self.pending_hashes:
            if entry[0] is seq and self._value_in(seq, entry[1]):
                self._hash_held(*entry)
            else:
                kept.append(entry)
        self.pending_hashes = kept

    def _value_in(self, seq: Sequence, index: int) -> bool:
        """Whether the last token of ``seq``'s logical block ``index`` has its value (only a
        block's last token can be pending)."""
        return seq.token_ids[(index + 1) * self.block_size - 1] != PENDING_TOKEN

    def resolve_pending(self) -> None:
        """Hash the blocks completed by pending tokens, now that their values are written.

        Exact with respect to hashing them at once: between the two moments the scheduler
        only allocated blocks (EngineCore overlaps only steps that cannot preempt or admit), and
        allocation cannot change which block the index keeps for these tokens (with copies kept,
        ``allocate`` picks from the blocks holding a hash in their order of entry: allocation
        only takes free ones away, these join in use, and the order comes out the same).

        Emits: nothing new; patches the ``block_hashed.hash`` of each pending block.
        """
        for entry in self.pending_hashes:
            self._hash_held(*entry)
        self.pending_hashes.clear()

    def _hash_held(self, seq: Sequence, index: int, parent: int, row: int) -> None:
        """Hash one block of ``pending_hashes`` (its value is in), enter it while its sequence
        still holds its blocks (a finished one keeps none) and patch its event."""
        chunk = seq.block(index, self.block_size)
        block_hash = chain_hash(chunk, parent, self.hash_seed)
        if seq.block_table:
            self._enter(self.blocks[seq.block_table[index]], chunk, block_hash, parent)
        self.events.patch_block_hash(row, block_hash)

    def touch(self, seq_ids: list[int], step: int) -> None:
        """Note that the sequences ``seq_ids`` hold their blocks in ``step`` (for eviction by
        last use).

        Nothing is noted where ``tracks_last_use`` is False: no eviction reads the steps then.

        Emits: nothing.
        """
        if self.tracks_last_use:
            self._last_scheduled.update(zip(seq_ids, repeat(step)))

    # --- release ----------------------------------------------------------------------------------
    def deallocate(self, seq: Sequence) -> int:
        """Drop the sequence's references, last block first; return how many blocks it held.

        A block whose refcount reaches 0 goes to the end of the free list, ranked for eviction
        by ``eviction_key``, but keeps its hash and tokens, so it can still be hit until it is
        handed out again.

        Emits: ``block_freed`` per block reference, in release order.
        """
        if self.hold_decode_blocks and self.pending_hashes:
            self._settle_held_of(seq)
        table = seq.block_table
        blocks = self.blocks
        free = self.free_block_ids
        used = self._last_scheduled.pop(seq.seq_id, -1)
        released_ids: list[int] = []
        indices: list[int] = []
        refcounts: list[int] = []
        free_after: list[int] = []
        for logical_index in range(len(table) - 1, -1, -1):
            block_id = table[logical_index]
            block = blocks[block_id]
            block.ref_count -= 1
            if used > block.last_used:
                block.last_used = used
            if block.ref_count == 0:
                self._release(block)
            released_ids.append(block_id)
            indices.append(logical_index)
            refcounts.append(block.ref_count)
            free_after.append(len(free))
        self.events.emit_blocks_freed(
            seq_id=seq.seq_id,
            block_ids=released_ids,
            logical_indices=indices,
            refcounts=refcounts,
            free_blocks=free_after,
        )
        count = len(table)
        table.clear()
        seq.num_cached_tokens = 0
        seq.num_computed_tokens = 0
        seq.num_hashed_blocks = 0
        return count

    # --- helpers ----------------------------------------------------------------------------------
    def blocks_needed(self, num_tokens: int) -> int:
        """How many blocks hold ``num_tokens`` tokens. Emits: nothing."""
        return (num_tokens + self.block_size - 1) // self.block_size

    def _release(self, block: Block) -> None:
        """Put an unreferenced block on the free list, ranked by the eviction key."""
        stamp = self._releases
        self._releases += 1
        self.free_block_ids[block.block_id] = stamp
        if self._fifo:
            return
        key = self.eviction_key(
            FreeBlock(block.block_id, stamp, block.last_used, block.hash != NO_HASH)
        )
        heapq.heappush(self._evictable, (key, stamp, block.block_id))
        if len(self._evictable) > 4 * self.num_blocks + 64:  # drop stale entries now and then
            self._evictable = [e for e in self._evictable if self.free_block_ids.get(e[2]) == e[1]]
            heapq.heapify(self._evictable)

    def _next_evicted(self) -> int:
        """The free block the eviction order hands out next (the smallest key)."""
        if self._fifo:
            return next(iter(self.free_block_ids))
        heap, free = self._evictable, self.free_block_ids
        while free.get(heap[0][2]) != heap[0][1]:
            heapq.heappop(heap)
        return heap[0][2]

    def _take_free_block(self, block_id: int) -> Block:
        """Move a free block into use (refcount 1)."""
        block = self.blocks[block_id]
        del self.free_block_ids[block_id]
        block.ref_count = 1
        return block

    def _forget_contents(self, block: Block) -> None:
        """A cached block handed out fresh: its cache entry (if it is the indexed one) goes, to
        its first copy where ``keep_duplicates`` kept one (``CacheCopies.forget``)."""
        if block.hash in self.copies.by_hash:
            self.copies.forget(self.hash_to_block_id, block.hash, block.block_id)
        elif block.hash != NO_HASH and self.hash_to_block_id.get(block.hash) == block.block_id:
            del self.hash_to_block_id[block.hash]
        block.hash = NO_HASH
        block.parent_hash = NO_HASH
        block.token_ids = []

    def _allocate_fresh(self, seq: Sequence, logical_index: int) -> None:
        """Append the next free block to ``seq``'s table. Emits: ``block_allocated``."""
        self._allocate_fresh_blocks(seq, logical_index, logical_index + 1)

    def _allocate_fresh_blocks(self, seq: Sequence, first: int, end: int) -> None:
        """Append the next free blocks to ``seq``'s table, as its logical blocks ``first`` to
        ``end - 1``, each taken as ``_allocate_fresh`` takes one, recorded in one call.

        Emits: ``block_allocated`` per block."""
        free = self.free_block_ids
        block_ids: list[int] = []
        free_counts: list[int] = []
        for _ in range(first, end):
            block_id = self._next_evicted()
            block = self._take_free_block(block_id)
            self._forget_contents(block)
            block_ids.append(block_id)
            free_counts.append(len(free))
        seq.block_table.extend(block_ids)
        self.events.emit_blocks_allocated(seq.seq_id, block_ids, range(first, end), free_counts)

    def _enter(self, block: Block, chunk: TokenIds, block_hash: int, parent: int) -> None:
        """Record a full block's contents and point the cache index at it where appropriate."""
        block.hash = block_hash
        block.parent_hash = parent
        block.token_ids = chunk
        held = self.hash_to_block_id.get(block_hash, -1)
        if held >= 0 and self.keep_duplicates:  # a copy: ``allocate`` picks among them
            self.copies.add(block_hash, block.block_id)
            return
        # A live block that already holds these tokens stays the one the cache serves: were the
        # entry moved to this duplicate, freeing the duplicate would hide both.
        blocks = self.blocks
        if held < 0 or blocks[held].ref_count == 0 or blocks[held].token_ids != chunk:
            self.hash_to_block_id[block_hash] = block.block_id
