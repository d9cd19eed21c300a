"""Checks of a scheduled batch before the model runner touches the KV cache."""

from __future__ import annotations

from engine.batch import ScheduledBatch


def check_batch(batch: ScheduledBatch, max_position_embeddings: int, block_size: int,
                num_kvcache_blocks: int) -> None:
    """Scheduler bugs must fail loudly here, not read or write someone else's KV."""
    n = len(batch.seqs)
    if len(batch.num_new_tokens) != n or len(batch.context_lens) != n:
        raise ValueError("num_new_tokens and context_lens need one entry per sequence")
    if batch.sample is not None and len(batch.sample) != n:
        raise ValueError("sample needs one entry per sequence")
    for seq, new, ctx in zip(batch.seqs, batch.num_new_tokens, batch.context_lens):
        if not 1 <= new <= ctx <= len(seq.token_ids):
            raise ValueError(
                f"seq {seq.seq_id}: need 1 <= num_new_tokens ({new}) <= context_len ({ctx}) "
                f"<= tokens ({len(seq.token_ids)})"
            )
        if ctx > max_position_embeddings:
            raise ValueError(
                f"seq {seq.seq_id}: context {ctx} exceeds the model's "
                f"max_position_embeddings ({max_position_embeddings})"
            )
        needed = seq.block_table[: (ctx + block_size - 1) // block_size]
        if len(needed) * block_size < ctx:
            raise ValueError(
                f"seq {seq.seq_id}: block table of {len(seq.block_table)} blocks cannot hold "
                f"{ctx} tokens of block size {block_size}"
            )
        if needed and not (0 <= min(needed) and max(needed) < num_kvcache_blocks):
            raise ValueError(
                f"seq {seq.seq_id}: block id outside [0, {num_kvcache_blocks}) in {needed}"
            )
