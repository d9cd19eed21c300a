"""One step's inputs as plain lists and arrays (``StepPayload``), and the checks of a batch.

A payload is what every rank needs to run a step: rank 0 builds it from the scheduler's batch
and, under tensor parallelism, broadcasts it (it is small and picklable); the eager path and the
CUDA-graph prefill read it too. Only the single-GPU decode stages straight from the sequences
(``DecodeBuffers.stage_sequences``), without a payload.
"""

from __future__ import annotations

from array import array
from dataclasses import dataclass

import torch

from engine.batch import ScheduledBatch
from engine.executor import PendingStep
from engine.model.attention_metadata import AttentionMetadata, build_attention_metadata
from engine.model.layers.sampler import RowOptions, row_options
from engine.sequence import PENDING_TOKEN, TOKEN_TYPECODE


@dataclass
class StepPayload:
    """One step's inputs, identical on every rank (``payload_from_batch``)."""

    decode: bool  # True: a decode-only batch (the graph path)
    seq_ids: list[int]
    input_ids: list[int] | array  # a prefill's: an int32 array (its prompts' bytes, copied)
    query_lens: list[int]
    context_lens: list[int]
    block_tables: list[list[int]]
    num_prefill_seqs: int
    sample_rows: list[int]
    temperatures: list[float]
    eager: bool = False  # no CUDA graph, whatever the batch (ScheduledBatch.eager)
    # Per sampled row: top-p/top-k/seed options (engine/model/layers/sampler.row_options);
    # None: no row has any.
    row_options: list[RowOptions | None] | None = None


def payload_from_batch(
    batch: ScheduledBatch, decode: bool, pending_values: dict[int, int] | None = None
) -> StepPayload:
    """The step's inputs as plain lists: what every rank needs to run it.

    ``decode``: a decode-only batch that will run through the staged (graph) path.
    ``pending_values``: seq_id -> value of a last token still pending in ``seq.token_ids``.
    """
    seqs, ctx = batch.seqs, batch.context_lens
    input_ids: list[int] | array
    if decode:  # one query token per sequence: its last token
        input_ids = [seq.token_ids[c - 1] for seq, c in zip(seqs, ctx)]
    else:  # one buffer: staged for the device (and broadcast) without a Python int a token
        input_ids = array(TOKEN_TYPECODE)
        for seq, new, c in zip(seqs, batch.num_new_tokens, ctx):
            input_ids.extend(seq.token_ids[c - new : c])
    if pending_values:
        # Only the last token of a sequence can be pending, and only in a decode row.
        offset = 0
        for seq, new in zip(seqs, batch.num_new_tokens):
            offset += 1 if decode else new
            if seq.seq_id in pending_values and input_ids[offset - 1] == PENDING_TOKEN:
                input_ids[offset - 1] = pending_values[seq.seq_id]
    sample = batch.sample
    last = _last_rows(batch.num_new_tokens)
    if sample is None:
        rows = list(range(len(seqs))) if decode else last
    else:
        rows = [last[i] for i in range(len(seqs)) if sample[i]]
    sampled = [s for i, s in enumerate(seqs) if sample is None or sample[i]]
    temps = [s.temperature for s in sampled]
    return StepPayload(
        decode=decode,
        seq_ids=[seq.seq_id for seq in seqs],
        input_ids=input_ids,
        query_lens=batch.num_new_tokens,
        context_lens=ctx,
        block_tables=[seq.block_table for seq in seqs],
        num_prefill_seqs=batch.num_prefill_seqs,
        sample_rows=rows,
        temperatures=temps,
        eager=batch.eager,
        row_options=row_options(sampled),
    )


def _last_rows(query_lens: list[int]) -> list[int]:
    """Row of each sequence's last new token in the flat batch."""
    rows, offset = [], 0
    for n in query_lens:
        offset += n
        rows.append(offset - 1)
    return rows


# A mixed step's decode part starts at sequence ``num_prefill_seqs``: its context lengths
# (int32) and block-table rows are 16-byte aligned only when that is a multiple of 4. Triton
# specialises kernels on pointer alignment, so an unaligned decode part compiles a variant of
# the decode kernel that start-up never compiled (about 0.4 s, inside the step).
PREFILL_SEQ_ALIGN = 4


def aligned_prefill_part(
    query_lens: list[int], context_lens: list[int], block_tables: list[list[int]],
    num_prefill_seqs: int,
) -> tuple[list[int], list[int], list[list[int]], int]:
    """The batch with empty prefill sequences (no query, no context, no blocks) appended to its
    prefill part until the decode part starts at a multiple of ``PREFILL_SEQ_ALIGN``; a batch
    without decodes, or already aligned, comes back as is. Empty sequences add no rows."""
    pad = -num_prefill_seqs % PREFILL_SEQ_ALIGN
    if num_prefill_seqs == len(query_lens) or not num_prefill_seqs or not pad:
        return query_lens, context_lens, block_tables, num_prefill_seqs
    p = num_prefill_seqs
    return (
        [*query_lens[:p], *([0] * pad), *query_lens[p:]],
        [*context_lens[:p], *([0] * pad), *context_lens[p:]],
        [*block_tables[:p], *([[]] * pad), *block_tables[p:]],
        p + pad,
    )


def eager_inputs(
    payload: StepPayload, block_size: int, device: torch.device, align_decodes: bool = False,
    longest_first: bool = False,
) -> tuple[torch.Tensor, torch.Tensor, AttentionMetadata]:
    """Flat input ids, positions and attention metadata of a general (eager) step;
    ``align_decodes``: a mixed step's prefill part is padded with empty sequences
    (``aligned_prefill_part``, for the CUDA kernels); ``longest_first``: decode rows ordered
    for the decode kernel (``build_attention_metadata``)."""
    query_lens, context_lens, block_tables, num_prefill = (
        payload.query_lens, payload.context_lens, payload.block_tables, payload.num_prefill_seqs
    )
    if align_decodes:
        query_lens, context_lens, block_tables, num_prefill = aligned_prefill_part(
            list(query_lens), list(context_lens), list(block_tables), num_prefill
        )
    positions, metadata = build_attention_metadata(
        query_lens, context_lens, block_tables, block_size, num_prefill, device, longest_first
    )
    flat = payload.input_ids
    ids = (torch.frombuffer(flat, dtype=torch.int32).to(torch.int64)
           if isinstance(flat, array) and flat else torch.tensor(flat, dtype=torch.int64))
    ids = ids.to(device)
    return ids, positions, metadata


def token_values(previous: PendingStep) -> dict[int, int]:
    """seq_id -> token sampled by ``previous`` (waits for it)."""
    output = previous.result()
    seq_ids = getattr(previous, "seq_ids", None)
    if seq_ids is None:
        raise ValueError("the previous step does not say which sequences it sampled")
    return dict(zip(seq_ids, output.token_ids))


def check_batch(batch: ScheduledBatch, max_positions: int, block_size: int,
                num_kvcache_blocks: int) -> None:
    """Scheduler bugs must fail loudly here, not read or write someone else's KV.

    Every step that builds a payload is checked here. The single-GPU decode skips this check:
    it stages straight from the sequences and checks, vectorised, what a decode can get wrong
    (``DecodeBuffers.stage_sequences``), since this per-sequence loop would add host time to
    every decode step.
    """
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
        if ctx > max_positions:
            raise ValueError(
                f"seq {seq.seq_id}: context {ctx} exceeds the positions the model was built "
                f"for ({max_positions}: max_model_len)"
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
