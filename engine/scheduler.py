"""The scheduler: which sequences run each step, who is preempted, when a request finishes.

A deterministic state machine. Its inputs are requests (``add``), the tokens the executor returns
(``postprocess``) and aborts (``abort``); every decision is emitted to the event buffer. It never
reads a clock, so the same inputs give the same decisions live, in replay and in simulation.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass

import numpy as np
import xxhash

from engine.batch import ScheduledBatch
from engine.block_manager import BlockManager, signed64
from engine.config import Config
from engine.sequence import PENDING_TOKEN, Sequence, SequenceStatus
from tracing.events import EventBuffer
from tracing.schema import NO_HASH, NO_SEQ


def output_hash(token_ids: list[int]) -> int:
    """xxhash64 of a completion's token ids (signed 64-bit), so replay notices a changed token."""
    return signed64(xxhash.xxh64_intdigest(np.asarray(token_ids, dtype=np.int32).tobytes()))


@dataclass
class PendingTokens:
    """What ``Scheduler.postprocess_pending`` left to fill in once a step's tokens are back."""

    seqs: list[Sequence]  # the sampled sequences, in batch order
    positions: list[int]  # index of each one's pending token in its token_ids
    token_row: int | None  # first token_sampled event row (None: events are off)
    finished: list[tuple[Sequence, int | None]]  # finished by length, with their event row


class Scheduler:
    """Nano-vLLM's scheduler (prefill first, preempt the newest, recompute), or chunked prefill.

    Public methods in lifecycle order: ``add`` (and ``admission_error``), ``abort``, ``schedule``,
    then either ``postprocess`` or, for an overlapped step, ``can_defer``,
    ``postprocess_pending`` and ``resolve``.
    """

    def __init__(self, config: Config, num_blocks: int, events: EventBuffer) -> None:
        self.config = config
        self.events = events
        self.max_num_seqs = config.max_num_seqs
        self.max_num_batched_tokens = config.max_num_batched_tokens
        self.max_model_len = config.max_model_len
        self.eos = config.eos
        self.block_size = config.kvcache_block_size
        self.block_manager = BlockManager(
            num_blocks,
            config.kvcache_block_size,
            events,
            hash_seed=config.hash_seed,
            enable_prefix_caching=config.enable_prefix_caching,
        )
        self.waiting: deque[Sequence] = deque()
        self.running: deque[Sequence] = deque()
        self.num_preemptions = 0

    # --- requests ---------------------------------------------------------------------------------
    def add(self, seq: Sequence, precheck_error: str | None = None) -> str | None:
        """Queue ``seq`` (recording it); reject it, recorded as finished, if it can never fit.

        ``precheck_error`` is a reason found before the scheduler (e.g. a token id outside the
        vocabulary): the request is recorded and rejected with it. Returns the rejection reason.

        Emits: ``request_added``; for a rejected request then ``request_finished`` (rejected).
        """
        self.events.emit_request_added(
            seq_id=seq.seq_id,
            arrival_s=seq.arrival_s,
            prompt_token_ids=seq.token_ids,
            temperature=seq.temperature,
            max_tokens=seq.max_tokens,
            ignore_eos=seq.ignore_eos,
        )
        error = precheck_error or self.admission_error(seq)
        if error is not None:
            self._finish(seq, "rejected", release=False)
            return error
        self.waiting.append(seq)
        return None

    def admission_error(self, seq: Sequence) -> str | None:
        """Why ``seq`` can never be served under this config, or None if it can.

        Emits: nothing.
        """
        prompt_len = seq.num_tokens
        if prompt_len == 0:
            return "empty prompt"
        if prompt_len > self.max_model_len:
            return f"prompt has {prompt_len} tokens, more than max_model_len={self.max_model_len}"
        final_len = min(prompt_len + seq.max_tokens, max(self.max_model_len, prompt_len + 1))
        # The last sampled token is never fed back, so its KV is never stored.
        peak_blocks = self.block_manager.blocks_needed(final_len - 1)
        if peak_blocks > self.block_manager.num_blocks:
            return (
                f"request needs {peak_blocks} KV blocks ({final_len - 1} tokens) but the whole "
                f"pool has {self.block_manager.num_blocks}"
            )
        return None

    def abort(self, seq: Sequence) -> None:
        """Stop ``seq`` wherever it is and release its blocks (nothing if already finished).

        Emits: ``block_freed`` per block it held, then ``request_finished`` (aborted).
        """
        if seq.status is SequenceStatus.FINISHED:
            return
        if seq in self.waiting:
            self.waiting.remove(seq)
        if seq in self.running:
            self.running.remove(seq)
        self._finish(seq, "aborted", release=bool(seq.block_table))

    # --- scheduling -------------------------------------------------------------------------------
    def schedule(self) -> ScheduledBatch | None:
        """Pick this step's batch, or None when nothing is queued.

        Emits, in order: the block events of each admission (``block_hit``, ``block_allocated``,
        ``block_hashed``), of each decode's growth (``block_allocated``, ``block_hashed``) and of
        each preemption (``block_freed`` then ``preempted``), in the order the policy visits the
        sequences; then ``batch_scheduled`` and ``seq_scheduled`` per sequence.
        """
        if self.config.policy == "chunked":
            return self._schedule_chunked()
        return self._schedule_prefill_first()

    def is_finished(self) -> bool:
        """Whether nothing is waiting or running. Emits: nothing."""
        return not self.waiting and not self.running

    # --- overlapped steps -------------------------------------------------------------------------
    def can_defer(self, batch: ScheduledBatch) -> bool:
        """Whether the next step may be scheduled before this batch's token values are known.

        True for a decode batch whose tokens cannot end a sequence early (no EOS to watch for),
        when the next schedule cannot preempt: the free blocks cover every block its decodes can
        claim (``defer_block_rule`` "needed"; "per_running": at least one free block per running
        sequence, the rule of older traces). Then the values only matter for block hashes, which
        wait in the block manager until ``resolve``; everything the next schedule decides depends
        on counts alone.

        Emits: nothing.
        """
        if batch.kind != "decode":
            return False
        if self.eos >= 0 and not all(seq.ignore_eos for seq in batch.sampled_seqs):
            return False
        free = len(self.block_manager.free_block_ids)
        if free >= len(self.running):
            return True
        if self.config.defer_block_rule == "per_running":
            return False
        return free >= self._blocks_next_decodes_claim(batch)

    def schedule_needs_tokens(self) -> bool:
        """Whether the next schedule could read the prefix cache after appending decode tokens
        (the chunked policy admits waiting requests in the same pass): resolve first then.

        Emits: nothing.
        """
        return self.config.policy == "chunked" and bool(self.waiting)

    # --- results ----------------------------------------------------------------------------------
    def postprocess(self, batch: ScheduledBatch, token_ids: list[int]) -> list[Sequence]:
        """Append each sampled token, finish sequences that are done; return the finished ones.

        Emits: ``token_sampled`` per sampled sequence; then, per finished sequence, ``block_freed``
        per block and ``request_finished``.
        """
        sampled = batch.sampled_seqs
        if len(token_ids) != len(sampled):
            raise RuntimeError(
                f"executor returned {len(token_ids)} tokens for {len(sampled)} sampled sequences"
            )
        self.events.emit_tokens_sampled(
            seq_ids=[seq.seq_id for seq in sampled], token_ids=token_ids
        )
        return [seq for seq, _ in self._append_sampled(batch, token_ids)]

    def postprocess_pending(self, batch: ScheduledBatch) -> PendingTokens:
        """``postprocess`` with the token values still unknown (``can_defer`` must hold).

        Appends a placeholder token to each sampled sequence, finishes those at their length
        limit and emits the same events ``postprocess`` would, in the same order, with
        placeholder values that ``resolve`` fills in.

        Emits: as ``postprocess``, with ``token_sampled.token_id`` = ``PENDING_TOKEN`` and
        ``request_finished.output_hash`` = ``NO_HASH``.
        """
        sampled = batch.sampled_seqs
        pending = [PENDING_TOKEN] * len(sampled)
        row = self.events.emit_tokens_sampled(
            seq_ids=[seq.seq_id for seq in sampled], token_ids=pending
        )
        positions = [seq.num_tokens for seq in sampled]
        finished = self._append_sampled(batch, pending)
        return PendingTokens(sampled, positions, row, finished)

    def resolve(self, pending: PendingTokens, token_ids: list[int]) -> None:
        """Write the values of a pending step's tokens into sequences, cache and events.

        Emits: nothing new; patches ``token_sampled.token_id``, ``request_finished.output_hash``
        and ``block_hashed.hash`` (``BlockManager.resolve_pending``).
        """
        if len(token_ids) != len(pending.seqs):
            raise RuntimeError(
                f"executor returned {len(token_ids)} tokens for {len(pending.seqs)} sampled "
                "sequences"
            )
        for seq, position, token_id in zip(pending.seqs, pending.positions, token_ids):
            seq.token_ids[position] = token_id
            if position == seq.num_tokens - 1:
                seq.last_token = token_id
        if pending.token_row is not None:
            self.events.patch_tokens(pending.token_row, token_ids)
        for seq, row in pending.finished:
            if row is not None:
                self.events.patch_output_hash(row, output_hash(seq.completion_token_ids))
        self.block_manager.resolve_pending()

    # --- helpers: the two policies ----------------------------------------------------------------
    def _schedule_prefill_first(self) -> ScheduledBatch | None:
        """Admit waiting prompts while budget and blocks allow (a prefill step); otherwise decode
        the running sequences in order, one token each."""
        waiting, running, bm = self.waiting, self.running, self.block_manager
        scheduled: list[Sequence] = []
        new_tokens: list[int] = []
        num_batched = 0
        while waiting and len(scheduled) < self.max_num_seqs:
            seq = waiting[0]
            if num_batched + seq.num_tokens > self.max_num_batched_tokens or not bm.can_allocate(
                seq
            ):
                break
            bm.allocate(seq)
            bm.register_full_blocks(seq, seq.num_tokens)
            query_len = seq.num_tokens - seq.num_cached_tokens
            num_batched += query_len
            seq.status = SequenceStatus.RUNNING
            waiting.popleft()
            running.append(seq)
            scheduled.append(seq)
            new_tokens.append(query_len)
        if scheduled:
            return self._emit_batch("prefill", scheduled, new_tokens, len(scheduled))

        while running and len(scheduled) < self.max_num_seqs:
            seq = running.popleft()
            if self._claim_decode_slot(seq):
                scheduled.append(seq)
        if not scheduled:
            return None
        running.extendleft(reversed(scheduled))
        return self._emit_batch("decode", scheduled, [1] * len(scheduled), 0)

    def _schedule_chunked(self) -> ScheduledBatch | None:
        """Decode-first with a token budget; prompts are split into chunks that fill what is left.

        Running sequences are visited in order: one still in its prompt gets the next chunk, one
        decoding gets one token (preempting the newest running sequence if it needs a block and
        none is free). Waiting sequences are then admitted while budget remains.
        """
        waiting, running, bm = self.waiting, self.running, self.block_manager
        budget = self.max_num_batched_tokens
        prefills: list[Sequence] = []
        prefill_tokens: list[int] = []
        decodes: list[Sequence] = []
        scheduled_running: list[Sequence] = []
        while running and budget > 0 and len(scheduled_running) < self.max_num_seqs:
            seq = running.popleft()
            remaining = seq.num_tokens - seq.num_computed_tokens
            if remaining > 1 or seq.num_computed_tokens < seq.num_prompt_tokens:
                query_len = min(remaining, budget)
                bm.register_full_blocks(seq, seq.num_computed_tokens + query_len)
                prefills.append(seq)
                prefill_tokens.append(query_len)
                scheduled_running.append(seq)
                budget -= query_len
            elif self._claim_decode_slot(seq):
                decodes.append(seq)
                scheduled_running.append(seq)
                budget -= 1
        running.extendleft(reversed(scheduled_running))
        num_seqs = len(scheduled_running)
        while waiting and budget > 0 and num_seqs < self.max_num_seqs:
            seq = waiting[0]
            if not bm.can_allocate(seq):
                break
            bm.allocate(seq)
            query_len = min(seq.num_tokens - seq.num_cached_tokens, budget)
            bm.register_full_blocks(seq, seq.num_cached_tokens + query_len)
            seq.status = SequenceStatus.RUNNING
            waiting.popleft()
            running.append(seq)
            prefills.append(seq)
            prefill_tokens.append(query_len)
            budget -= query_len
            num_seqs += 1
        if not prefills and not decodes:
            return None
        kind = "mixed" if prefills and decodes else ("prefill" if prefills else "decode")
        return self._emit_batch(
            kind, prefills + decodes, prefill_tokens + [1] * len(decodes), len(prefills)
        )

    # --- helpers: bookkeeping ---------------------------------------------------------------------
    def _claim_decode_slot(self, seq: Sequence) -> bool:
        """Make room for the KV of ``seq``'s next token; False if ``seq`` itself was preempted.

        A token that starts a new block needs a free one: while none is free, the newest running
        sequence is preempted, and ``seq`` itself when no other one is left.
        """
        if seq.num_tokens > len(seq.block_table) * self.block_size:
            while not self.block_manager.free_block_ids:
                if not self.running:
                    self._preempt(seq, for_seq=seq)
                    return False
                self._preempt(self.running.pop(), for_seq=seq)
        self.block_manager.may_append(seq)
        return True

    def _emit_batch(
        self, kind: str, seqs: list[Sequence], new_tokens: list[int], num_prefill: int
    ) -> ScheduledBatch:
        """The step's batch, recorded. Emits: ``batch_scheduled``, ``seq_scheduled`` per seq."""
        if kind == "decode":
            context_lens = [seq.num_tokens for seq in seqs]
            cached = [n - 1 for n in context_lens]
            sample = None
            sampled = seqs
        else:
            cached = [seq.num_computed_tokens for seq in seqs]
            context_lens = [c + q for c, q in zip(cached, new_tokens)]
            sample = [ctx == seq.num_tokens for ctx, seq in zip(context_lens, seqs)]
            sampled = [seq for seq, s in zip(seqs, sample) if s]
            if len(sampled) == len(seqs):
                sample = None
        num_batched = sum(new_tokens)
        self.events.emit_batch(
            kind=kind,
            num_batched_tokens=num_batched,
            num_waiting=len(self.waiting),
            num_running=len(self.running),
            free_blocks=len(self.block_manager.free_block_ids),
            seq_ids=[seq.seq_id for seq in seqs],
            num_new_tokens=new_tokens,
            num_cached_tokens=cached,
            context_lens=context_lens,
        )
        return ScheduledBatch(
            step=self.events.step,
            kind=kind,
            seqs=seqs,
            num_new_tokens=new_tokens,
            context_lens=context_lens,
            num_prefill_seqs=num_prefill,
            sample=sample,
            num_batched_tokens=num_batched,
            sampled_seqs=sampled,
        )

    def _preempt(self, seq: Sequence, for_seq: Sequence) -> None:
        """Send ``seq`` back to the front of the queue; its KV is recomputed when it returns.

        Emits: ``block_freed`` per block, then ``preempted``.
        """
        seq.status = SequenceStatus.WAITING
        seq.num_preemptions += 1
        released = self.block_manager.deallocate(seq)
        self.events.emit_preempted(
            seq_id=seq.seq_id,
            blocks_released=released,
            for_seq_id=for_seq.seq_id if for_seq is not seq else NO_SEQ,
            num_tokens=seq.num_tokens,
        )
        self.waiting.appendleft(seq)
        self.num_preemptions += 1

    def _append_sampled(
        self, batch: ScheduledBatch, token_ids: list[int]
    ) -> list[tuple[Sequence, int | None]]:
        """The append-and-finish path of ``postprocess`` and ``postprocess_pending``.

        Records the progress of prefill chunks that sample nothing, appends each sampled token
        (``PENDING_TOKEN``: value to come, so no EOS check and no output hash yet) and finishes
        the sequences that are done. Returns them with their ``request_finished`` rows.

        Emits: per finished sequence, ``block_freed`` per block and ``request_finished``.
        """
        if batch.sample is not None:
            for seq, ctx, sample in zip(batch.seqs, batch.context_lens, batch.sample):
                if not sample:
                    seq.num_computed_tokens = ctx
        finished: list[tuple[Sequence, int | None]] = []
        eos = self.eos
        max_model_len = self.max_model_len
        for seq, token_id in zip(batch.sampled_seqs, token_ids):
            seq.append_token(token_id)
            pending = token_id == PENDING_TOKEN
            if token_id == eos and not seq.ignore_eos and not pending:
                reason = "eos"
            elif seq.num_tokens - seq.num_prompt_tokens >= seq.max_tokens:
                reason = "length"
            elif seq.num_tokens >= max_model_len:
                reason = "length"
            else:
                continue
            finished.append((seq, self._finish(seq, reason, release=True, hashed=not pending)))
        if finished:
            self.running = deque(s for s in self.running if s.status is SequenceStatus.RUNNING)
        return finished

    def _finish(
        self, seq: Sequence, reason: str, release: bool, hashed: bool = True
    ) -> int | None:
        """Finish ``seq``; returns its request_finished row. ``hashed=False``: its last token is
        pending, so the output hash is a placeholder until ``resolve``.

        Emits: ``block_freed`` per block (``release``), then ``request_finished``.
        """
        seq.status = SequenceStatus.FINISHED
        seq.finish_reason = reason
        if release:
            self.block_manager.deallocate(seq)
        digest = output_hash(seq.completion_token_ids) if hashed else NO_HASH
        return self.events.emit_request_finished(
            seq_id=seq.seq_id,
            reason=reason,
            num_completion_tokens=seq.num_completion_tokens,
            output_hash=digest,
        )

    def _blocks_next_decodes_claim(self, batch: ScheduledBatch) -> int:
        """Running sequences whose next decode token starts a new block (a sequence of
        ``batch`` holds one token more by then): each claims one free block, at most."""
        sampled = {seq.seq_id for seq in batch.sampled_seqs}
        capacity = self.block_size
        return sum(
            seq.num_tokens + (seq.seq_id in sampled) > len(seq.block_table) * capacity
            for seq in self.running
        )
