"""Run metrics, computed the same way from a recording and from a simulation.

What these tests prove: on a hand-traced run every latency is what its definition says (TTFT is
the end of the step that sampled the first token minus the arrival; TPOT the mean gap between a
request's tokens; queue time from arrival to the start of its first step); throughput, makespan,
preemptions, prefix-cache hit rate, batch sizes and KV blocks in use come from the events; a
trace read back from Parquet gives the same metrics as the in-memory recording; without timings
the time metrics are unknown (NaN), not zero.
"""

from __future__ import annotations

import math

import numpy as np
import pytest

from engine.batch import ScheduledBatch, StepOutput
from engine.config import Config
from engine.engine_core import EngineCore
from engine.sampling_params import SamplingParams
from replay.metrics import compute, relative_error
from replay.recorded import RecordedEvents, from_columns, from_trace
from replay.whatif.sim_executor import SimClock
from replay.whatif.synthetic import StepLaw, record_workload
from replay.workloads.builtin import reference_workload
from replay.workloads.request import Request
from tracing.sink import MemorySink

FIRST_STEP_S = 1.0
LATER_STEP_S = 0.5
BLOCK = 4


class FixedTimeExecutor:
    """Token 7 for everyone; the first step takes 1 s, every later one 0.5 s."""

    def __init__(self, num_kvcache_blocks: int, clock: SimClock) -> None:
        self.num_kvcache_blocks = num_kvcache_blocks
        self.clock = clock

    def execute(self, batch: ScheduledBatch) -> StepOutput:
        seconds = FIRST_STEP_S if batch.step == 0 else LATER_STEP_S
        self.clock.now += seconds
        return StepOutput([7] * len(batch.sampled_seqs), seconds, len(batch.seqs))

    def describe(self) -> dict:
        return {"executor": "fixed"}

    def close(self) -> None:
        pass


def traced_run() -> RecordedEvents:
    """A (10-token prompt, 3 tokens) and B (5, 2) at t=0; C (4, 1) arrives at t=1.2.

    step 0 [0, 1.0]: prefill A, B    step 1 [1.0, 1.5]: decode A, B (B done)
    C joins before step 2            step 2 [1.5, 2.0]: prefill C (C done)
                                     step 3 [2.0, 2.5]: decode A (A done)
    """
    clock = SimClock()
    sink = MemorySink()
    config = Config(num_kvcache_blocks=32, kvcache_block_size=BLOCK, max_model_len=64,
                    max_num_batched_tokens=64)
    core = EngineCore(config, FixedTimeExecutor(32, clock), sink=sink, clock=clock)
    core.add_request(list(range(10)), SamplingParams(0.0, 3, True), arrival_s=0.0)
    core.add_request(list(range(100, 105)), SamplingParams(0.0, 2, True), arrival_s=0.0)
    core.step()
    core.step()
    core.add_request(list(range(200, 204)), SamplingParams(0.0, 1, True), arrival_s=1.2)
    core.run_until_idle()
    core.close()
    return from_columns(sink.header, sink.tables)


def test_latencies_of_a_hand_traced_run() -> None:
    run = compute(traced_run())
    r = run.requests.set_index("seq_id")
    assert r["ttft_s"].tolist() == pytest.approx([1.0, 1.0, 2.0 - 1.2])
    assert r["tpot_s"].iloc[:2].tolist() == pytest.approx([(2.5 - 1.0) / 2, 1.5 - 1.0])
    assert math.isnan(r["tpot_s"].iloc[2])  # one token: no time per output token
    assert r["e2e_s"].tolist() == pytest.approx([2.5, 1.5, 0.8])
    assert r["queue_s"].tolist() == pytest.approx([0.0, 0.0, 1.5 - 1.2])
    s = run.summary
    assert s["makespan_s"] == pytest.approx(2.5)
    assert s["throughput_tok_s"] == pytest.approx(6 / 2.5)
    assert s["ttft_mean_s"] == pytest.approx((1.0 + 1.0 + 0.8) / 3)
    assert s["batch_size_max"] == 2 and s["steps"] == 4
    assert run.steps["kv_blocks_used"].tolist() == [
        3 + 2,  # A: 10 tokens = 3 blocks, B: 5 tokens = 2 blocks
        3 + 2,  # decode A (11 tokens) and B (6): no new block
        3 + 1,  # B freed; C: 4 tokens = 1 block
        3,  # C freed; A at 12 tokens still fits 3 blocks
    ]


def test_prefix_hits_and_preemptions_are_counted_from_events() -> None:
    shared = list(range(2 * BLOCK))
    clock = SimClock()
    sink = MemorySink()
    config = Config(num_kvcache_blocks=32, kvcache_block_size=BLOCK, max_model_len=64,
                    max_num_batched_tokens=64)
    core = EngineCore(config, FixedTimeExecutor(32, clock), sink=sink, clock=clock)
    core.add_request(shared + [50], SamplingParams(0.0, 2, True), arrival_s=0.0)
    core.run_until_idle()
    core.add_request(shared + [60, 61], SamplingParams(0.0, 2, True), arrival_s=clock.now)
    core.run_until_idle()
    core.close()
    s = compute(from_columns(sink.header, sink.tables)).summary
    hit_tokens = 2 * BLOCK
    computed = (2 * BLOCK + 1) + 2  # first prompt in full, the second's uncached tail
    assert s["prefix_hit_rate"] == pytest.approx(hit_tokens / (hit_tokens + computed))
    assert s["preemptions"] == 0


def test_metrics_of_a_parquet_trace_equal_those_of_the_recording(tmp_path) -> None:
    from tracing.reader import read_trace

    config = Config(num_kvcache_blocks=8, kvcache_block_size=64, max_num_seqs=8)
    requests = [Request(r.prompt[:200], min(r.max_tokens, 100))
                for r in reference_workload(num_seqs=12)]
    memory = record_workload(config, requests, StepLaw(), seed=3)
    disk = record_workload(config, requests, StepLaw(), trace_dir=str(tmp_path / "t"), seed=3)
    assert compute(memory).summary["preemptions"] > 0
    a, b = compute(memory), compute(from_trace(read_trace(tmp_path / "t")))
    assert a.summary == pytest.approx(b.summary, nan_ok=True)
    assert disk.num_steps == memory.num_steps


def test_without_timings_time_metrics_are_unknown_not_zero() -> None:
    events = record_workload(Config(num_kvcache_blocks=60), reference_workload(num_seqs=4),
                             law=None)
    s = compute(events).summary
    for name in ("makespan_s", "throughput_tok_s", "ttft_mean_s", "tpot_p50_s", "queue_p50_s"):
        assert math.isnan(s[name]), name
    assert s["steps"] > 0 and s["batch_size_mean"] > 0


def test_relative_error() -> None:
    assert relative_error(103.0, 100.0) == pytest.approx(0.03)
    assert relative_error(0.0, 0.0) == 0.0
    assert np.isnan(relative_error(1.0, 0.0))
