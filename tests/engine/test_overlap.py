"""Overlapped (async) scheduling decides and records exactly what the sequential loop does.

With an executor that launches asynchronously, ``EngineCore`` post-processes a step whose tokens
cannot change the next decision with placeholder tokens, schedules and launches the next step,
and only then waits for the tokens and fills them in (``Scheduler.postprocess_pending`` and
``resolve``, block hashes deferred in the block manager). These tests run the same workloads
through the sequential path and the overlapped path and require identical event streams (every
decision column, the ``overlapped`` flags included), the property suite's simulated-KV checks on
the overlapped run, and that the overlapped recording replays identically.
"""

from __future__ import annotations

import hypothesis.strategies as st
import numpy as np
from hypothesis import event, example, given, settings

from engine.config import DEFER_BLOCK_RULES, Config
from engine.engine_core import EngineCore
from engine.executor import NullExecutor
from engine.sampling_params import SamplingParams
from replay.testing.run import run_workload
from replay.testing.scripted import decision_columns
from replay.testing.strategies import RequestSpec, Workload, scaled, workloads
from replay.verify import verify_events
from tracing.schema import EVENT_KINDS
from tracing.sink import MemorySink


def _decisions(tables: dict[str, dict[str, list]]) -> dict[str, dict[str, list]]:
    return {kind: decision_columns(kind, tables[kind]) for kind in EVENT_KINDS}


def _roomy(workload: Workload) -> Workload:
    """The same workload with a pool large enough that most decode steps may overlap."""
    return Workload(workload.config.replace(num_kvcache_blocks=256), workload.requests)


def _reuse_workload(policy: str) -> Workload:
    """Request 1 arrives later with request 0's prompt plus its first sampled tokens: its blocks
    completed by decode tokens (hashed after their values came back) must be cache hits."""
    config = Config(
        kvcache_block_size=2,
        num_kvcache_blocks=64,
        max_model_len=32,
        max_num_batched_tokens=32,
        max_num_seqs=4,
        policy=policy,
        eos=1,
    )
    script = (2, 3, 4, 5, 2, 3, 4, 5)
    requests = (
        RequestSpec(0, (2, 3, 4), 8, True, script),
        RequestSpec(0, (5, 4), 6, True, (3, 3, 3, 3, 3, 3)),
        RequestSpec(7, (2, 3, 4, *script[:5]), 4, True, (4, 4, 4, 4)),
    )
    return Workload(config, requests)


REUSE = [_reuse_workload("prefill_first"), _reuse_workload("chunked")]

# Found by the deep profile: one-token blocks, a decode step deferred while another row's token
# is still on the device, so every block that schedule held (one whose value is in too) waits
# for resolve_pending; the property checker must not call that a missing hash.
HELD_WHILE_ANOTHER_PENDS = Workload(
    Config(num_kvcache_blocks=8, kvcache_block_size=1, max_model_len=12,
           max_num_batched_tokens=12, max_num_seqs=2, enable_prefix_caching=True),
    tuple(RequestSpec(arrival_step=0, prompt=(0,), max_tokens=n, ignore_eos=False,
                      script=(2,) * n, abort_step=None, priority=0)
          for n in (1, 1, 1, 1, 2, 7, 2, 1)),
)


def _check_same(workload: Workload) -> dict[str, dict[str, list]]:
    sequential = run_workload(workload, observe=False, overlap=False)
    sequential.raise_violations()
    overlapped = run_workload(workload, observe=False, overlap=True)
    overlapped.raise_violations()
    want, got = _decisions(sequential.sink.tables), _decisions(overlapped.sink.tables)
    for kind in EVENT_KINDS:
        assert got[kind] == want[kind], f"{kind} differs between overlapped and sequential runs"
    result = verify_events(overlapped.sink.header, overlapped.sink.tables)
    assert result.identical, result.report()
    return overlapped.sink.tables


@settings(max_examples=scaled(0.5))
@given(workload=workloads(), roomy=st.booleans(), rule=st.sampled_from(DEFER_BLOCK_RULES),
       mixed=st.booleans())
@example(workload=REUSE[0], roomy=False, rule="needed", mixed=True)
@example(workload=REUSE[1], roomy=False, rule="needed", mixed=True)
@example(workload=REUSE[1], roomy=False, rule="needed", mixed=False)
@example(workload=HELD_WHILE_ANOTHER_PENDS, roomy=False, rule="needed", mixed=True)
def test_overlapped_runs_decide_and_record_like_sequential_runs(
    workload: Workload, roomy: bool, rule: str, mixed: bool
) -> None:
    """Generated workloads (EOS, aborts, arrivals, preemption, both policies, both deferral
    rules, mixed steps deferred or not): the overlapped run's events equal the sequential run's,
    and they replay identically."""
    workload = _roomy(workload) if roomy else workload
    workload = Workload(workload.config.replace(defer_block_rule=rule,
                                                overlap_mixed_steps=mixed), workload.requests)
    tables = _check_same(workload)
    flags = tables["model_step"]["overlapped"]
    event("some steps overlapped" if any(flags) else "no step overlapped")


def test_decode_tokens_hashed_late_still_serve_prefix_hits() -> None:
    """In the hand-made reuse workload most decode steps overlap, and the late request hits
    blocks that were completed by tokens whose values arrived after the next step launched."""
    for workload in REUSE:
        tables = _check_same(workload)
        assert sum(tables["model_step"]["overlapped"]) >= 5
        hits = [s for s in tables["block_hit"]["seq_id"] if s == 2]
        assert len(hits) >= 3, "request 2 must hit the blocks request 0 filled while decoding"


def _null_run(overlap: bool, async_scheduling: bool = True) -> EngineCore:
    config = Config(num_kvcache_blocks=512, kvcache_block_size=16, max_model_len=512,
                    max_num_batched_tokens=2048, async_scheduling=async_scheduling)
    core = EngineCore(config, NullExecutor(512, overlap=overlap), sink=MemorySink())
    rng = np.random.default_rng(0)
    for _ in range(12):
        prompt = rng.integers(0, 1000, size=int(rng.integers(5, 80))).tolist()
        core.add_request(prompt, SamplingParams(0.6, int(rng.integers(1, 60)), ignore_eos=True))
    steps = 0
    while core.has_unfinished():
        if core.step() is not None:
            steps += 1
    assert steps == core.step_index, "every step is returned exactly once"
    core.close()
    return core


def test_results_come_back_in_order_and_complete() -> None:
    """Overlapped: step() returns every step once, in order; tokens are values, never pending."""
    core = _null_run(overlap=True)
    tokens = core.sink.tables["token_sampled"]["token_id"]
    assert min(tokens) >= 0
    assert any(core.sink.tables["model_step"]["overlapped"])


def test_async_scheduling_off_records_no_overlap() -> None:
    """``async_scheduling=False``: the flag is a decision, so it is False for every step, and the
    rest of the stream is unchanged."""
    on, off = _null_run(overlap=True), _null_run(overlap=True, async_scheduling=False)
    assert not any(off.sink.tables["model_step"]["overlapped"])
    a, b = _decisions(on.sink.tables), _decisions(off.sink.tables)
    a["model_step"].pop("overlapped"), b["model_step"].pop("overlapped")
    assert a == b


def _tight_workload(rule: str) -> Workload:
    """Four 10-token prompts decoding 20 tokens each in 6 blocks of 16: after admission fewer
    blocks are free than sequences run, and each sequence crosses into a second block once."""
    config = Config(kvcache_block_size=16, num_kvcache_blocks=6, max_model_len=64,
                    max_num_batched_tokens=256, max_num_seqs=4, defer_block_rule=rule)
    requests = tuple(RequestSpec(0, tuple(range(2 + i, 12 + i)), 20, True, (3,) * 20)
                     for i in range(4))
    return Workload(config, requests)


def test_the_needed_rule_defers_while_free_blocks_cover_the_next_claims() -> None:
    """With fewer free blocks than running sequences, "needed" still overlaps the decode steps
    in which no sequence starts a block (and stays exact: same events as sequential, preemption
    included); "per_running" overlaps only once sequences have finished or been preempted."""
    overlapped = {}
    for rule in DEFER_BLOCK_RULES:
        tables = _check_same(_tight_workload(rule))
        assert tables["preempted"]["seq_id"], "the pool must force a preemption"
        overlapped[rule] = sum(tables["model_step"]["overlapped"])
    assert overlapped["needed"] >= overlapped["per_running"] + 10, overlapped


def _admission_in_flight_workload(policy: str, overlap_mixed_steps: bool) -> Workload:
    """Request 1 arrives while request 0 decodes, its prompt request 0's prompt and first
    sampled tokens: it is admitted in the schedule right after a deferred decode step (whose
    tokens are still on the device) and hits the blocks request 0's decodes completed."""
    config = Config(kvcache_block_size=2, num_kvcache_blocks=64, max_model_len=32,
                    max_num_batched_tokens=32, max_num_seqs=4, policy=policy,
                    overlap_mixed_steps=overlap_mixed_steps)
    script = (2, 3, 4, 5, 2, 3, 4, 5)
    requests = (RequestSpec(0, (2, 3, 4), 8, True, script),
                RequestSpec(5, (2, 3, 4, *script[:4]), 4, True, (4, 4, 4, 4)))
    return Workload(config, requests)


def _admissions_in_flight(workload: Workload) -> int:
    """Run ``workload`` sequentially and overlapped (``_check_same``), checking at every
    admission that no block hash is pending and no admitted prompt holds a placeholder token;
    returns how many admissions were scheduled while a step's tokens were still on the device."""
    from engine.block_manager import BlockManager
    from engine.overlap_scheduler import OverlapScheduler
    from engine.sequence import PENDING_TOKEN
    from tracing.schema import NO_HASH

    allocate, schedule = BlockManager.allocate, OverlapScheduler.schedule
    flight = {"now": False, "admissions": 0}

    def watched_schedule(self: OverlapScheduler):  # noqa: ANN202
        flight["now"] = any(seq.last_token == PENDING_TOKEN for seq in self.running)
        return schedule(self)

    def checked_allocate(self: BlockManager, seq) -> None:  # noqa: ANN001
        if self.hold_decode_blocks:  # held to the end of the pass: none of them is in the cache
            assert all(self.blocks[s.block_table[i]].hash == NO_HASH
                       for s, i, _, _ in self.pending_hashes), "a held block is in the cache"
        else:
            assert not self.pending_hashes, "an admission read the cache with a hash pending"
        assert PENDING_TOKEN not in seq.token_ids, "an admitted prompt holds a placeholder token"
        flight["admissions"] += flight["now"]
        allocate(self, seq)

    BlockManager.allocate, OverlapScheduler.schedule = checked_allocate, watched_schedule
    try:
        _check_same(workload)
    finally:
        BlockManager.allocate, OverlapScheduler.schedule = allocate, schedule
    return flight["admissions"]


@settings(max_examples=scaled(0.25))
@given(workload=workloads(), roomy=st.booleans(), mixed=st.booleans())
def test_no_admission_reads_the_cache_while_a_block_hash_is_pending(
    workload: Workload, roomy: bool, mixed: bool
) -> None:
    """Without ``overlap_mixed_steps``, why ``schedule_needs_tokens`` resolves first only for
    mixed-batch policies: a block completed by a pending token is hashed by ``may_append`` in a
    decode pass, and a whole-prompt policy (``mixed_batches`` False) admits before its decode
    pass and runs none in a step that admitted; ``EngineCore`` resolves the step in flight
    before it returns, so every schedule starts with no pending hash. With it, such blocks wait
    to the end of every pass, so an admission never finds one in the cache. Either way every
    admission, also one scheduled while a step's tokens are still on the device, reads the
    cache the sequential scheduler reads (same events, ``_check_same``), and no prompt it
    hashes holds a placeholder."""
    workload = _roomy(workload) if roomy else workload
    workload = Workload(workload.config.replace(overlap_mixed_steps=mixed), workload.requests)
    admissions = _admissions_in_flight(workload)
    event("an admission while a step was in flight" if admissions else "none in flight")


def test_an_admission_while_a_step_is_in_flight_hits_what_the_sequential_run_hits() -> None:
    """The hand-made case of the latent bug once suspected: under the whole-prompt policies a
    request is admitted while request 0's decode tokens are still on the device, and it hits
    the blocks those decodes completed, as in the sequential run. Under ``chunked`` the same
    schedule would hash a pending block before admitting: there the engine resolves first
    (``schedule_needs_tokens``), so no admission happens in flight (without that resolve the
    check fails)."""
    for policy in ("prefill_first", "priority", "chunked"):
        workload = _admission_in_flight_workload(policy, overlap_mixed_steps=False)
        admissions = _admissions_in_flight(workload)
        assert admissions == 0 if policy == "chunked" else admissions >= 1, policy
        tables = _check_same(workload)
        assert [s for s in tables["block_hit"]["seq_id"] if s == 1], policy


def test_mixed_steps_overlap_and_admit_in_flight_under_overlap_mixed_steps() -> None:
    """``overlap_mixed_steps``: under ``chunked`` the same request is admitted while request 0's
    tokens are still on the device (the block its last decode filled waits to the pass's end),
    the mixed steps are launched overlapped, and every event equals the sequential run's; the
    request still hits the blocks filled before (without the hold, the admission in flight
    would read a cache that is missing a block whose hash is pending: the check of
    ``_admissions_in_flight`` fails)."""
    workload = _admission_in_flight_workload("chunked", overlap_mixed_steps=True)
    assert _admissions_in_flight(workload) >= 1
    tables = _check_same(workload)
    assert [s for s in tables["block_hit"]["seq_id"] if s == 1]
    kinds, flags = tables["model_step"]["kind"], tables["model_step"]["overlapped"]
    assert any(f for k, f in zip(kinds, flags) if k == "mixed"), "no mixed step overlapped"
    off = _check_same(_admission_in_flight_workload("chunked", overlap_mixed_steps=False))
    kinds, flags = off["model_step"]["kind"], off["model_step"]["overlapped"]
    assert not any(f for k, f in zip(kinds, flags) if k == "mixed")


def _waiting_on_seats_workload() -> Workload:
    """``chunked`` without ``overlap_mixed_steps``, two seats (``max_num_seqs=2``) and three
    requests: the third waits while the first two decode, deferrably (EOS ignored), so each of
    those decodes must first resolve the one in flight (the policy could admit in that pass)."""
    config = Config(kvcache_block_size=4, num_kvcache_blocks=32, max_model_len=32,
                    max_num_batched_tokens=64, max_num_seqs=2, policy="chunked",
                    overlap_mixed_steps=False, eos=1)
    requests = tuple(RequestSpec(0, (2 + i, 3 + i, 4 + i), 6, True, (3,) * 6)
                     for i in range(3))
    return Workload(config, requests)


def test_a_decode_that_resolved_its_predecessor_first_is_not_overlapped() -> None:
    """A decode scheduled after the step in flight was resolved (a mixed-batch policy with a
    request waiting: ``schedule_needs_tokens``) ran after its predecessor, so its
    ``model_step.overlapped`` is False, though that predecessor was deferred; the observer's
    ``overlapped`` check holds on the run, and the overlapped run records the same. Kills the
    outside mutant ``forced_resolve_keeps_overlap`` (the flag taken from the deferral alone),
    which the generated workloads rarely reach: it needs deferrable decodes with a request kept
    waiting."""
    workload = _waiting_on_seats_workload()
    observed = run_workload(workload)  # the observer checks the sequential loop's flags
    observed.raise_violations()
    tables = observed.sink.tables
    waiting = dict(zip(tables["batch_scheduled"]["step"], tables["batch_scheduled"]["num_waiting"]))
    steps = tables["model_step"]
    rows = list(zip(steps["step"], steps["kind"], steps["overlapped"]))
    forced = [step for step, kind, _ in rows if kind == "decode" and waiting[step]]
    assert len(forced) >= 3, rows  # the case arises: decodes while the third request waits
    assert not any(flag for step, _, flag in rows if step in forced), rows
    assert any(flag for _, kind, flag in rows if kind == "decode"), "no decode overlapped at all"
    _check_same(workload)
