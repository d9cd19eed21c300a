"""A stretch of steady decode steps, run in bulk: the decisions and events of step-by-step decoding.

When every running sequence is decoding, nothing waits, every running sequence fits one step's
budgets, no token can end a sequence early (``ignore_eos``, or no EOS token) and the free KV blocks
cover every block the running sequences will claim over the stretch (with room left for every
step to be deferred), the scheduler's next steps are known in advance: each decodes all running
sequences in admission order, a sequence finishes at its length limit, and nothing is admitted or
preempted (the driver that asks for a stretch ends it before its next input is due:
``EngineCore.decode_horizon``). ``DecodeStretch`` gives each step's batch size and context
tokens up front (numpy over the stretch), so its step times can be priced before anything runs;
``run`` then makes the stretch's decisions with no Python work per sequence and step: the
``BlockManager`` makes every block decision (``may_append``, and ``deallocate`` through
``Scheduler.finish``) in the order and at the step the per-step loop makes it, a ``Sequence`` is
brought up to date (``Sequence.extend_tokens``) only where the block manager reads it (a token that
starts or fills a block) and when it finishes; the others are left behind their columns, to be
brought up to date when next read (``RunningColumns.sync``; without a token source, at the
stretch's end), and the rows of the steps'
``batch_scheduled``, ``seq_scheduled``, ``model_step`` and ``token_sampled`` events are built
column by column, with the event ids the per-step loop gives them. The running sequences'
columns a stretch plans from are kept from one stretch to the next (``engine.running_columns``),
and an executor with ``price_decodes`` prices all its steps in one call (``DecodePrices``).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from engine.batch import ScheduledBatch, StepOutput, StepResult
from engine.policy import BUILTIN_POLICIES
from engine.running_columns import RunningColumns, TokensOf

if TYPE_CHECKING:
    from engine.overlap_scheduler import OverlapScheduler
    from engine.sequence import Sequence

MAX_STRETCH_STEPS = 256  # the most steps one stretch plans
# The model_step columns of a step but its ids, in ``EventBuffer.emit_model_step``'s order.
MODEL_ROW_COLUMNS = ("kind", "duration_s", "num_seqs", "prefill_tokens", "prefill_attn_work",
                     "decode_seqs", "decode_context_tokens", "padded_batch_size", "graph_used",
                     "wall_time_s", "overlapped", "host_s", "padded_tokens", "outside_s")
_BUILTIN = tuple(BUILTIN_POLICIES.values())  # policies that admit only from the waiting queue
_STEPS = np.arange(MAX_STRETCH_STEPS)  # a stretch's step numbers (sliced: no array per stretch)
_NO_TOKENS = np.zeros((0, 0), np.int64)  # no tokens bound (``bind_tokens``)

@dataclass
class DecodePrices:
    """A stretch's steps as priced (``DecodeStretch.price``; an executor's ``price_decodes``):
    per step its clock before and after and its ``StepOutput``'s fields; ``last``: the last
    step's output."""

    began: list[float]
    ended: list[float]
    duration_s: list[float]
    wait_s: list[float]
    padded: list[int]
    graph_used: list[bool]
    padded_tokens: list[int]
    last: StepOutput

    def add(self, began: float, ended: float, output: StepOutput) -> None:
        """One more step, priced from ``began`` to ``ended`` on the clock."""
        self.began.append(began)
        self.ended.append(ended)
        self.duration_s.append(output.duration_s)
        self.wait_s.append(output.wait_s)
        self.padded.append(output.padded_batch_size)
        self.graph_used.append(output.graph_used)
        self.padded_tokens.append(output.padded_tokens)
        self.last = output


class DecodeStretch:
    """Up to ``num_steps`` decode steps of the running sequences (see the module docstring):
    ``plan`` (None where a stretch cannot be proven), ``price``, ``bind_tokens``, ``run``, then
    ``last_batch``."""

    def __init__(self, scheduler: OverlapScheduler, columns: RunningColumns,
                 last_step: np.ndarray, num_steps: int, tokens_of: TokensOf | None = None) -> None:
        self.scheduler = scheduler
        self.columns = columns
        self.tokens_of = tokens_of
        self.seqs = seqs = columns.seqs
        self.num_steps = num_steps
        self.seq_ids = columns.seq_ids
        num_tokens = columns.num_tokens
        self.completions = num_tokens - columns.prompt_lens
        self._num_tokens = num_tokens  # at the stretch's first step
        self._last_step = last_step  # the step (from 0) whose token finishes each sequence
        # Each step's batch, context tokens and longest context, from the sums over all the
        # running sequences less those finished by then (few: a stretch ends at the next
        # arrival), in the order they finish: no sequence x step matrix.
        finishing = np.flatnonzero(last_step < num_steps).tolist()
        self._finishing: dict[int, list[int]] = {}
        for index in finishing:
            self._finishing.setdefault(int(last_step[index]), []).append(index)
        running, tokens, longest = len(seqs), int(num_tokens.sum()), int(num_tokens.max())
        gone: list[int] = []  # the sequences finished so far
        num_seqs, context_tokens, longest_contexts = [], [], []
        for step in range(num_steps):
            for index in self._finishing.get(step - 1, ()):  # finished at the step before
                count = int(num_tokens[index])
                running -= 1
                tokens -= count
                gone.append(index)
                if count == longest:  # the longest left: the longest of the others
                    longest = int(np.delete(num_tokens, gone).max())
            num_seqs.append(running)
            context_tokens.append(tokens + step * running)
            longest_contexts.append(longest + step)
        self.num_seqs: list[int] = num_seqs  # each step's batch
        self.context_tokens: list[int] = context_tokens  # each step's sum
        self.longest_contexts: list[int] = longest_contexts  # and longest
        # A decoding sequence's next token starts a block when num_tokens % block_size == 1 and
        # fills one when it is 0 (as ``Scheduler._decode_all``): those visit the block manager,
        # at a step it still runs.
        grid = num_tokens[:, None] + _STEPS[:num_steps]  # each sequence's count at each step
        grid %= scheduler.block_size
        due_steps, due_seqs = np.nonzero((grid < 2).T)  # by step, in running order
        self._due: dict[int, list[int]] = {}
        ends = {index: int(last_step[index]) for index in finishing}
        for step, index in zip(due_steps.tolist(), due_seqs.tolist()):
            if step <= ends.get(index, step):
                self._due.setdefault(step, []).append(index)
        self._tokens = _NO_TOKENS  # ``bind_tokens``' (before ``run``)

    @classmethod
    def plan(cls, scheduler: OverlapScheduler, max_steps: int,
             columns: RunningColumns | None = None,
             tokens_of: TokensOf | None = None) -> DecodeStretch | None:
        """The stretch the scheduler's state proves, of at most ``max_steps`` steps, or None
        (the per-step path decides). ``columns``: the running sequences' columns kept from the
        last stretch (``engine.running_columns``; None: gathered afresh); ``tokens_of``: the
        executor's token rule, which lets the stretch leave its survivors' ``Sequence`` objects
        behind their columns (None: it brings them up to date at its end). Emits: nothing."""
        running = scheduler.running
        if scheduler.waiting or scheduler.prefilling or not running or max_steps < 1:
            return None
        block_manager = scheduler.block_manager
        if len(running) > min(scheduler.max_num_seqs, scheduler.max_num_batched_tokens) or \
                block_manager.pending_hashes or type(scheduler.policy) not in _BUILTIN:
            return None
        columns = columns if columns is not None else RunningColumns()
        columns.refresh(list(running), scheduler.max_model_len, tokens_of)
        if scheduler.eos >= 0 and columns.watches_eos():
            return None
        num_tokens = columns.num_tokens
        # ``Scheduler._append_sampled``'s length rule: done once num_tokens reaches the limit.
        last_step = columns.limits - num_tokens - 1
        num_steps = int(min(max_steps, MAX_STRETCH_STEPS, int(last_step.max()) + 1))
        if num_steps < 1:  # (a running sequence is never past its limit: postprocess ends it)
            return None
        # Every block the sequences claim over the stretch must be free now: then no step of it
        # can preempt, whatever the finishes free on the way; and the defer rule must hold with
        # the fewest free blocks and the most running sequences any step can have.
        block_size = scheduler.block_size
        free = len(block_manager.free_block_ids)
        # A sequence's token starts a block once every block_size steps: over num_steps steps
        # it claims at most ``most`` blocks. Where the free blocks cover that for every running
        # sequence and still one each, both rules hold whatever the exact count (the defer
        # rule's first case), so it is not worked out.
        most = -(-num_steps // block_size)
        if free >= (most + 1) * len(running):
            return cls(scheduler, columns, last_step, num_steps, tokens_of)
        peak = num_tokens + np.minimum(last_step, num_steps - 1)
        claims = int(np.maximum((peak + block_size - 1) // block_size - columns.held, 0).sum())
        if claims > free or not scheduler.blocks_allow_defer(free - claims, len(running),
                                                             _unknown):
            return None
        return cls(scheduler, columns, last_step, num_steps, tokens_of)

    def price(self, executor: Any, clock: Callable[[], float], until: float, overlapped: bool,
              defer: bool, start: float, sink_s: float, outside_s: float = 0.0
              ) -> dict[str, list]:
        """The ``model_step`` columns (but ids) of the steps that start before ``until`` on
        ``clock`` (at least one), each priced by ``executor.price_decode`` as
        ``EngineCore``'s sequential path prices and records a step: ``overlapped`` is the first
        step's flag, ``defer`` every later one's; ``start``: the engine's start on the clock;
        ``sink_s``: the sink time charged to each step; ``outside_s``: the driver's time
        before the stretch (``engine.outside_time``), the first step's. An executor with
        ``price_decodes`` prices them all in one call (the same values, see ``DecodePrices``)."""
        # In one call only where the executor moves the very clock read here.
        bulk = getattr(executor, "price_decodes", None)
        priced = None if bulk is None or getattr(executor, "clock", None) is not clock else bulk(
            self.num_seqs, self.context_tokens, self.longest_contexts, overlapped, defer, until)
        if priced is None:
            priced = self._price_each(executor, clock, until, overlapped, defer)
        self._last_output = priced.last
        count = len(priced.began)
        num_seqs, context = self.num_seqs[:count], self.context_tokens[:count]
        flags = [overlapped] + [defer] * (count - 1)
        # Only the executor moves a simulated clock: host time as ``_advance_loop`` and
        # ``_complete`` add it up (scheduling and post-processing take none of it).
        host_s = [(began - began) + (ended - began - wait_s) + (ended - ended) + sink_s
                  for began, ended, wait_s in zip(priced.began, priced.ended, priced.wait_s)]
        return dict(zip(MODEL_ROW_COLUMNS, (
            ["decode"] * count, priced.duration_s, num_seqs, [0] * count, [0] * count,
            num_seqs, context, [padded or seqs for padded, seqs in zip(priced.padded, num_seqs)],
            priced.graph_used, [ended - start for ended in priced.ended], flags, host_s,
            priced.padded_tokens, [outside_s] + [0.0] * (count - 1))))

    def _price_each(self, executor: Any, clock: Callable[[], float], until: float,
                    overlapped: bool, defer: bool) -> DecodePrices:
        """``price``'s steps priced one ``executor.price_decode`` call each."""
        priced = DecodePrices([], [], [], [], [], [], [], None)  # type: ignore[arg-type]
        for num_seqs, context, longest in zip(self.num_seqs, self.context_tokens,
                                              self.longest_contexts):
            if priced.began and clock() >= until:
                break
            began = clock()
            output = executor.price_decode(num_seqs, context, overlapped, longest)
            priced.add(began, clock(), output)
            overlapped = defer
        return priced

    def bind_tokens(self, tokens: np.ndarray) -> None:
        """The token each sequence samples at each step (sequences by row, steps by column):
        needed for the ``token_sampled`` rows, and where there is no ``tokens_of``."""
        self._tokens = tokens

    def run(self, steps: int, first_step: int, model_rows: dict[str, list],
            sequence_rows: bool = True) -> list[Sequence]:
        """Make the decisions of the stretch's first ``steps`` steps (numbered from
        ``first_step``) and record them, ``model_rows`` holding the ``model_step`` columns of
        each step but its ids; returns the sequences finished, in order. ``sequence_rows``
        False: the ``seq_scheduled`` and ``token_sampled`` rows are left out (their ids are
        taken all the same), for a sink that folds ``sampled``'s counts instead.

        Emits, per step and in the per-step loop's order (event ids included): the block events
        of the sequences whose token starts or fills a block (``block_allocated``,
        ``block_hashed``), ``batch_scheduled``, ``seq_scheduled`` per sequence, ``model_step``,
        ``token_sampled`` per sequence, then per finished sequence ``block_freed`` per block and
        ``request_finished``.
        """
        scheduler = self.scheduler
        block_manager, events, seqs = scheduler.block_manager, scheduler.events, self.seqs
        free_after: list[int] = []
        first_ids: list[int] = []
        finished: list[Sequence] = []
        hold = block_manager.hold_decode_blocks
        held = self.columns.held  # brought up to date where the block manager grows a table
        for step in range(steps):
            events.step = first_step + step
            for index in self._due.get(step, ()):
                self._catch_up(index, step)
                seq = seqs[index]
                block_manager.may_append(seq)
                held[index] = len(seq.block_table)
            if hold:  # the schedule's end (``Scheduler.schedule``)
                block_manager.settle_held()
            free_after.append(len(block_manager.free_block_ids))
            # The step's batch, sequence, model-step and token rows: appended below.
            first_ids.append(events.reserve_ids(2 + 2 * self.num_seqs[step]))
            for index in self._finishing.get(step, ()):
                seq = seqs[index]
                self._catch_up(index, step + 1)
                block_manager.touch([seq.seq_id], events.step)
                scheduler.finish(seq, "length")  # as postprocess: blocks freed, then the request
                finished.append(seq)
        self._emit_rows(steps, first_step, first_ids, free_after,
                        model_rows, sequence_rows)
        # The survivors: every row where nothing finished (None: ``RunningColumns.keep``
        # takes the list as it is, never changed).
        survivors = np.flatnonzero(self._last_step >= steps) if finished else None
        kept = [seqs[index] for index in survivors.tolist()] if finished else seqs
        if block_manager.tracks_last_use:
            ids = self.seq_ids if survivors is None else self.seq_ids[survivors]
            block_manager.touch(ids.tolist(), first_step + steps - 1)
        if self.tokens_of is None:  # no token source to catch them up later: now
            for index in range(len(seqs)) if survivors is None else survivors.tolist():
                self._catch_up(index, steps)
        self.columns.keep(survivors, kept, steps, lagging=self.tokens_of is not None)
        return finished

    def result(self, steps: int, first_step: int, finished: list[Sequence]) -> StepResult:
        """The ``StepResult`` of the stretch's first ``steps`` steps: its last step's, with
        every sequence finished in the stretch; the batch and output are built when first read
        (``last_batch``: a streamed run reads only ``finished``)."""
        return StretchResult(self, steps, first_step, finished)

    def last_batch(self, steps: int, first_step: int) -> tuple[ScheduledBatch, StepOutput]:
        """The batch of the stretch's last step of ``steps`` and its output (``price``'s, with
        the tokens it sampled)."""
        last = steps - 1
        index = np.flatnonzero(self._last_step >= last)
        seqs = [self.seqs[i] for i in index.tolist()]
        context_lens = (self._num_tokens[index] + last).tolist()
        batch = ScheduledBatch(
            step=first_step + last, kind="decode", seqs=seqs, num_new_tokens=[1] * len(seqs),
            context_lens=context_lens, num_prefill_seqs=0, num_batched_tokens=len(seqs),
            sampled_seqs=seqs)
        output = self._last_output
        if self._tokens.shape[1] > last:
            output.token_ids = self._tokens[index, last].tolist()
        else:  # no tokens bound (no sequence rows were needed): the token source's
            output.token_ids = [
                self.tokens_of(seq_id, completion + last, 1)[0]  # type: ignore[misc]
                for seq_id, completion in zip(self.seq_ids[index].tolist(),
                                              self.completions[index].tolist())]
        return batch, output

    def sampled(self, steps: int) -> np.ndarray:
        """How many tokens each sequence sampled in the stretch's first ``steps`` steps."""
        return np.minimum(self._last_step + 1, steps)

    def _emit_rows(self, steps: int, first_step: int, first_ids: list[int],
                   free_after: list[int], model_rows: dict[str, list],
                   sequence_rows: bool) -> None:
        """The steps' batch, model-step (and sequence and token) rows, with their reserved
        ids."""
        events, num_seqs = self.scheduler.events, self.num_seqs[:steps]
        waiting = len(self.scheduler.waiting)
        events.extend_rows("batch_scheduled", {
            "event_id": first_ids, "step": list(range(first_step, first_step + steps)),
            "kind": ["decode"] * steps, "num_seqs": num_seqs, "num_batched_tokens": num_seqs,
            "num_waiting": [waiting] * steps, "num_running": num_seqs, "free_blocks": free_after})
        events.extend_rows("model_step", {
            "event_id": [first + count + 1 for first, count in zip(first_ids, num_seqs)],
            "step": list(range(first_step, first_step + steps)), **model_rows})
        if not sequence_rows:
            return
        counts, firsts = np.asarray(num_seqs, np.int64), np.asarray(first_ids, np.int64)
        running = np.arange(steps) <= self._last_step[:, None]  # sequence x step
        step_of, seq_of = np.nonzero(running.T)  # by step, in running order
        starts = np.cumsum(counts) - counts
        rank = np.arange(len(step_of)) - starts[step_of]
        seq_ids = self.seq_ids[seq_of].tolist()
        step_col = (step_of + first_step).tolist()
        context = self._num_tokens[seq_of] + step_of
        row_ids = firsts[step_of] + rank
        events.extend_rows("seq_scheduled", {
            "event_id": (row_ids + 1).tolist(), "step": step_col, "seq_id": seq_ids,
            "num_new_tokens": [1] * len(seq_ids), "num_cached_tokens": (context - 1).tolist(),
            "context_len": context.tolist()})
        events.extend_rows("token_sampled", {
            "event_id": (row_ids + counts[step_of] + 2).tolist(), "step": step_col,
            "seq_id": seq_ids, "token_id": self._tokens[seq_of, step_of].tolist()})

    def _catch_up(self, index: int, steps: int) -> None:
        """Give sequence ``index`` the tokens it sampled up to the stretch's first ``steps``
        steps that it lacks (earlier stretches' too), from ``tokens_of`` (else the bound
        tokens)."""
        seq = self.seqs[index]
        owed = int(self._num_tokens[index]) + steps - seq.num_tokens
        if owed > 0:
            if self.tokens_of is not None:
                seq.extend_tokens(self.tokens_of(
                    seq.seq_id, seq.num_tokens - seq.num_prompt_tokens, owed))
            else:  # (never behind its columns then: every token owed is this stretch's)
                seq.extend_tokens(self._tokens[index, steps - owed:steps].tolist())


class StretchResult(StepResult):
    """A stretch's ``StepResult`` (``DecodeStretch.result``): ``batch`` and ``output`` are the
    stretch's ``last_batch``, made on first read."""

    def __init__(self, stretch: DecodeStretch, steps: int, first_step: int,
                 finished: list[Sequence]) -> None:
        self.step = first_step + steps - 1
        self.finished = finished
        self.duration_s = stretch._last_output.duration_s  # type: ignore[assignment]
        self._stretch, self._steps, self._first = stretch, steps, first_step
        self._last: tuple[ScheduledBatch, StepOutput] | None = None

    def _made(self) -> tuple[ScheduledBatch, StepOutput]:
        if self._last is None:
            self._last = self._stretch.last_batch(self._steps, self._first)
        return self._last

    @property  # type: ignore[override]
    def batch(self) -> ScheduledBatch:
        return self._made()[0]

    @property  # type: ignore[override]
    def output(self) -> StepOutput:
        return self._made()[1]


def _unknown() -> int:
    """A count of claimed blocks not worked out: more than any pool holds."""
    return 1 << 62
