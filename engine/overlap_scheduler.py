"""Overlapped steps: post-process a step before its token values are back from the device.

``EngineCore`` uses this scheduler. When ``can_defer`` holds for a batch, it calls
``postprocess_pending`` right after the launch (placeholder tokens, the same events in the same
order), schedules and launches the next step, and then ``resolve`` writes the values in. The
decisions and events are exactly those of the sequential ``postprocess``.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from operator import attrgetter

from engine.batch import ScheduledBatch, StepWork
from engine.block_hash import output_hash
from engine.policy import Step
from engine.scheduler import Scheduler
from engine.sequence import PENDING_TOKEN, Sequence


@dataclass
class PendingTokens:
    """What ``postprocess_pending`` left to fill in once a step's tokens are back."""

    seqs: list[Sequence]  # the sampled sequences, in batch order
    positions: list[int]  # index of each one's pending token in its token_ids
    token_row: int | None  # first token_sampled event row (None: events are off)
    finished: list[tuple[Sequence, int | None]]  # finished by length, with their event row


class OverlapScheduler(Scheduler):
    """The ``Scheduler`` plus the three calls of an overlapped step (in lifecycle order:
    ``can_defer``, ``postprocess_pending``, ``resolve``) and ``schedule_needs_tokens``; and
    ``sync_running`` for a decode stretch's sequences."""

    # Set while a decode stretch left running sequences lacking tokens (engine.running_columns):
    # brings them up to date before they are read here (visiting them, a finish).
    sync_running: Callable[[], None] | None = None

    def finish(self, seq: Sequence, reason: str) -> None:
        """``Scheduler.finish``, the running sequences first brought up to date."""
        if self.sync_running is not None:
            self.sync_running()
        super().finish(seq, reason)

    def _run_running(self, step: Step, batch: StepWork) -> None:
        """``Scheduler._run_running``, the running sequences first brought up to date."""
        if self.sync_running is not None:
            self.sync_running()
        super()._run_running(step, batch)

    def can_defer(self, batch: ScheduledBatch) -> bool:
        """Whether the next step may be scheduled before this batch's token values are known.

        True for a decode batch (and a mixed one under ``Config.overlap_mixed_steps``) whose
        tokens cannot end a sequence early (no EOS to watch for),
        when the next schedule cannot preempt: the free blocks cover every block its decodes can
        claim (``defer_block_rule`` "needed"; "per_running": at least one free block per running
        sequence, the rule of older traces). Then the values only matter for block hashes, which
        wait in the block manager until ``resolve``; everything the next schedule decides depends
        on counts alone.

        Emits: nothing.
        """
        if not self.takes_pending_inputs(batch):
            return False
        if self.eos >= 0 and not all(map(attrgetter("ignore_eos"), batch.sampled_seqs)):
            return False
        return self.blocks_allow_defer(len(self.block_manager.free_block_ids), len(self.running),
                                       lambda: self._blocks_next_decodes_claim(batch))

    def blocks_allow_defer(self, free: int, num_running: int, claims: Callable[[], int]) -> bool:
        """The block part of ``can_defer``: ``free`` blocks after the batch's own allocations,
        ``num_running`` running sequences and ``claims()`` the blocks the next decodes claim
        (asked only when the rule needs it). Also used by ``DecodeStretch``. Emits: nothing."""
        if free >= num_running:
            return True
        if self.config.defer_block_rule == "per_running":
            return False
        return free >= claims()

    def takes_pending_inputs(self, batch: ScheduledBatch) -> bool:
        """Whether ``batch`` can be launched with input tokens still on the device (a decode;
        a mixed batch under ``Config.overlap_mixed_steps``), and so be deferred. Emits: nothing."""
        return batch.kind == "decode" or (batch.kind == "mixed" and self.config.overlap_mixed_steps)

    def schedule_needs_tokens(self) -> bool:
        """Whether the next schedule could read the prefix cache after appending decode tokens
        (a mixed-batch policy admits waiting requests in the same pass): resolve first then.
        Never under ``Config.overlap_mixed_steps``: such blocks enter the cache only once the
        schedule is over (``BlockManager.settle_held``).

        Emits: nothing.
        """
        if self.config.overlap_mixed_steps:
            return False
        return self.policy.mixed_batches and bool(self.waiting)

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

    def _blocks_next_decodes_claim(self, batch: ScheduledBatch) -> int:
        """Running sequences whose next decode token starts a new block (a sequence of
        ``batch`` holds one token more by then): each claims one free block, at most."""
        sampled = {seq.seq_id for seq in batch.sampled_seqs}
        capacity = self.block_size
        return sum(
            seq.num_tokens + (seq.seq_id in sampled) > len(seq.block_table) * capacity
            for seq in self.running
        )
