"""Duplicate blocks of the prefix cache (``Config.prefix_cache_duplicates``).

Two sequences can fill blocks with the same tokens: a prompt cached up to its end recomputes its
last block, two sequences sample the same tokens (greedy answers to one prompt), a prompt is
admitted in the pass whose decode fills a block of the same tokens (that block enters the cache
at the end of the pass, ``Config.overlap_mixed_steps``). Each gets its own block, and both hold
the hash. Like vLLM's ``BlockPool`` (a hash maps to every cached block that holds it, and an
evicted block leaves only its own entry), the block manager then keeps every copy: the hash
stays cached until its last copy is handed out again. A hit takes the copy that costs least
(vLLM's takes the first cached). ``BlockManager.hash_to_block_id`` keeps the first copy to enter
the cache, ``CacheCopies`` the others, in the order they entered.

Without the setting (the rule of traces recorded before it) the index keeps one block per hash,
and the hash leaves the cache when that block is handed out even while a copy still holds it.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from engine.block_hash import TokenIds


class CacheCopies:
    """For each hash that more than one block holds: the blocks besides the index's own, in
    the order they entered the cache. Empty when no two blocks hold one hash."""

    __slots__ = ("by_hash",)

    def __init__(self) -> None:
        self.by_hash: dict[int, list[int]] = {}

    def add(self, block_hash: int, block_id: int) -> None:
        """``block_id`` now holds ``block_hash`` too, after the index's block and earlier copies.

        Emits: nothing."""
        self.by_hash.setdefault(block_hash, []).append(block_id)

    def forget(self, index: dict[int, int], block_hash: int, block_id: int) -> None:
        """``block_id`` no longer holds ``block_hash`` (handed out fresh): were it the index's
        block, the first copy takes over the entry; else it leaves the copies. Only for a hash
        with copies.

        Emits: nothing."""
        others = self.by_hash[block_hash]
        if index.get(block_hash) == block_id:
            index[block_hash] = others.pop(0)
        elif block_id in others:
            others.remove(block_id)
        if not others:
            del self.by_hash[block_hash]

    def serving(self, first: int, block_hash: int, chunk: TokenIds, blocks: Sequence[Any],
                free: Mapping[int, int]) -> int:
        """The block a hit on ``block_hash`` takes (``first``: the index's block): of the
        copies holding exactly ``chunk``, the first in use (a hit on it takes no free block),
        else the free one released last (under the default eviction order the last handed out:
        the free copies left are evicted before it, and lose only tokens the pool still holds);
        -1 when none holds ``chunk``.

        Emits: nothing."""
        best, best_stamp = -1, -1
        for block_id in (first, *self.by_hash[block_hash]):
            block = blocks[block_id]
            if block.token_ids != chunk:
                continue
            if block.ref_count > 0:
                return block_id
            if free[block_id] > best_stamp:
                best, best_stamp = block_id, free[block_id]
        return best
