"""Property tests of the Scheduler + BlockManager, driven through ``EngineCore`` without a model,
through the public testing module ``replay.testing`` (the strategies, the scripted engine, the
per-step observer and the event-stream invariant checker users run on their own policies).

Hypothesis generates workloads (``replay.testing.strategies.workloads``): a small config (KV pool
size, block size, ``max_num_seqs``, ``max_num_batched_tokens``, ``max_model_len``, each built-in
policy, both eviction orders, prefix caching, an EOS id), and requests with shared prefixes,
conversation turns, edge-case prompt lengths, ``max_tokens``, ``ignore_eos`` on or off, arrival
steps, priorities and (for a few) an abort step. ``ScriptedExecutor`` (``replay.testing.scripted``)
plays the model: for each sampled sequence it returns the request's scripted token for that
completion position (so a recomputed sequence samples the same tokens, as greedy decoding would,
and EOS comes when the script says so), and it simulates the paged KV cache itself: every
computed token writes (position, digest of its whole prefix) into its slot, and every token a step
attends to must be found in its slot, so a block served from the prefix cache or shared with
another sequence must really hold that sequence's prefix.

Properties (each violation is reported under its name; ``replay.testing.run_workload`` collects
all of them):

- ``admission``: exactly the inadmissible requests are rejected (computed here from the config:
  empty, longer than max_model_len, or the KV of every token it feeds exceeds the whole pool).
- ``completion``: every admitted request finishes with the scripted tokens up to its EOS (unless
  ignore_eos) or its length cap, with that reason, also after being preempted (recomputed); one
  aborted while unfinished (some are) finishes ``aborted`` with a strict prefix of them; the
  ``token_sampled`` and ``request_finished`` events (count, reason, output hash) say the same.
- ``bounded``: everything finishes within last arrival + sum(prompt + completion) steps (no
  starvation, no livelock); ``progress``: a step never comes back empty while work is queued.
- ``budget``, ``overlapped``, ``queue_order``, ``victim``, ``batch_shape``, ``maximality``: the
  per-step checks of ``replay.testing.observer`` (its docstring says each).
- ``kv``: every token a step computes has a slot, and every token it attends to is in its slot with
  the right prefix (simulated KV cache); a step starts where the sequence's computed count says.
- ``prefix_index`` (prefix caching on): every full block whose KV a step has computed carries the
  chain hash of the sequence's own tokens (it was entered into the prefix cache).
- ``drained``: after the last request, no sequence is queued, every block is free with refcount 0.
- The invariants of ``replay.testing.invariants`` over the recorded stream (``accounting``,
  ``refcounts``, ``double_free``, ``hash_chains``, ``batch_fields``, ``preemption``,
  ``sampling``, ``finish``, ``completion``, ``starvation``, ``priorities``, ``eviction``).

The last two tests check that the events of such runs replay identically (``replay.verify``) and
survive the Parquet round trip (``tracing.recorder`` / ``tracing.reader``).
"""

from __future__ import annotations

import hypothesis.strategies as st
import pytest
from hypothesis import event, example, given, settings, target

from engine.config import Config
from replay.testing.run import run_workload
from replay.testing.scripted import Run, decision_columns
from replay.testing.strategies import (
    BUILTIN,
    RequestSpec,
    Workload,
    scaled,
    workloads,
)
from tracing.schema import EVENT_KINDS


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


def _boundary_workload(policy: str, prefix_caching: bool) -> Workload:
    """A prompt of exactly max_model_len (admitted, one token, then ``length``) next to prompts
    that share whole blocks with it (hashed and hit only with prefix caching on)."""
    config = Config(kvcache_block_size=2, num_kvcache_blocks=12, max_model_len=8,
                    max_num_batched_tokens=8 if policy != "chunked" else 3, max_num_seqs=3,
                    policy=policy, enable_prefix_caching=prefix_caching)
    requests = (
        RequestSpec(0, (2, 3, 4, 5, 2, 3, 4, 5), 5, True, (2, 3, 4, 5, 2)),
        RequestSpec(1, (2, 3, 4, 5, 3), 3, True, (4, 4, 4)),
        RequestSpec(3, (2, 3, 4, 5, 2, 3, 4), 2, True, (5, 5)),
    )
    return Workload(config, requests)


BOUNDARY = [_boundary_workload(p, c) for p in ("prefill_first", "chunked", "priority")
            for c in (True, False)]


def _hit_then_admission_workload(policy: str) -> Workload:
    """A cached prompt admitted next to a fresh one in the same step: the cached tokens must not
    be charged to the token budget, so both are admitted whole (or chunked to the budget)."""
    config = Config(kvcache_block_size=2, num_kvcache_blocks=16, max_model_len=8,
                    max_num_batched_tokens=8 if policy != "chunked" else 6, max_num_seqs=4,
                    policy=policy)
    requests = (
        RequestSpec(0, (1, 2, 3, 4, 5), 1, True, (2,)),
        RequestSpec(3, (1, 2, 3, 4, 3), 2, True, (4, 4)),  # hits two blocks: computes 1 token
        RequestSpec(3, (5, 4, 3, 2), 2, True, (3, 3)),
    )
    return Workload(config, requests)


HIT_THEN_ADMIT = [_hit_then_admission_workload(p) for p in ("prefill_first", "chunked")]


def _aborted_mid_prompt_workload() -> Workload:
    """Found by the deep profile: a long prompt chunked one token a step and aborted before it
    samples still counts in the starvation bound (its work was done)."""
    config = Config(policy="chunked", num_kvcache_blocks=12, kvcache_block_size=1,
                    max_model_len=12, max_num_batched_tokens=1, max_num_seqs=1)
    short = RequestSpec(0, (0,), 1, False, (2,))
    requests = (short, RequestSpec(0, (0, 0), 1, False, (2,)),
                RequestSpec(0, (0,) * 6, 1, False, (2,)),
                RequestSpec(0, (0,) * 12, 1, False, (2,), abort_step=20),
                short, short, short, short, RequestSpec(0, (0,), 1, False, (2,), abort_step=0))
    return Workload(config, requests)


def _victim_freeing_nothing_workload() -> Workload:
    """Found by the deep profile: under ``priority`` seq 0 needs a block, its victim seq 2 shares
    its one block with seq 7 (a prefix hit), so the release frees none and seq 0 then preempts
    itself: a victim preempted for a sequence the same step preempts (as vLLM's loop does)."""
    config = Config(policy="priority", num_kvcache_blocks=15, kvcache_block_size=1,
                    max_model_len=16, max_num_batched_tokens=16, max_num_seqs=3, eos=-1)

    def req(prompt: tuple[int, ...], tokens: int, priority: int = 0, arrival: int = 0,
            ignore_eos: bool = False) -> RequestSpec:
        return RequestSpec(arrival, prompt, tokens, ignore_eos, (2,) * tokens, priority=priority)

    return Workload(config, (
        req((0,), 22, 1), req((0,) * 5, 16), req((2,), 2, 1), req((0,) * 10, 1),
        req((0,) * 17, 8), req((1, 0, 0), 2), req((0,), 1), req((2, 2, 2, 0), 2, arrival=2,
                                                              ignore_eos=True)))


VICTIM_FREEING_NOTHING = _victim_freeing_nothing_workload()


# --- the running pass's own loop (``Scheduler._run_running``) -------------------------------------
# ``_decode_all`` builds every decode step whose claims the free blocks cover while nothing is
# prefilling, so generated workloads seldom reach the loop with a budget or the pool binding.
def _seq_budget_binds_workload() -> Workload:
    """prefill_first admits two prompts a step (``max_num_seqs=2``), so four run; the first
    decode step's two claims exceed the one free block, so the loop decides it and stops at
    ``max_num_seqs`` with seq 2 (its token fits its blocks) not visited."""
    config = Config(kvcache_block_size=2, num_kvcache_blocks=6, max_model_len=16,
                    max_num_batched_tokens=16, max_num_seqs=2)
    return Workload(config, tuple(RequestSpec(0, p, 3, True, (2, 3, 4))
                                  for p in ((1, 2), (2, 3), (3, 4, 5), (4, 5))))


def _last_slot_workload(policy: str) -> Workload:
    """No block is free when the loop reaches a decode whose token fills its last block's last
    slot (seq 1 under prefill_first after seq 0's claim; seq 0 beside seq 1's prompt chunks
    under chunked): that decode needs no block and must preempt nobody."""
    if policy == "chunked":
        config = Config(kvcache_block_size=2, num_kvcache_blocks=5, max_model_len=16,
                        max_num_batched_tokens=3, max_num_seqs=4, policy=policy)
        return Workload(config, (RequestSpec(0, (1,), 3, True, (2, 3, 4)),
                                 RequestSpec(0, (2, 3, 4, 5, 2, 3, 4, 5), 1, True, (2,))))
    config = Config(kvcache_block_size=2, num_kvcache_blocks=4, max_model_len=16,
                    max_num_batched_tokens=16, max_num_seqs=4, policy=policy)
    return Workload(config, tuple(RequestSpec(0, p, 3, True, (2, 3, 4))
                                  for p in ((1, 2), (2, 3, 4), (3, 4))))


SEQ_BUDGET_BINDS = _seq_budget_binds_workload()
LAST_SLOT = [_last_slot_workload(p) for p in ("prefill_first", "chunked")]


def _steps(run: Run, kind: str) -> list[tuple[int, ...]]:
    t = run.sink.tables[kind]
    cols = ("seq_id", "for_seq_id") if kind == "preempted" else ("seq_id",)
    return list(zip(t["step"], *(t[c] for c in cols)))


def test_the_running_loop_stops_at_max_num_seqs_and_keeps_admission_order() -> None:
    """The loop schedules exactly ``max_num_seqs`` decodes (seqs 0 and 1, seq 3 preempted for
    seq 1) and leaves seq 2 running, in admission order, for the next step: a loop that takes one
    sequence more fails ``budget``/``budgets``, one that puts the decoded sequences behind the
    unvisited one fails ``queue_order`` (mutants ``running_seq_budget_off_by_one``,
    ``running_order_lost``)."""
    run = run_workload(SEQ_BUDGET_BINDS)
    run.raise_violations()
    assert [(s, q) for s, q in _steps(run, "seq_scheduled") if s == 2] == [(2, 0), (2, 1)]
    assert _steps(run, "preempted") == [(2, 3, 1)]


@pytest.mark.parametrize("workload", LAST_SLOT, ids=["prefill_first", "chunked"])
def test_a_decode_filling_its_last_block_preempts_nobody(workload: Workload) -> None:
    """With no block free, the loop reaches a decode whose token fills its last block: it runs
    without a preemption (the first is for a decode starting a block); a decode that
    claims a block it does not need fails ``preemption`` (mutant ``decode_room_off_by_one``)."""
    run = run_workload(workload)
    run.raise_violations()
    chunked = workload.config.policy == "chunked"
    assert _steps(run, "preempted")[:1] == ([(2, 1, 0)] if chunked else [(1, 2, 0)])
    assert [q for s, q in _steps(run, "seq_scheduled") if s == 1] == ([1, 0] if chunked
                                                                        else [0, 1])
    assert run.sink.tables["batch_scheduled"]["free_blocks"][:2] == [0, 0]


def test_a_victim_may_be_preempted_for_a_sequence_the_step_then_preempts() -> None:
    run = run_workload(VICTIM_FREEING_NOTHING)
    preempted = run.sink.tables["preempted"]
    assert list(zip(preempted["seq_id"], preempted["for_seq_id"]))[:2] == [(2, 0), (0, -1)]
    run.raise_violations()


@pytest.mark.parametrize("workload", HIT_THEN_ADMIT, ids=["prefill_first", "chunked"])
def test_cached_tokens_are_not_charged_to_the_budget(workload: Workload) -> None:
    run = run_workload(workload)
    run.raise_violations()
    tables = run.sink.tables
    assert tables["block_hit"]["seq_id"][:2] == [1, 1]
    steps = tables["seq_scheduled"]["step"]
    admitted_together = [s for s, step in zip(tables["seq_scheduled"]["seq_id"], steps)
                         if step == steps[tables["seq_scheduled"]["seq_id"].index(1)]]
    assert admitted_together[:2] == [1, 2], admitted_together


@pytest.mark.parametrize("workload", BOUNDARY, ids=lambda w: w.describe().split(" blocks")[0]
                         + f" caching={w.config.enable_prefix_caching}")
def test_a_prompt_of_exactly_max_model_len_gets_one_token(workload: Workload) -> None:
    """The boundary: a prompt as long as max_model_len is admitted, samples one token and
    finishes ``length``; with prefix caching off nothing is hashed or hit."""
    run = run_workload(workload)
    run.raise_violations()
    seq = run.seqs[0][1]
    assert (seq.num_completion_tokens, seq.finish_reason) == (1, "length")
    hashed = run.sink.tables["block_hashed"]["seq_id"] + run.sink.tables["block_hit"]["seq_id"]
    assert bool(hashed) == workload.config.enable_prefix_caching


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


@settings(max_examples=scaled(0.5))
@given(workload=workloads())
@example(workload=PREEMPTING[0])
@example(workload=PREEMPTING[1])
@example(workload=PREEMPTING[2])
@example(workload=PREEMPTING[3])
@example(workload=BOUNDARY[1])
@example(workload=BOUNDARY[3])
@example(workload=HIT_THEN_ADMIT[0])
@example(workload=HIT_THEN_ADMIT[1])
@example(workload=_aborted_mid_prompt_workload())
@example(workload=VICTIM_FREEING_NOTHING)
@example(workload=SEQ_BUDGET_BINDS)
@example(workload=LAST_SLOT[0])
@example(workload=LAST_SLOT[1])
def test_scheduler_properties(workload: Workload) -> None:
    """Admission, completion, no starvation, budgets, batch shape, queue order, preemption victim,
    maximality, overlapped flags, KV-cache contents, the final drained pool and every invariant
    of the event stream hold for every generated workload, under each built-in policy and both
    eviction orders (see the module docstring for each property)."""
    run = run_workload(workload)
    _label_coverage(run)
    target(float(len(run.sink.tables["preempted"]["seq_id"])), label="preemptions")
    run.raise_violations()


@pytest.mark.parametrize("policy", BUILTIN)
@settings(max_examples=scaled(0.5))
@given(data=st.data())
def test_scheduler_properties_per_policy(policy: str, data: st.DataObject) -> None:
    """The same properties with workloads of one built-in policy each (both eviction orders), so
    that every policy gets its share of examples (targeting preemptions would otherwise favour
    the policy that preempts most)."""
    workload = data.draw(workloads(policies=(policy,)), label="workload")
    run = run_workload(workload)
    _label_coverage(run)
    target(float(len(run.sink.tables["preempted"]["seq_id"])), label="preemptions")
    run.raise_violations()


def _label_coverage(run: Run) -> None:
    """Hypothesis statistics (``--hypothesis-show-statistics``): how often each situation arose."""
    tables = run.sink.tables
    policy = run.workload.config.policy
    event(f"policy {policy}, eviction {run.workload.config.eviction}")
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
_decision_columns = decision_columns


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
