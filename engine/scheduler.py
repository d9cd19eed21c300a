"""The scheduler: which sequences run each step, who is preempted, when a request finishes.

A deterministic state machine. Its inputs are requests (``add``), the tokens the executor returns
(``postprocess``) and aborts (``abort``); every decision is emitted to the event buffer. It never
reads a clock, so the same inputs give the same decisions live, in replay and in simulation.
"""

from __future__ import annotations

from collections import deque
from itertools import islice
from operator import attrgetter

from engine.batch import ScheduledBatch, StepWork
from engine.block_hash import output_hash
from engine.block_manager import BlockManager
from engine.config import Config
from engine.policy import PolicyError, Step, make_policy
from engine.sequence import PENDING_TOKEN, Sequence, SequenceStatus
from tracing.events import EventBuffer
from tracing.schema import NO_HASH, NO_SEQ, encode_stop

_seq_id = attrgetter("seq_id")
_num_tokens = attrgetter("num_tokens")


class Scheduler:
    """Runs a policy (``engine/policy.py``: Nano-vLLM's prefill first by default) and keeps all
    the bookkeeping: queues, budgets, blocks, preemption (recompute) and every event.

    Public methods in lifecycle order: ``add`` (and ``admission_error``), ``abort``, ``schedule``,
    ``postprocess``; ``OverlapScheduler`` (engine/overlap_scheduler.py) adds overlapped steps.
    """

    def __init__(self, config: Config, num_blocks: int, events: EventBuffer) -> None:
        self.config = config
        self.events = events
        self.max_num_seqs = config.max_num_seqs
        self.max_num_batched_tokens = config.max_num_batched_tokens
        self.max_model_len = config.max_model_len
        self.eos = config.eos
        self.block_size = config.kvcache_block_size
        self.policy = make_policy(config)
        self.block_manager = BlockManager(
            num_blocks, config.kvcache_block_size, events, hash_seed=config.hash_seed,
            enable_prefix_caching=config.enable_prefix_caching,
            eviction_key=self.policy.block_eviction_key(),
            hold_decode_blocks=config.overlap_mixed_steps,
            keep_duplicates=config.prefix_cache_duplicates,
        )
        self.waiting: deque[Sequence] = deque()
        self.running: deque[Sequence] = deque()  # in admission order
        # Running sequences that have not sampled since they were admitted: every other running
        # sequence is decoding (one token left to compute, its prompt done), which lets a step
        # of decodes alone be built in bulk (``_decode_all``).
        self.prefilling: set[int] = set()
        self.num_preemptions = 0

    # --- requests ---------------------------------------------------------------------------------
    def add(
        self, seq: Sequence, precheck_error: str | None = None, priority: int = 0,
        added_s: float = float("nan"),
    ) -> str | None:
        """Queue ``seq`` (recording it); reject it, recorded as finished, if it can never fit.

        ``precheck_error`` is a reason found before the scheduler (e.g. a token id outside the
        vocabulary): the request is recorded and rejected with it. ``priority``: lower is served
        first by policies that read it; ``added_s``: when the engine began adding it (its
        clock, since its start; measured, not a decision). Returns the rejection reason.

        Emits: ``request_added``; for a rejected request then ``request_finished`` (rejected).
        """
        self.events.emit_request_added(
            seq_id=seq.seq_id, arrival_s=seq.arrival_s, prompt_token_ids=seq.token_ids,
            temperature=seq.temperature, max_tokens=seq.max_tokens, ignore_eos=seq.ignore_eos,
            top_p=seq.top_p, top_k=seq.top_k, seed=seq.seed, stop=encode_stop(seq.stop),
            priority=priority, added_s=added_s,
        )
        seq.priority = priority  # on the request: nothing kept here once it is forgotten
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
        self.finish(seq, "aborted")

    def finish(self, seq: Sequence, reason: str) -> None:
        """Finish ``seq`` on an input from outside the scheduler (an abort, a stop string found
        in its text) wherever it is, releasing its blocks; a finished one stays as it is.

        Emits: ``block_freed`` per block it held, then ``request_finished`` (``reason``).
        """
        if seq.status is SequenceStatus.FINISHED:
            return
        if seq in self.waiting:
            self.waiting.remove(seq)
        if seq in self.running:
            self.running.remove(seq)
        self._finish(seq, reason, release=bool(seq.block_table))

    # --- scheduling -------------------------------------------------------------------------------
    def schedule(self) -> ScheduledBatch | None:
        """Pick this step's batch, or None when nothing is queued.

        Emits, in order: the block events of each admission (``block_hit``, ``block_allocated``,
        ``block_hashed``), of each decode's growth (``block_allocated``, ``block_hashed``) and of
        each preemption (``block_freed`` then ``preempted``), in the order the policy visits the
        sequences; then ``batch_scheduled`` and ``seq_scheduled`` per sequence. Under
        ``Config.overlap_mixed_steps`` a block a decode's token fills enters the prefix cache at
        the end (``BlockManager.settle_held``): no admission of the same pass hits it.
        """
        step = Step(self.max_num_batched_tokens, self.max_num_seqs, self._num_free_blocks,
                    self.block_manager.can_allocate, self.priority)
        batch = StepWork()
        if self.policy.mixed_batches:
            self._run_running(step, batch)
            self._admit(step, batch)
        else:
            self._admit(step, batch)
            if not batch.prefills:
                self._run_running(step, batch)
        if self.block_manager.hold_decode_blocks:
            self.block_manager.settle_held()
        if not batch.prefills and not batch.decodes:
            return None
        prefills, decodes = batch.prefills, batch.decodes
        kind = "mixed" if prefills and decodes else ("prefill" if prefills else "decode")
        return self._emit_batch(
            kind, prefills + decodes, batch.prefill_tokens + [1] * len(decodes), len(prefills)
        )

    def priority(self, seq: Sequence) -> int:
        """The priority ``seq`` was added with (lower is served first). Emits: nothing."""
        return seq.priority

    def is_finished(self) -> bool:
        """Whether nothing is waiting or running. Emits: nothing."""
        return not self.waiting and not self.running

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
        self.events.emit_tokens_sampled(seq_ids=list(map(_seq_id, sampled)), token_ids=token_ids)
        return [seq for seq, _ in self._append_sampled(batch, token_ids)]

    # --- helpers: building a step ----------------------------------------------------------------
    def _admit(self, step: Step, batch: StepWork) -> None:
        """Admit what the policy offers while it finds room; record each admission's chunk."""
        waiting, bm = self.waiting, self.block_manager
        for seq in self.policy.admit(tuple(waiting), step):
            if seq.status is not SequenceStatus.WAITING or seq.block_table:
                raise PolicyError(
                    f"policy {self.policy.name!r} admitted seq {seq.seq_id}, which is not waiting"
                )
            if step.seqs_left <= 0 or step.tokens_left <= 0 or not bm.can_allocate(seq):
                return
            bm.allocate(seq)
            query_len = self._chunk(seq, seq.num_tokens - seq.num_cached_tokens, step)
            bm.register_full_blocks(seq, seq.num_cached_tokens + query_len)
            seq.status = SequenceStatus.RUNNING
            if waiting[0] is seq:
                waiting.popleft()
            else:
                waiting.remove(seq)
            self.running.append(seq)
            self.prefilling.add(seq.seq_id)
            batch.prefills.append(seq)
            batch.prefill_tokens.append(query_len)
            step._charge(query_len)

    def _run_running(self, step: Step, batch: StepWork) -> None:
        """Visit the running sequences in admission order while the budgets last: one still in
        its prompt gets its next chunk, one decoding gets one token (``_claim_decode_slot``)."""
        running, bm = self.running, self.block_manager
        if not self.prefilling and self._decode_all(step, batch):
            return
        visited: list[Sequence] = []
        while running and step.tokens_left > 0 and step.seqs_left > 0:
            seq = running.popleft()
            remaining = seq.num_tokens - seq.num_computed_tokens
            if remaining > 1 or seq.num_computed_tokens < seq.num_prompt_tokens:
                query_len = self._chunk(seq, remaining, step)
                bm.register_full_blocks(seq, seq.num_computed_tokens + query_len)
                batch.prefills.append(seq)
                batch.prefill_tokens.append(query_len)
            elif self._claim_decode_slot(seq, step):
                batch.decodes.append(seq)
                query_len = 1
            else:
                continue
            visited.append(seq)
            step._charge(query_len)
        running.extendleft(reversed(visited))

    def _decode_all(self, step: Step, batch: StepWork) -> bool:
        """``_run_running`` in bulk when every running sequence is decoding and the free blocks
        cover every new block the visited ones need: exactly the loop's decisions and events
        (it visits the same sequences in the same order, none is preempted, and a sequence
        that neither starts nor fills a block has nothing to do), in O(sequences that start or
        fill a block) Python work. False (nothing done): the loop must decide."""
        running, block_size = self.running, self.block_size
        count = min(len(running), step.seqs_left, step.tokens_left)
        if count <= 0:
            return False
        decodes = list(running) if count == len(running) else list(islice(running, count))
        # A decoding sequence's table holds exactly its computed tokens, so its next token
        # starts a block when num_tokens % block_size == 1 and fills one when it is 0.
        due = [seq for seq in decodes if seq.num_tokens % block_size < 2]
        if due:
            claims = sum(seq.num_tokens > len(seq.block_table) * block_size for seq in due)
            if claims > len(self.block_manager.free_block_ids):
                return False
            may_append = self.block_manager.may_append
            for seq in due:
                may_append(seq)
        batch.decodes = decodes
        step._charge(count, count)
        return True

    def _chunk(self, seq: Sequence, remaining: int, step: Step) -> int:
        """The policy's chunk for ``seq``, checked against what is left to compute and to spend."""
        query_len = self.policy.chunk(seq, remaining, step)
        if not 1 <= query_len <= min(remaining, step.tokens_left):
            raise PolicyError(
                f"policy {self.policy.name!r} chose {query_len} tokens for seq {seq.seq_id} "
                f"({remaining} to compute, {step.tokens_left} left in the step's budget)"
            )
        return query_len

    # --- helpers: bookkeeping ---------------------------------------------------------------------
    def _claim_decode_slot(self, seq: Sequence, step: Step) -> bool:
        """Make room for the KV of ``seq``'s next token; False if ``seq`` itself was preempted.

        A token that starts a new block needs a free one: while none is free, the policy's victim
        among ``seq`` and the running sequences not yet visited this step is preempted.
        """
        if seq.num_tokens > len(seq.block_table) * self.block_size:
            while not self.block_manager.free_block_ids:
                candidates = [seq, *self.running]
                victim = self.policy.victim(candidates, step)
                if victim is seq:
                    self._preempt(seq, for_seq=seq)
                    return False
                if victim not in candidates:
                    raise PolicyError(
                        f"policy {self.policy.name!r} chose seq {getattr(victim, 'seq_id', victim)}"
                        f" to preempt, which is not one of the candidates"
                    )
                self.running.remove(victim)
                self._preempt(victim, for_seq=seq)
        self.block_manager.may_append(seq)
        return True

    def _num_free_blocks(self) -> int:
        return len(self.block_manager.free_block_ids)

    def _emit_batch(
        self, kind: str, seqs: list[Sequence], new_tokens: list[int], num_prefill: int
    ) -> ScheduledBatch:
        """The step's batch, recorded. Emits: ``batch_scheduled``, ``seq_scheduled`` per seq."""
        if kind == "decode":
            context_lens = list(map(_num_tokens, seqs))
            cached = list(map((-1).__add__, context_lens))
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
        seq_ids = list(map(_seq_id, seqs))
        self.block_manager.touch(seq_ids, self.events.step)
        self.events.emit_batch(
            kind=kind, num_batched_tokens=num_batched, num_waiting=len(self.waiting),
            num_running=len(self.running), free_blocks=len(self.block_manager.free_block_ids),
            seq_ids=seq_ids, num_new_tokens=new_tokens, num_cached_tokens=cached,
            context_lens=context_lens,
        )
        return ScheduledBatch(
            step=self.events.step, kind=kind, seqs=seqs, num_new_tokens=new_tokens,
            context_lens=context_lens, num_prefill_seqs=num_prefill, sample=sample,
            num_batched_tokens=num_batched, sampled_seqs=sampled,
        )

    def _preempt(self, seq: Sequence, for_seq: Sequence) -> None:
        """Send ``seq`` back to the front of the queue; its KV is recomputed when it returns.

        Emits: ``block_freed`` per block, then ``preempted``.
        """
        seq.status = SequenceStatus.WAITING
        self.prefilling.discard(seq.seq_id)
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
        if self.prefilling:  # a sequence that samples is decoding from then on
            self.prefilling.difference_update(map(_seq_id, batch.sampled_seqs))
        finished: list[tuple[Sequence, int | None]] = []
        eos = self.eos
        max_model_len = self.max_model_len
        for seq, token_id in zip(batch.sampled_seqs, token_ids):
            seq.append_token(token_id)
            num_tokens = seq.num_tokens
            if token_id == eos and not seq.ignore_eos and token_id != PENDING_TOKEN:
                reason = "eos"
            elif num_tokens - seq.num_prompt_tokens >= seq.max_tokens or \
                    num_tokens >= max_model_len:
                reason = "length"
            else:
                continue
            pending = token_id == PENDING_TOKEN
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
        self.prefilling.discard(seq.seq_id)
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
