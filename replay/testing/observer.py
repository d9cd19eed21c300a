"""Per-step checks of a workload run: what needs the state before a step and its events.

``StepObserver.step`` runs one engine step and checks, by name:

- ``budget``: at most ``max_num_seqs`` sequences (no duplicates) and ``max_num_batched_tokens``
  tokens a step (any policy).
- ``overlapped``: ``model_step.overlapped`` is set exactly when the previous step could be
  deferred (a decode that cannot end early, with free blocks for every claim the next decodes can
  make), nothing was aborted since, no idle step came between, the policy does not admit in the
  same pass with requests waiting (unless ``overlap_mixed_steps``), and this step decodes (or is
  mixed, under ``overlap_mixed_steps``) (any policy).
- For the built-in policies, their rules: ``queue_order`` (admission first come first served, by
  priority under ``priority``; preempted sequences back at the front; the running queue stays in
  admission order), ``victim`` (the newest running sequence, the lowest priority first under
  ``priority``, only for an older one of the batch or one the step then preempts too: a victim
  sharing its blocks frees none), ``batch_shape`` (prefill_first/priority: a step is all
  admissions or all decodes; chunked: prefill work first, decodes one token, the kind label
  matches) and ``maximality`` (the scheduler stops admitting, chunking or decoding only when a
  budget or the pool runs out).
"""

from __future__ import annotations

import itertools
from collections import deque
from typing import Any

from engine.policy import BUILTIN_POLICIES, NoProgressError, PolicyError, policy_class
from replay.testing.scripted import Run
from tracing.schema import NO_SEQ

WHOLE_PROMPT = ("prefill_first", "priority")


def step_failure(exc: BaseException) -> str:
    """The property an exception out of ``EngineCore.step`` violates: ``policy`` for a policy's
    impossible answer or exception, ``progress`` for a step that scheduled nothing (a user
    policy's ``NoProgressError``, a built-in's ``RuntimeError``)."""
    if isinstance(exc, PolicyError) and not isinstance(exc, NoProgressError):
        return "policy"
    return "progress"


class Stop(Exception):
    """The run cannot continue (the engine raised)."""


def takes_pending(config: Any, kind: str) -> bool:
    """Whether a step of ``kind`` may run on input tokens still on the device (our reading)."""
    return kind == "decode" or (kind == "mixed" and config.overlap_mixed_steps)


def expected_defer(run: Run, batch: Any) -> bool:
    """Whether the engine may post-process ``batch`` before its tokens are in (our own reading
    of the rule, from the state at its launch)."""
    config = run.workload.config
    if not config.async_scheduling or not takes_pending(config, batch.kind) or \
            run.at_launch is None:
        return False
    if config.eos >= 0 and not all(seq.ignore_eos for seq in batch.sampled_seqs):
        return False
    free, running = run.at_launch
    if free >= len(running):
        return True
    if config.defer_block_rule == "per_running":
        return False
    sampled = {seq.seq_id for seq in batch.sampled_seqs}
    bs = config.kvcache_block_size
    claims = sum(n + (sid in sampled) > blocks * bs for sid, n, blocks in running)
    return free >= claims


class StepObserver:
    """Checks that need the state before a step and the events of the step."""

    WATCHED = ("preempted", "block_allocated", "block_hit")

    def __init__(self, run: Run) -> None:
        self.run = run
        self.core = run.core
        self.config = run.core.config
        policy = self.config.policy
        self.builtin = policy if policy in BUILTIN_POLICIES else None
        self.mixed = policy_class(policy).mixed_batches
        self.offsets = dict.fromkeys(self.WATCHED, 0)
        self.queue: deque[int] = deque()  # model of the waiting queue
        self.rank: dict[int, int] = {}  # admission order: larger = more recently admitted
        self.next_rank = itertools.count()
        self.deferred_last = False

    def arrived(self, seq_id: int) -> None:
        self.queue.append(seq_id)

    def aborted(self, seq_id: int) -> None:
        if seq_id in self.queue:
            self.queue.remove(seq_id)
        self.deferred_last = False

    def _new_rows(self) -> list[tuple[int, str, dict[str, int]]]:
        tables = self.core.events.tables
        rows = []
        for kind in self.WATCHED:
            cols = tables[kind]
            start, end = self.offsets[kind], len(cols["event_id"])
            for i in range(start, end):
                rows.append((cols["event_id"][i], kind, {k: v[i] for k, v in cols.items()}))
            self.offsets[kind] = end
        rows.sort(key=lambda r: r[0])
        return rows

    def _prio(self, seq_id: int) -> int:
        return self.core.scheduler.priority(self.core.sequences[seq_id])

    def _admission_order(self, queue: list[int]) -> list[int]:
        if self.builtin == "priority":
            return sorted(queue, key=lambda s: (self._prio(s), queue.index(s)))
        return list(queue)

    def step(self) -> bool:
        """Run one engine step with its checks; False when the engine had nothing to do."""
        run, core = self.run, self.core
        check = run.check
        scheduler = core.scheduler
        running_before = [s.seq_id for s in scheduler.running]
        waiting_before = [s.seq_id for s in scheduler.waiting]
        free_before = len(scheduler.block_manager.free_block_ids)
        # Admitting in the pass that appends decode tokens waits for their values, unless those
        # blocks enter the cache only after the pass (``overlap_mixed_steps``).
        waits = self.mixed and bool(waiting_before) and not self.config.overlap_mixed_steps
        may_overlap = self.deferred_last and not waits
        try:
            result = core.step()
        except (RuntimeError, PolicyError) as exc:
            check(False, step_failure(exc), f"step {run.steps}: {exc}")
            raise Stop() from None
        if result is None:
            check(not core.has_unfinished(), "progress",
                  f"step {run.steps}: no batch with {len(scheduler.waiting)} waiting, "
                  f"{len(scheduler.running)} running")
            self.deferred_last = False
            return False
        batch = result.batch
        expected = may_overlap and takes_pending(self.config, batch.kind)
        check(batch.overlapped == expected, "overlapped",
              f"step {run.steps}: {batch.kind} step overlapped={batch.overlapped}, expected "
              f"{expected}")
        self.deferred_last = expected_defer(run, batch)
        ids = [s.seq_id for s in batch.seqs]
        new = batch.num_new_tokens
        check(len(ids) == len(set(ids)) and 1 <= len(ids) <= self.config.max_num_seqs, "budget",
              f"step {run.steps}: {len(ids)} sequences {ids}, max_num_seqs="
              f"{self.config.max_num_seqs}")
        check(sum(new) == batch.num_batched_tokens <= self.config.max_num_batched_tokens,
              "budget", f"step {run.steps}: {sum(new)} tokens (batch says "
              f"{batch.num_batched_tokens}), max_num_batched_tokens="
              f"{self.config.max_num_batched_tokens}")
        admitted, victims = self._queue_and_victims(running_before, ids)
        if self.builtin is not None:
            self._batch_shape(batch, ids, admitted, running_before)
            self._maximality(batch, ids, admitted, victims, running_before, waiting_before,
                             free_before)
        return True

    def _queue_and_victims(self, running_before: list[int], ids: list[int]
                           ) -> tuple[list[int], list[int]]:
        """Admissions and preemptions of this step, in emission order, against the model."""
        run, check = self.run, self.run.check
        admitted: list[int] = []
        victims: list[int] = []
        needs: list[tuple[int, int]] = []  # (victim, the sequence it made room for)
        ordered = self.builtin is not None
        for _, kind, row in self._new_rows():
            if kind == "preempted":
                victim = row["seq_id"]
                needy = victim if row["for_seq_id"] == NO_SEQ else row["for_seq_id"]
                # Under priority: the sequence needing the block and those behind it in the
                # running queue; the newest of all is always among them.
                candidates = [s for s in running_before if s not in victims and (
                    self.builtin != "priority" or self.rank[s] >= self.rank.get(needy, -1))]
                if ordered:
                    key = ((lambda s: (self._prio(s), self.rank[s])) if self.builtin == "priority"
                           else self.rank.__getitem__)
                    worst = max(candidates, key=key, default=None)
                    check(victim == worst, "victim", f"step {run.steps}: preempted seq {victim},"
                          f" the policy's victim among the running is {worst}")
                for_seq = row["for_seq_id"]
                if for_seq != NO_SEQ:
                    needs.append((victim, for_seq))
                victims.append(victim)
                run.preempted.add(victim)
                self.queue.appendleft(victim)
            elif row["logical_index"] == 0:
                seq_id = row["seq_id"]
                if ordered:
                    order = self._admission_order(list(self.queue))
                    head = order[0] if order else None
                    check(seq_id == head, "queue_order",
                          f"step {run.steps}: admitted seq {seq_id}, the policy's next is {head}")
                if seq_id in self.queue:
                    self.queue.remove(seq_id)
                admitted.append(seq_id)
                self.rank[seq_id] = next(self.next_rank)
        # The sequence a victim made room for runs in this batch, unless the step preempted it
        # too: a victim whose blocks are shared (prefix hits) frees none by its release, so the
        # needy one may end as its own victim (vLLM's loop does the same).
        for victim, for_seq in needs:
            check((for_seq in ids or for_seq in victims)
                  and self.rank[for_seq] < self.rank.get(victim, -1),
                  "victim", f"step {run.steps}: seq {victim} preempted for {for_seq}, which is "
                  "neither an older sequence of this batch nor preempted in this step")
        waiting_now = [s.seq_id for s in self.core.scheduler.waiting]
        check(waiting_now == list(self.queue), "queue_order",
              f"step {run.steps}: waiting queue {waiting_now}, model {list(self.queue)}")
        if ordered:
            running_now = [s.seq_id for s in self.core.scheduler.running]
            check(running_now == sorted(running_now, key=self.rank.__getitem__), "queue_order",
                  f"step {run.steps}: running queue {running_now} is not in admission order")
        return admitted, victims

    def _batch_shape(self, batch: Any, ids: list[int], admitted: list[int],
                     running_before: list[int]) -> None:
        run, check = self.run, self.run.check
        num_prefill = batch.num_prefill_seqs
        decode_new = batch.num_new_tokens[num_prefill:]
        check(all(n == 1 for n in decode_new), "batch_shape",
              f"step {run.steps}: decode sequences compute {decode_new} tokens")
        if self.builtin in WHOLE_PROMPT:
            if batch.kind == "prefill":
                check(ids == admitted and num_prefill == len(ids), "batch_shape",
                      f"step {run.steps}: prefill step runs {ids}, admitted {admitted}")
            else:
                check(batch.kind == "decode" and num_prefill == 0 and not admitted
                      and set(ids) <= set(running_before), "batch_shape",
                      f"step {run.steps}: {batch.kind} step mixes in {ids} (running "
                      f"{running_before}, admitted {admitted})")
            return
        label = {(True, False): "prefill", (False, True): "decode"}.get(
            (num_prefill > 0, num_prefill < len(ids)), "mixed")
        check(batch.kind == label and set(admitted) <= set(ids[:num_prefill]), "batch_shape",
              f"step {run.steps}: kind {batch.kind} with {num_prefill} prefills of {ids}")

    def _maximality(self, batch: Any, ids: list[int], admitted: list[int], victims: list[int],
                    running_before: list[int], waiting_before: list[int],
                    free_before: int) -> None:
        """The scheduler stops only when a budget or the pool runs out."""
        run, check, config = self.run, self.run.check, self.config
        seqs = self.core.sequences
        budget, used = config.max_num_batched_tokens, batch.num_batched_tokens
        seqs_full = len(ids) >= config.max_num_seqs
        tokens_full = used >= budget
        free_now = self.core.events.tables["batch_scheduled"]["free_blocks"][-1]
        bm = self.core.scheduler.block_manager
        # The queue admission saw: a mixed-batch step preempts before it admits.
        queue = waiting_before if self.builtin in WHOLE_PROMPT else [*victims[::-1],
                                                                    *waiting_before]
        order = [s for s in self._admission_order(queue) if s not in admitted]
        nxt = order[0] if order else None
        if self.builtin in WHOLE_PROMPT:
            if batch.kind == "prefill" and nxt is not None and not seqs_full:
                need = seqs[nxt].num_tokens
                check(need > budget - used or bm.blocks_needed(need) > free_now, "maximality",
                      f"step {run.steps}: seq {nxt} ({need} tokens) not admitted with "
                      f"{budget - used} tokens and {free_now} blocks left")
            if batch.kind == "decode" and nxt is not None:
                need = seqs[nxt].num_tokens
                check(need > budget or bm.blocks_needed(need) > free_before, "maximality",
                      f"step {run.steps}: decoded while seq {nxt} ({need} tokens) fit "
                      f"{free_before} free blocks")
        else:
            sampled = {s.seq_id for s in batch.sampled_seqs}
            prefills = zip(batch.seqs[: batch.num_prefill_seqs], batch.num_new_tokens)
            for seq, new in prefills:
                check(seq.seq_id in sampled or tokens_full, "maximality",
                      f"step {run.steps}: seq {seq.seq_id} got a chunk of {new} tokens with "
                      f"{budget - used} of the budget left")
            if nxt is not None and not (seqs_full or tokens_full):
                need = seqs[nxt].num_tokens
                check(bm.blocks_needed(need) > free_now, "maximality",
                      f"step {run.steps}: seq {nxt} not admitted with {budget - used} tokens, "
                      f"{config.max_num_seqs - len(ids)} sequences and {free_now} blocks left")
        skipped = [s for s in running_before if s not in ids and s not in victims]
        check(not skipped or seqs_full or tokens_full or batch.kind == "prefill"
              and self.builtin in WHOLE_PROMPT, "maximality",
              f"step {run.steps}: running seqs {skipped} left out with {budget - used} tokens "
              f"and {config.max_num_seqs - len(ids)} sequences left")
