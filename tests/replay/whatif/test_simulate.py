"""The what-if simulator re-runs a workload through the engine's own scheduler under another Config.

What these tests prove:
- decision fidelity: simulating config B from a recording under A gives exactly the decisions a
  recording under B makes (token values and times aside), for workloads whose decisions do not
  depend on token values (all requests at step 0, ignore_eos); checked on hand-picked config pairs
  and on Hypothesis-generated configs and workloads;
- tokens are served by sequence position: under A's own config the simulation reproduces A's
  events entirely, tokens and hashes included, and under B each request completes with A's tokens;
- time fidelity on traces with a known step-time law: B's recorded times predicted from A within
  the issue's targets (3% throughput / makespan, 5% mean TTFT / p50 TPOT), both directions;
- arrivals, idle gaps, aborts, variants that cannot run, grids in parallel == grids in series.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import event, example, given
from hypothesis import strategies as st

from engine.config import Config
from engine.engine_core import EngineCore
from engine.executor import NullExecutor
from engine.sampling_params import SamplingParams
from replay.metrics import compute
from replay.recorded import RecordedEvents, from_columns
from replay.verify import EXECUTOR_COLUMNS, blank_columns, compare, compare_decisions
from replay.whatif.cost.model import CostModel
from replay.whatif.simulate import (
    SimWorkload,
    load_source,
    run_variant,
    simulate,
    simulate_many,
    workload_from_requests,
)
from replay.whatif.synthetic import StepLaw, record_workload
from replay.workloads.builtin import reference_workload
from replay.workloads.request import Request
from tracing.sink import MemorySink

VOCAB = 500


def shared_prefix_requests(block_size: int, count: int = 24, seed: int = 0) -> list[Request]:
    """Prompts with shared prefixes (prefix-cache hits) and varied lengths, all at time 0."""
    rng = np.random.default_rng(seed)
    shared = rng.integers(0, VOCAB, size=3 * block_size).tolist()
    out = []
    for i in range(count):
        tail = rng.integers(0, VOCAB, size=int(rng.integers(1, 40))).tolist()
        prompt = (shared[: int(rng.integers(0, len(shared)))] if i % 2 else []) + tail
        out.append(Request(prompt, max_tokens=int(rng.integers(1, 30)), temperature=0.6))
    return out


def record(config: Config, requests: list[Request], seed: int = 0) -> RecordedEvents:
    """Record ``requests`` (all added before step 0) with NullExecutor tokens."""
    sink = MemorySink()
    core = EngineCore(config, NullExecutor(config.num_kvcache_blocks, seed=seed), sink=sink)
    for r in requests:
        core.add_request(list(r.prompt), SamplingParams(r.temperature, r.max_tokens, True),
                         arrival_s=0.0)
    core.run_until_idle()
    core.close()
    return from_columns(sink.header, sink.tables)


def overrides_between(a: Config, b: Config) -> dict:
    return {k: v for k, v in b.to_dict().items() if a.to_dict()[k] != v}


BASE = dict(kvcache_block_size=16, max_model_len=256, max_num_batched_tokens=512)
CONFIGS = {
    "roomy": Config(num_kvcache_blocks=512, **BASE),
    "tiny-pool-preempts": Config(num_kvcache_blocks=12, kvcache_block_size=8, max_model_len=96,
                                 max_num_batched_tokens=256),
    "few-seqs": Config(num_kvcache_blocks=64, max_num_seqs=3, **BASE),
    "no-prefix-cache": Config(num_kvcache_blocks=40, enable_prefix_caching=False, **BASE),
    "chunked": Config(num_kvcache_blocks=30, kvcache_block_size=8, policy="chunked",
                      max_num_batched_tokens=24, max_model_len=128),
}
PAIRS = [("roomy", b) for b in CONFIGS if b != "roomy"] + [
    ("tiny-pool-preempts", "roomy"),
    ("chunked", "few-seqs"),
    ("few-seqs", "chunked"),
]


@pytest.mark.parametrize("a,b", PAIRS, ids=[f"{a}->{b}" for a, b in PAIRS])
def test_decision_fidelity_between_configs(a: str, b: str) -> None:
    """B simulated from A's recording makes exactly the decisions B's own recording made."""
    requests = shared_prefix_requests(block_size=16)
    recorded_a = record(CONFIGS[a], requests, seed=1)
    recorded_b = record(CONFIGS[b], requests, seed=2)  # other seed: other tokens, as on a GPU
    result = simulate(recorded_a, overrides_between(CONFIGS[a], CONFIGS[b]), timing=None)
    assert result.ok, result.status
    assert result.events is not None
    assert compare_decisions(recorded_b, result.events) is None


def test_same_config_reproduces_every_event_tokens_included() -> None:
    """Under A's own config, tokens by position == tokens by step: the whole stream matches."""
    recorded = record(CONFIGS["tiny-pool-preempts"], shared_prefix_requests(8))
    result = simulate(recorded, {}, timing=None)
    assert result.events is not None
    assert compare(blank_columns(recorded, EXECUTOR_COLUMNS),
                   blank_columns(result.events, EXECUTOR_COLUMNS)) is None


def test_each_request_completes_with_its_recorded_tokens_under_another_config() -> None:
    """Preemptions and other batches change the steps, not what each sequence samples."""
    requests = shared_prefix_requests(8)
    recorded = record(CONFIGS["roomy"], requests)
    result = simulate(recorded, overrides_between(CONFIGS["roomy"],
                                                  CONFIGS["tiny-pool-preempts"]), timing=None)
    assert result.events is not None and result.metrics["preemptions"] > 0
    want = dict(zip(recorded.tables["request_finished"]["seq_id"].tolist(),
                    recorded.tables["request_finished"]["output_hash"].tolist()))
    got = dict(zip(result.events.tables["request_finished"]["seq_id"].tolist(),
                   result.events.tables["request_finished"]["output_hash"].tolist()))
    assert got == want


@st.composite
def config_pairs_and_prompts(draw: st.DrawFn) -> tuple[Config, Config, list[Request]]:
    def config() -> Config:
        policy = draw(st.sampled_from(["prefill_first", "chunked"]))
        block = draw(st.sampled_from([1, 2, 4, 8]))
        max_model_len = draw(st.integers(8, 48))
        batched = max_model_len + draw(st.sampled_from([0, 7, 64])) if policy == "prefill_first" \
            else draw(st.integers(1, 48))
        return Config(num_kvcache_blocks=draw(st.integers(1, 40)), kvcache_block_size=block,
                      max_model_len=max_model_len, max_num_batched_tokens=batched,
                      max_num_seqs=draw(st.integers(1, 6)), policy=policy,
                      enable_prefix_caching=draw(st.booleans()))

    a, b = config(), config()
    base = draw(st.lists(st.integers(0, 5), min_size=1, max_size=30))
    requests = []
    for _ in range(draw(st.integers(1, 8))):
        shared = base[: draw(st.integers(0, len(base)))]
        tail = draw(st.lists(st.integers(0, 5), min_size=1 if not shared else 0, max_size=20))
        requests.append(Request(shared + tail, max_tokens=draw(st.integers(1, 12))))
    return a, b, requests


# Found by the deep profile: B's prefix cache (one-token blocks) and a sequence A rejected, so
# the simulation samples synthetic tokens for it; one equal to a prompt token (0) made its decode
# block a copy of a prompt block, a hit B's real run never had.
SYNTHETIC_COLLISION = (
    Config(num_kvcache_blocks=1, kvcache_block_size=1, max_model_len=8, max_num_batched_tokens=8,
           max_num_seqs=1, enable_prefix_caching=False),
    Config(num_kvcache_blocks=4, kvcache_block_size=1, max_model_len=8, max_num_batched_tokens=8,
           max_num_seqs=2, enable_prefix_caching=True),
    [Request([0], max_tokens=3, temperature=0.6), Request([0], max_tokens=1, temperature=0.6),
     Request([0, 0], max_tokens=3, temperature=0.6)])


@given(config_pairs_and_prompts())
@example(SYNTHETIC_COLLISION)
def test_decision_fidelity_property(case: tuple[Config, Config, list[Request]]) -> None:
    """For any two configs and any step-0 ignore_eos workload: sim(B from A) == record(B), or
    the variant is reported as one that cannot run exactly when B rejects a request A served."""
    a, b, requests = case
    recorded_a, recorded_b = record(a, requests, seed=1), record(b, requests, seed=2)
    result = simulate(recorded_a, overrides_between(a, b), timing=None)
    reasons_a = recorded_a.tables["request_finished"]["reason"].tolist()
    by_seq_a = dict(zip(recorded_a.tables["request_finished"]["seq_id"].tolist(), reasons_a))
    by_seq_b = dict(zip(recorded_b.tables["request_finished"]["seq_id"].tolist(),
                        recorded_b.tables["request_finished"]["reason"].tolist()))
    newly_rejected = [
        s for s, r in by_seq_b.items() if r == "rejected" and by_seq_a[s] != "rejected"
    ]
    event("B cannot run" if newly_rejected else "compared")
    if newly_rejected:
        assert result.status.startswith("cannot run"), result.status
        return
    assert result.ok, result.status
    assert result.events is not None
    event("B preempts" if len(recorded_b.tables["preempted"]["seq_id"]) else "B never preempts")
    assert compare_decisions(recorded_b, result.events) is None


# --- times --------------------------------------------------------------------------------------
TIME_A = Config(num_kvcache_blocks=400, max_num_seqs=64)
TIME_B = Config(num_kvcache_blocks=180, max_num_seqs=48)
THROUGHPUT_TOLERANCE = 0.03
LATENCY_TOLERANCE = 0.05


@pytest.fixture(scope="module")
def law_traces() -> tuple[RecordedEvents, RecordedEvents]:
    requests = reference_workload(num_seqs=64)
    return (record_workload(TIME_A, requests, StepLaw(), seed=1),
            record_workload(TIME_B, requests, StepLaw(), seed=2))


@pytest.mark.parametrize("direction", ["B from A", "A from B"])
def test_time_fidelity_on_traces_with_a_known_step_law(law_traces, direction: str) -> None:
    """Both directions: throughput and makespan within 3%, mean TTFT and p50 TPOT within 5%."""
    a, b = law_traces
    source, target, config = (a, b, TIME_B) if direction == "B from A" else (b, a, TIME_A)
    result = simulate(source, overrides_between(config_of(source), config))
    measured = compute(target).summary
    assert result.events is not None
    assert compare_decisions(target, result.events) is None
    for metric, tolerance in (("throughput_tok_s", THROUGHPUT_TOLERANCE),
                              ("makespan_s", THROUGHPUT_TOLERANCE),
                              ("ttft_mean_s", LATENCY_TOLERANCE),
                              ("tpot_p50_s", LATENCY_TOLERANCE)):
        predicted = result.metrics[metric]
        assert predicted == pytest.approx(measured[metric], rel=tolerance), metric


def config_of(events: RecordedEvents) -> Config:
    return Config(**events.header["config"])


def test_requests_join_when_the_simulated_clock_reaches_their_arrival() -> None:
    """A request arriving after the engine went idle waits for nothing: the clock jumps to it."""
    late = 100.0
    requests = [Request(list(range(50)), 5, arrival_s=0.0), Request(list(range(60)), 5,
                                                                   arrival_s=late)]
    recorded = record_workload(TIME_A, requests, StepLaw(noise=0.0, flush_every=0))
    result = simulate(recorded, {}, timing=CostModel.fit(recorded))
    measured = compute(recorded)
    assert result.requests is not None
    # Two prefill steps are too few to fit their own class: the fallback model is a few % off.
    assert result.requests["ttft_s"].tolist() == pytest.approx(
        measured.requests["ttft_s"].tolist(), rel=0.05)
    assert result.metrics["makespan_s"] > late
    assert result.metrics["queue_p50_s"] == pytest.approx(0.0, abs=1e-9)


def test_aborted_request_is_aborted_in_the_simulation_too() -> None:
    config = CONFIGS["roomy"]
    sink = MemorySink()
    core = EngineCore(config, NullExecutor(config.num_kvcache_blocks), sink=sink)
    for r in shared_prefix_requests(16, count=4):
        core.add_request(list(r.prompt), SamplingParams(0.6, 20, True), arrival_s=0.0)
    core.step()
    core.step()
    core.abort(1)
    core.run_until_idle()
    core.close()
    recorded = from_columns(sink.header, sink.tables)
    result = simulate(recorded, {}, timing=None)
    assert result.events is not None
    assert compare_decisions(recorded, result.events) is None


# --- variants that cannot run, grids ------------------------------------------------------------
def test_a_pool_smaller_than_one_request_is_reported_not_raised() -> None:
    recorded = record(CONFIGS["roomy"], shared_prefix_requests(16))
    result = simulate(recorded, {"num_kvcache_blocks": 1}, timing=None)
    assert not result.ok
    assert result.status.startswith("cannot run:") and "KV blocks" in result.status
    assert "whole pool has 1" in result.status


def test_an_inconsistent_config_is_reported_as_a_variant_that_cannot_run() -> None:
    recorded = record(CONFIGS["roomy"], shared_prefix_requests(16))
    result = simulate(recorded, {"max_num_batched_tokens": 8}, timing=None)
    assert result.status.startswith("cannot run:") and "max_model_len" in result.status


def test_grid_in_parallel_equals_grid_in_series() -> None:
    recorded = record_workload(TIME_A, reference_workload(num_seqs=16), StepLaw(), seed=1)
    workload = load_source(recorded)
    cost = CostModel.fit(recorded)
    variants = [(f"v{n}", {"num_kvcache_blocks": n}) for n in (1, 40, 80, 400)]
    parallel = simulate_many(workload, variants, cost, jobs=2)
    serial = [run_variant(workload, o, cost, name) for name, o in variants]
    assert [r.name for r in parallel] == [name for name, _ in variants]
    assert [r.status for r in parallel] == [r.status for r in serial]
    assert not parallel[0].ok and all(r.ok for r in parallel[1:])
    for p, s in zip(parallel[1:], serial[1:]):
        assert p.metrics == pytest.approx(s.metrics, nan_ok=True)


def test_untimed_source_predicts_decisions_and_says_times_are_unknown() -> None:
    recorded = record(CONFIGS["roomy"], shared_prefix_requests(16))
    result = simulate(recorded, {"max_num_seqs": 4})
    assert result.ok and not result.timed
    assert any("--timing-from" in note for note in result.notes)
    assert math.isnan(result.metrics["makespan_s"]) and math.isnan(result.metrics["ttft_p50_s"])
    assert result.metrics["steps"] > 0


def test_workload_without_a_trace_runs_on_synthetic_tokens_and_a_borrowed_model(law_traces):
    requests = reference_workload(num_seqs=64)
    workload: SimWorkload = workload_from_requests(requests, TIME_A, "bench")
    cost = CostModel.fit(law_traces[0])
    result = run_variant(workload, {}, cost)
    measured = compute(law_traces[0]).summary
    # Same config and requests as trace A: the same schedule, so the same predicted times.
    assert result.metrics["steps"] == measured["steps"]
    assert result.metrics["makespan_s"] == pytest.approx(measured["makespan_s"], rel=0.03)
    assert result.notes and "synthetic" in result.notes[0]
