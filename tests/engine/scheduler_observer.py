"""Driving a generated workload through ``EngineCore`` and checking the scheduler properties
named in ``test_scheduler_properties`` after every step (``_Observer``) and at the end
(``_check_outcome``); ``run_workload`` collects every violation in its ``Run``.
"""

from __future__ import annotations

import itertools
from collections import deque
from typing import Any

from scripted_engine import Run, ScriptedExecutor, signed_xxh64_of_int32
from strategies import (
    Workload,
    completion_cap,
    expected_completion,
    is_admissible,
)

from engine.engine_core import EngineCore
from engine.sampling_params import SamplingParams
from engine.sequence import SequenceStatus
from tracing.schema import NO_SEQ
from tracing.sink import MemorySink


class _Observer:
    """Per-step checks that need the state before the step and the events of the step."""

    WATCHED = ("preempted", "block_allocated", "block_hit")

    def __init__(self, run: Run) -> None:
        self.run = run
        self.core = run.core
        self.config = run.core.config
        self.offsets = dict.fromkeys(self.WATCHED, 0)
        self.queue: deque[int] = deque()  # model of the waiting queue
        self.rank: dict[int, int] = {}  # admission order: larger = more recently admitted
        self.next_rank = itertools.count()

    def arrived(self, seq_id: int) -> None:
        self.queue.append(seq_id)

    def aborted(self, seq_id: int) -> None:
        if seq_id in self.queue:
            self.queue.remove(seq_id)

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

    def step(self) -> bool:
        """Run one engine step with its checks; False when the engine had nothing to do."""
        run, core, config = self.run, self.core, self.config
        check = run.check
        scheduler = core.scheduler
        running_before = [s.seq_id for s in scheduler.running]
        try:
            result = core.step()
        except RuntimeError as exc:
            check(False, "progress", f"step {run.steps}: {exc}")
            raise _Stop() from None
        if result is None:
            check(
                not core.has_unfinished(),
                "progress",
                f"step {run.steps}: no batch with {len(scheduler.waiting)} waiting, "
                f"{len(scheduler.running)} running",
            )
            return False
        batch = result.batch
        ids = [s.seq_id for s in batch.seqs]
        # Admissions and preemptions of this step, in emission order.
        admitted: list[int] = []
        victims: list[int] = []
        for _, kind, row in self._new_rows():
            if kind == "preempted":
                victim = row["seq_id"]
                candidates = [s for s in running_before if s not in victims]
                newest = max(candidates, key=self.rank.__getitem__, default=None)
                check(
                    victim == newest,
                    "victim",
                    f"step {run.steps}: preempted seq {victim}, the newest running is {newest}",
                )
                for_seq = row["for_seq_id"]
                if for_seq != NO_SEQ:
                    check(
                        for_seq in ids and self.rank[for_seq] < self.rank.get(victim, -1),
                        "victim",
                        f"step {run.steps}: seq {victim} preempted for {for_seq}, which is not "
                        "an older sequence of this batch",
                    )
                victims.append(victim)
                run.preempted.add(victim)
                self.queue.appendleft(victim)
            elif row["logical_index"] == 0:
                seq_id = row["seq_id"]
                head = self.queue[0] if self.queue else None
                check(
                    seq_id == head,
                    "queue_order",
                    f"step {run.steps}: admitted seq {seq_id}, the head of the queue is {head}",
                )
                if seq_id in self.queue:
                    self.queue.remove(seq_id)
                admitted.append(seq_id)
                self.rank[seq_id] = next(self.next_rank)
        waiting_now = [s.seq_id for s in scheduler.waiting]
        check(
            waiting_now == list(self.queue),
            "queue_order",
            f"step {run.steps}: waiting queue {waiting_now}, model {list(self.queue)}",
        )
        # Budgets.
        new = batch.num_new_tokens
        check(
            len(ids) == len(set(ids)) and 1 <= len(ids) <= config.max_num_seqs,
            "budget",
            f"step {run.steps}: {len(ids)} sequences {ids}, max_num_seqs={config.max_num_seqs}",
        )
        check(
            sum(new) == batch.num_batched_tokens <= config.max_num_batched_tokens,
            "budget",
            f"step {run.steps}: {sum(new)} tokens (batch says {batch.num_batched_tokens}), "
            f"max_num_batched_tokens={config.max_num_batched_tokens}",
        )
        # Shape of the step.
        num_prefill = batch.num_prefill_seqs
        decode_new = new[num_prefill:]
        check(
            all(n == 1 for n in decode_new),
            "batch_shape",
            f"step {run.steps}: decode sequences compute {decode_new} tokens",
        )
        if config.policy == "prefill_first":
            if batch.kind == "prefill":
                check(
                    ids == admitted and num_prefill == len(ids),
                    "batch_shape",
                    f"step {run.steps}: prefill step runs {ids}, admitted {admitted}",
                )
            else:
                check(
                    batch.kind == "decode"
                    and num_prefill == 0
                    and not admitted
                    and set(ids) <= set(running_before),
                    "batch_shape",
                    f"step {run.steps}: {batch.kind} step mixes in {ids} (running {running_before},"
                    f" admitted {admitted})",
                )
        else:
            check(
                batch.kind
                == {(True, False): "prefill", (False, True): "decode"}.get(
                    (num_prefill > 0, num_prefill < len(ids)), "mixed"
                )
                and set(admitted) <= set(ids[:num_prefill]),
                "batch_shape",
                f"step {run.steps}: kind {batch.kind} with {num_prefill} prefills of {ids}",
            )
        return True


class _Stop(Exception):
    """The run cannot continue (the engine raised)."""


def run_workload(
    workload: Workload, sink: Any = None, observe: bool = True, overlap: bool = False
) -> Run:
    """Drive ``workload`` through an EngineCore step by step; collect every property violation.

    Requests are added at their arrival step (driver steps count idle ones too); the run stops when
    all have arrived and none is unfinished, or when the step bound is passed. ``overlap``: the
    executor launches asynchronously, so EngineCore overlaps steps where it can (the observer,
    which checks the state after every step, needs ``observe=False`` then).
    """
    config = workload.config
    run = Run(workload)
    executor = ScriptedExecutor(config, run, overlap)
    ticks = itertools.count()
    run.sink = sink if sink is not None else MemorySink()
    run.core = core = EngineCore(config, executor, sink=run.sink, clock=lambda: next(ticks) * 1e-3)
    observer = _Observer(run) if observe else None
    order = sorted(range(len(workload.requests)), key=lambda i: workload.requests[i].arrival_step)
    requests = [workload.requests[i] for i in order]
    bound = max(r.arrival_step for r in requests) + 2
    bound += sum(
        len(r.prompt) + completion_cap(config, len(r.prompt), r.max_tokens)
        for r in requests
        if is_admissible(config, len(r.prompt), r.max_tokens)
    )
    next_request = 0
    try:
        for t in itertools.count():
            while next_request < len(requests) and requests[next_request].arrival_step <= t:
                spec = requests[next_request]
                next_request += 1
                params = SamplingParams(
                    temperature=0.0, max_tokens=spec.max_tokens, ignore_eos=spec.ignore_eos
                )
                seq = core.add_request(list(spec.prompt), params, arrival_s=float(t))
                executor.scripts[seq.seq_id] = spec.script
                run.seqs[seq.seq_id] = (spec, seq)
                if observer is not None and seq.status is SequenceStatus.WAITING:
                    observer.arrived(seq.seq_id)
            for seq_id, (spec, seq) in run.seqs.items():
                if spec.abort_step == t and not seq.is_finished:
                    core.abort(seq_id)
                    run.aborted.add(seq_id)
                    if observer is not None:
                        observer.aborted(seq_id)
            if next_request == len(requests) and not core.has_unfinished():
                break
            if t >= bound:
                run.check(False, "bounded", f"not drained after {t} steps (bound {bound})")
                break
            if observer is not None:
                if observer.step():
                    run.steps += 1
                continue
            try:
                if core.step() is not None:
                    run.steps += 1
            except RuntimeError as exc:
                run.check(False, "progress", f"step {run.steps}: {exc}")
                break
    except _Stop:
        pass
    core.close()
    if observe:
        _check_outcome(run)
    return run


def _check_outcome(run: Run) -> None:
    config, core, check = run.workload.config, run.core, run.check
    tables = run.sink.tables
    finished_rows: dict[int, list[tuple[str, int, int]]] = {}
    rf = tables["request_finished"]
    for sid, reason, n, h in zip(
        rf["seq_id"], rf["reason"], rf["num_completion_tokens"], rf["output_hash"]
    ):
        finished_rows.setdefault(sid, []).append((reason, n, h))
    sampled: dict[int, list[int]] = {}
    for sid, tok in zip(tables["token_sampled"]["seq_id"], tables["token_sampled"]["token_id"]):
        sampled.setdefault(sid, []).append(tok)
    for seq_id, (spec, seq) in run.seqs.items():
        admissible = is_admissible(config, len(spec.prompt), spec.max_tokens)
        if not admissible:
            check(
                seq.finish_reason == "rejected" and seq.seq_id in core.rejections,
                "admission",
                f"seq {seq_id} ({len(spec.prompt)} tokens, max_tokens {spec.max_tokens}) must be "
                f"rejected, finished {seq.finish_reason!r}",
            )
            check(
                not seq.completion_token_ids and seq_id not in sampled,
                "admission",
                f"rejected seq {seq_id} produced tokens",
            )
            continue
        check(
            seq.finish_reason != "rejected",
            "admission",
            f"admissible seq {seq_id} ({len(spec.prompt)} tokens, max_tokens {spec.max_tokens}) "
            f"was rejected: {core.rejections.get(seq_id)}",
        )
        tokens, reason = expected_completion(config, spec)
        if seq_id in run.aborted:
            # Aborted while unfinished: it keeps the tokens it had, a strict prefix of its output.
            n = len(seq.completion_token_ids)
            tokens, reason = tokens[:n], "aborted"
            check(
                n < len(expected_completion(config, spec)[0]),
                "completion",
                f"aborted seq {seq_id} has all of its tokens",
            )
        again = " (after preemption)" if seq_id in run.preempted else ""
        check(
            seq.status is SequenceStatus.FINISHED and seq.finish_reason == reason,
            "completion",
            f"seq {seq_id}{again}: status {seq.status.value}, reason {seq.finish_reason!r}, "
            f"expected {reason!r}",
        )
        check(
            seq.completion_token_ids == tokens and seq.prompt_token_ids == list(spec.prompt),
            "completion",
            f"seq {seq_id}{again}: completion {seq.completion_token_ids}, expected {tokens}",
        )
        check(
            sampled.get(seq_id, []) == tokens,
            "completion",
            f"seq {seq_id}: token_sampled events {sampled.get(seq_id)}, expected {tokens}",
        )
        check(
            finished_rows.get(seq_id) == [(reason, len(tokens), signed_xxh64_of_int32(tokens))],
            "completion",
            f"seq {seq_id}: request_finished rows {finished_rows.get(seq_id)}",
        )
    scheduler, bm = core.scheduler, core.scheduler.block_manager
    if not run.violations.get("bounded") and not run.violations.get("progress"):
        check(
            not scheduler.waiting and not scheduler.running,
            "drained",
            f"{len(scheduler.waiting)} waiting, {len(scheduler.running)} running at the end",
        )
        check(
            len(bm.free_block_ids) == bm.num_blocks == len(set(bm.free_block_ids)),
            "drained",
            f"{len(bm.free_block_ids)} of {bm.num_blocks} blocks free at the end",
        )
        held = [b for b in bm.blocks if b.ref_count != 0]
        check(not held, "drained", f"blocks with a refcount at the end: {held}")

