"""Property tests of the Scheduler + BlockManager, driven through ``EngineCore`` without a model.

Hypothesis generates workloads (``strategies.workloads``): a small config (KV pool size, block
size, ``max_num_seqs``, ``max_num_batched_tokens``, ``max_model_len``, policy ``prefill_first`` or
``chunked``, prefix caching, an EOS id), and requests with shared prefixes, edge-case prompt
lengths, ``max_tokens``, ``ignore_eos`` on or off, arrival steps and (for a few) an abort step.
``ScriptedExecutor`` plays the model: for each sampled sequence it returns the request's scripted
token for that completion position (so a recomputed sequence samples the same tokens, as greedy
decoding would, and EOS comes when the script says so), and it simulates the paged KV cache
itself: every computed token writes (position, digest of its whole prefix) into its slot, and
every token a step attends to must be found in its slot, so a block served from the prefix cache
or shared with another sequence must really hold that sequence's prefix.

Properties (each violation is reported under its name; ``run_workload`` collects all of them):

- ``admission``: exactly the inadmissible requests are rejected (computed here from the config:
  empty, longer than max_model_len, or the KV of every token it feeds exceeds the whole pool).
- ``completion``: every admitted request finishes with the scripted tokens up to its EOS (unless
  ignore_eos) or its length cap, with that reason, also after being preempted (recomputed); one
  aborted while unfinished (some are) finishes ``aborted`` with a strict prefix of them; the
  ``token_sampled`` and ``request_finished`` events (count, reason, output hash) say the same.
- ``bounded``: everything finishes within last arrival + sum(prompt + completion) steps (no
  starvation, no livelock); ``progress``: a step never comes back empty while work is queued.
- ``budget``: every step holds at most ``max_num_seqs`` sequences and ``max_num_batched_tokens``
  tokens; ``batch_shape``: under ``prefill_first`` a step is all prefill (only new admissions) or
  all decode (one token each, only running sequences); under ``chunked`` prefill work comes first
  and decodes compute one token.
- ``queue_order``: admission is first come first served with preempted sequences put back at the
  front (the waiting queue equals a model queue after every step).
- ``victim``: a preemption always takes the most recently admitted running sequence, and only to
  make room for an older one.
- ``kv``: every token a step computes has a slot, and every token it attends to is in its slot with
  the right prefix (simulated KV cache); a step starts where the sequence's computed count says.
- ``prefix_index`` (prefix caching on): every full block whose KV a step has computed carries the
  chain hash of the sequence's own tokens (it was entered into the prefix cache).
- ``drained``: after the last request, no sequence is queued, every block is free with refcount 0.

The last two tests check that the events of such runs replay identically (``replay.verify``) and
survive the Parquet round trip (``tracing.recorder`` / ``tracing.reader``).
"""

from __future__ import annotations

import itertools
from collections import deque
from dataclasses import dataclass, field
from typing import Any

import hypothesis.strategies as st
import numpy as np
import pytest
import xxhash
from hypothesis import event, example, given, settings, target
from strategies import (
    RequestSpec,
    Workload,
    completion_cap,
    expected_completion,
    is_admissible,
    scaled,
    workloads,
)

from engine.batch import ScheduledBatch, StepOutput
from engine.block_manager import chain_hash
from engine.config import Config
from engine.engine_core import EngineCore
from engine.executor import DoneStep
from engine.sampling_params import SamplingParams
from engine.sequence import PENDING_TOKEN, Sequence, SequenceStatus
from tracing.events import EVENT_KINDS, MEASURED_COLUMNS, NO_HASH, NO_SEQ
from tracing.sink import MemorySink


class PropertyViolations(AssertionError):
    """One or more named properties failed on a workload."""


def signed_xxh64_of_int32(tokens: list[int]) -> int:
    digest = xxhash.xxh64_intdigest(np.asarray(tokens, dtype=np.int32).tobytes())
    return digest - (1 << 64) if digest >= 1 << 63 else digest


class ScriptedExecutor:
    """The model, simulated: scripted tokens per completion position and a simulated KV cache."""

    def __init__(self, config: Config, run: Run, overlap: bool = False) -> None:
        self.num_kvcache_blocks = config.num_kvcache_blocks
        self.block_size = config.kvcache_block_size
        self.run = run
        self.scripts: dict[int, tuple[int, ...]] = {}
        self.kv: dict[tuple[int, int], tuple[int, int]] = {}
        self.digests: dict[int, list[int]] = {}
        # ``overlap``: accept launch(), as a GPU runner does; EngineCore then overlaps steps.
        self.supports_overlap = overlap
        self._pending_values: dict[int, int] = {}

    def launch(self, batch: ScheduledBatch, previous: Any = None) -> DoneStep:
        """Like a runner: a pending input token is read from the step that samples it."""
        if previous is not None:
            tokens = previous.result().token_ids
            self._pending_values = dict(zip(previous.seq_ids, tokens))
        try:
            output = self.execute(batch)
        finally:
            self._pending_values = {}
        return DoneStep(output, [seq.seq_id for seq in batch.sampled_seqs])

    def _digests(self, seq: Sequence) -> list[int]:
        """digest[p] identifies the token prefix [0, p] of ``seq`` (what the KV at p depends on)."""
        known = self.digests.setdefault(seq.seq_id, [])
        for pos in range(len(known), seq.num_tokens):
            token = seq.token_ids[pos]
            if token == PENDING_TOKEN:
                token = self._pending_values[seq.seq_id]
            known.append(hash((known[-1] if known else 0, token)))
        return known

    def _check_registered(self, seq: Sequence, ctx: int) -> None:
        """Every full block of the first ``ctx`` tokens (KV computed by the end of this step) is
        hashed (entered in the prefix cache) with the chain hash of the sequence's own tokens."""
        bm = self.run.core.scheduler.block_manager
        bs, parent = self.block_size, NO_HASH
        if ctx and seq.token_ids[ctx - 1] == PENDING_TOKEN:
            ctx -= 1  # a block completed by a pending token is hashed when its value is in
        for i in range(ctx // bs):
            parent = chain_hash(seq.token_ids[i * bs : (i + 1) * bs], parent, bm.hash_seed)
            block = bm.blocks[seq.block_table[i]]
            if block.hash != parent:
                self.run.check(
                    False,
                    "prefix_index",
                    f"seq {seq.seq_id}: block {i} ({block}) of its computed tokens is not hashed "
                    f"as {parent}",
                )
                return

    def execute(self, batch: ScheduledBatch) -> StepOutput:
        check, bs = self.run.check, self.block_size
        work = list(zip(batch.seqs, batch.num_new_tokens, batch.context_lens))
        if self.run.workload.config.enable_prefix_caching:
            for seq, _, ctx in work:
                self._check_registered(seq, min(ctx, len(seq.block_table) * bs))
        for seq, new, ctx in work:
            check(
                1 <= new <= ctx <= seq.num_tokens,
                "kv",
                f"seq {seq.seq_id}: computes {new} tokens ending at {ctx} of {seq.num_tokens}",
            )
            check(
                ctx - new == seq.num_computed_tokens,
                "kv",
                f"seq {seq.seq_id}: starts at {ctx - new}, computed {seq.num_computed_tokens}",
            )
            check(
                len(seq.block_table) * bs >= ctx,
                "kv",
                f"seq {seq.seq_id}: {ctx} tokens of context in {len(seq.block_table)} blocks",
            )
            digests = self._digests(seq)
            for pos in range(max(0, ctx - new), min(ctx, len(seq.block_table) * bs)):
                self.kv[(seq.block_table[pos // bs], pos % bs)] = (pos, digests[pos])
        for seq, _, ctx in work:
            digests = self._digests(seq)
            for pos in range(min(ctx, len(seq.block_table) * bs)):
                slot = (seq.block_table[pos // bs], pos % bs)
                if self.kv.get(slot) != (pos, digests[pos]):
                    check(
                        False,
                        "kv",
                        f"seq {seq.seq_id} attends to token {pos} in block {slot[0]} slot "
                        f"{slot[1]}, which holds {self.kv.get(slot)} (another prefix)",
                    )
                    break
        tokens = []
        for seq in batch.sampled_seqs:
            position = seq.num_tokens - seq.num_prompt_tokens
            script = self.scripts[seq.seq_id]
            check(position < len(script), "completion", f"seq {seq.seq_id} sampled past max_tokens")
            tokens.append(script[min(position, len(script) - 1)])
        return StepOutput(token_ids=tokens, duration_s=0.0, padded_batch_size=len(batch.seqs))

    def describe(self) -> dict[str, Any]:
        return {"executor": "scripted-test", "device": "none"}

    def close(self) -> None:
        pass


@dataclass
class Run:
    """One workload run: the engine, what the test observed, and the violations it found."""

    workload: Workload
    core: EngineCore | None = None
    sink: Any = None
    seqs: dict[int, tuple[RequestSpec, Sequence]] = field(default_factory=dict)
    violations: dict[str, list[str]] = field(default_factory=dict)
    steps: int = 0
    preempted: set[int] = field(default_factory=set)
    aborted: set[int] = field(default_factory=set)

    def check(self, ok: bool, prop: str, message: str) -> None:
        if not ok:
            self.violations.setdefault(prop, []).append(message)

    def raise_violations(self) -> None:
        if self.violations:
            lines = [f"properties violated: {', '.join(sorted(self.violations))}"]
            lines.append(f"  workload: {self.workload.describe()}")
            for prop, messages in sorted(self.violations.items()):
                lines += [f"  {prop}: {m}" for m in messages[:3]]
            raise PropertyViolations("\n".join(lines))


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
            bm.num_free_blocks == bm.num_blocks == len(set(bm.free_block_ids)),
            "drained",
            f"{bm.num_free_blocks} of {bm.num_blocks} blocks free at the end",
        )
        held = [b for b in bm.blocks if b.ref_count != 0]
        check(not held, "drained", f"blocks with a refcount at the end: {held}")


# --- workloads that certainly preempt (so the preemption properties are never vacuous) -----------
def _preempting_workload(policy: str) -> Workload:
    """Three requests share a 2-token prefix; a 4-block pool cannot hold them as they grow."""
    config = Config(
        kvcache_block_size=2,
        num_kvcache_blocks=4,
        max_model_len=8,
        max_num_batched_tokens=8,
        max_num_seqs=4,
        policy=policy,
        eos=1,
    )
    requests = (
        RequestSpec(0, (2, 3, 4), 4, True, (5, 1, 5, 5)),
        RequestSpec(0, (2, 3, 5), 4, False, (4, 4, 1, 4)),
        RequestSpec(1, (2, 3, 4, 4, 4), 3, True, (3, 3, 3)),
    )
    return Workload(config, requests)


def _victim_choice_workload(policy: str) -> Workload:
    """Three sequences decode in lock step until the pool runs out; which one is preempted
    depends on the victim rule (the newest), since two others remain behind the one needing room."""
    config = Config(
        kvcache_block_size=2,
        num_kvcache_blocks=6,
        max_model_len=16,
        max_num_batched_tokens=16,
        max_num_seqs=4,
        policy=policy,
    )
    requests = tuple(RequestSpec(0, (i, 5), 6, True, (2, 3, 4, 5, 2, 3)) for i in range(3))
    return Workload(config, requests)


PREEMPTING = [_preempting_workload("prefill_first"), _preempting_workload("chunked")]
PREEMPTING += [_victim_choice_workload("prefill_first"), _victim_choice_workload("chunked")]


@pytest.mark.parametrize(
    "workload",
    PREEMPTING,
    ids=["shared-prefill_first", "shared-chunked", "victim-prefill_first", "victim-chunked"],
)
def test_hand_made_workloads_preempt_and_share_prefixes(workload: Workload) -> None:
    """The explicit examples given to the property really preempt (the first two also hit the
    prefix cache; the last two preempt with two sequences left to choose the victim from), and
    satisfy every property: a guard against the generated properties being vacuous."""
    run = run_workload(workload)
    run.raise_violations()
    tables = run.sink.tables
    assert tables["preempted"]["seq_id"], "the workload must preempt"
    if workload.requests[0].prompt[:2] == (2, 3):
        assert tables["block_hit"]["seq_id"], "the workload must hit the prefix cache"


@settings(max_examples=scaled(2.0))
@given(workload=workloads())
@example(workload=PREEMPTING[0])
@example(workload=PREEMPTING[1])
@example(workload=PREEMPTING[2])
@example(workload=PREEMPTING[3])
def test_scheduler_properties(workload: Workload) -> None:
    """Admission, completion, no starvation, budgets, batch shape, queue order, preemption victim,
    KV-cache contents and the final drained pool hold for every generated workload, under both
    policies (see the module docstring for each property)."""
    run = run_workload(workload)
    _label_coverage(run)
    target(float(len(run.sink.tables["preempted"]["seq_id"])), label="preemptions")
    run.raise_violations()


def _label_coverage(run: Run) -> None:
    """Hypothesis statistics (``--hypothesis-show-statistics``): how often each situation arose."""
    tables = run.sink.tables
    policy = run.workload.config.policy
    event(f"policy {policy}")
    if tables["preempted"]["seq_id"]:
        event(f"{policy}: preempted")
    if tables["block_hit"]["seq_id"]:
        event("prefix-cache hit")
    reasons = set(tables["request_finished"]["reason"])
    for reason in sorted(reasons):
        event(f"finished: {reason}")
    kinds = set(tables["batch_scheduled"]["kind"])
    if "mixed" in kinds:
        event("chunked: mixed batch")
    if any(
        n == run.workload.config.max_num_batched_tokens
        for n in tables["batch_scheduled"]["num_batched_tokens"]
    ):
        event("token budget reached exactly")


# --- replay and the Parquet round trip ------------------------------------------------------------
def _decision_columns(kind: str, cols: dict[str, list]) -> dict[str, list]:
    measured = MEASURED_COLUMNS.get(kind, frozenset())
    return {
        name: [list(v) if isinstance(v, (list, tuple, np.ndarray)) else v for v in values]
        for name, values in cols.items()
        if name not in measured
    }


@settings(max_examples=scaled(0.5))
@given(workload=workloads())
@example(workload=PREEMPTING[0])
@example(workload=PREEMPTING[1])
def test_recorded_events_replay_identically(workload: Workload) -> None:
    """``replay.verify.verify_events`` re-drives the engine's scheduler from the in-memory
    recording of a generated run and finds every decision event identical (replay == record)."""
    verify = pytest.importorskip("replay.verify", reason="replay/verify.py is not there yet")
    run = run_workload(workload, observe=False)
    run.raise_violations()
    result = verify.verify_events(run.sink.header, run.sink.tables)
    assert result.identical, "properties violated: replay\n" + result.report()
    assert result.num_events == sum(len(c["event_id"]) for c in run.sink.tables.values()), (
        "properties violated: replay\n  verify did not see every recorded event"
    )


@settings(max_examples=scaled(0.25))
@given(workload=workloads(), flush_steps=st.integers(1, 8))
@example(workload=PREEMPTING[1], flush_steps=2)
def test_events_survive_the_parquet_round_trip(
    workload: Workload, flush_steps: int, tmp_path_factory: pytest.TempPathFactory
) -> None:
    """A run recorded with ``ParquetRecorder`` (in segments of ``flush_steps`` steps) reads back
    with ``read_trace`` as exactly the events an in-memory recording of the same run holds (every
    column but the measured ones), and the trace read back verifies identically."""
    recorder = pytest.importorskip("tracing.recorder", reason="tracing/recorder.py not there yet")
    reader = pytest.importorskip("tracing.reader", reason="tracing/reader.py is not there yet")
    verify = pytest.importorskip("replay.verify", reason="replay/verify.py is not there yet")
    in_memory = run_workload(workload, observe=False)
    in_memory.raise_violations()
    memory = in_memory.sink
    trace_dir = tmp_path_factory.mktemp("trace") / "t"
    sink = recorder.ParquetRecorder(
        trace_dir, flush_steps=flush_steps, background=False, fsync=False
    )
    run_workload(workload, sink=sink, observe=False).raise_violations()
    trace = reader.read_trace(trace_dir)
    assert trace.complete, "properties violated: parquet_round_trip\n  trace not complete"
    for kind in EVENT_KINDS:
        expected = _decision_columns(kind, memory.tables[kind])
        got = _decision_columns(kind, trace.table(kind).to_pydict())
        assert got == expected, (
            f"properties violated: parquet_round_trip\n  {kind} differs after the round trip"
        )
    result = verify.verify(trace)
    assert result.identical, "properties violated: replay\n" + result.report()
