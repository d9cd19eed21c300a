"""Streaming simulation equals the simulation of the whole workload, in bounded state.

What these tests prove:
- ``simulate_stream`` over a workload (token-id prompts, recipe prompts read from a Parquet
  file) gives exactly ``run_variant``'s metrics (every value to the last bit) and decision
  stream, under configs with prefix hits, preemptions and chunked prefill, timed and untimed;
- the engine and executor keep no state of a finished request (``EngineCore.forget``,
  ``SimExecutor.release``), and recorded tokens may come as numpy arrays;
- a variant that cannot serve some requests rejects them (counted, in a note) as
  ``run_variant`` does; a workload out of arrival order is a one-line error;
- ``trace_out`` writes the simulated events as a trace whose metrics are the streamed ones.
"""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from engine.config import Config
from engine.engine_core import EngineCore
from engine.errors import ReplayLLMError
from engine.executor import NullExecutor
from engine.sampling_params import SamplingParams
from replay.metrics import compute
from replay.recorded import from_columns, from_trace
from replay.verify import compare_decisions
from replay.whatif.cost.model import CostModel
from replay.whatif.sim_executor import SimClock, SimExecutor
from replay.whatif.simulate import run_variant, workload_from_requests
from replay.whatif.stream import (
    STREAM_COVERAGE_NOTE,
    StreamInputs,
    WorkloadSource,
    simulate_stream,
    workload_file_source,
)
from replay.whatif.synthetic import StepLaw, record_workload
from replay.workloads.builtin import reference_workload
from replay.workloads.recipe import PromptRecipe
from replay.workloads.request import Request
from replay.workloads.store import WorkloadWriter, read_workload
from tracing.reader import read_trace
from tracing.sink import MemorySink

TIMING = Config(num_kvcache_blocks=400, max_num_seqs=64)
CONFIGS = {
    "as timed": {},
    "small pool preempts": {"num_kvcache_blocks": 60, "max_num_seqs": 32},
    "chunked": {"policy": "chunked", "max_num_batched_tokens": 512},
    "no prefix cache": {"enable_prefix_caching": False},
}


@pytest.fixture(scope="module")
def cost() -> CostModel:
    return CostModel.fit(record_workload(TIMING, reference_workload(num_seqs=48), StepLaw(),
                                         seed=1))


def poisson_requests(count: int, seed: int = 0, recipes: bool = False) -> list[Request]:
    """Poisson arrivals at 40 req/s; half the prompts share a prefix (prefix-cache hits)."""
    rng = np.random.default_rng(seed)
    arrivals = np.cumsum(rng.exponential(1 / 40, count))
    shared = rng.integers(0, 10000, 512).tolist()
    out = []
    for i in range(count):
        length = int(rng.integers(48, 600))
        if recipes:
            prompt = PromptRecipe((7, 8, 9) if i % 2 else (), 16, length, salt=i)
        else:
            prompt = (shared[:length // 2] if i % 2 else []) + \
                rng.integers(0, 10000, length - length // 2 * (i % 2)).tolist()
        out.append(Request(prompt, int(rng.integers(1, 200)), temperature=0.0,
                           arrival_s=float(arrivals[i])))
    return out


def assert_same_run(requests: list[Request], overrides: dict, cost: CostModel | None,
                    source=None) -> None:
    whole = run_variant(workload_from_requests(requests, TIMING, "w"), overrides, cost)
    kept = MemorySink()
    streamed = simulate_stream(source or WorkloadSource(requests, TIMING, "w"), overrides, cost,
                               downstream=kept)
    assert whole.ok and streamed.ok, (whole.status, streamed.status)
    assert list(streamed.metrics) == list(whole.metrics)
    for name, value in whole.metrics.items():
        assert repr(streamed.metrics[name]) == repr(value), name
    assert whole.events is not None
    assert compare_decisions(whole.events, from_columns(kept.header, kept.tables)) is None
    # The same notes, but for the coverage check (it reads every step's features).
    variant = [n for n in streamed.notes if n != STREAM_COVERAGE_NOTE]
    assert whole.notes[: len(variant)] == variant
    assert (STREAM_COVERAGE_NOTE in streamed.notes) == (cost is not None)


@pytest.mark.parametrize("name", sorted(CONFIGS))
def test_streamed_equals_whole_workload(cost: CostModel, name: str) -> None:
    assert_same_run(poisson_requests(120, seed=3), CONFIGS[name], cost)


def test_streamed_workload_keeps_priorities(cost: CostModel) -> None:
    """Under ``priority`` the streamed run serves each request's priority, as the whole one
    does (the streamed reader once dropped it, so every request ran at priority 0); the
    baseline shows that the priorities change the run."""
    requests = [dataclasses.replace(r, arrival_s=0.0, priority=i % 3)
                for i, r in enumerate(poisson_requests(60, seed=5))]
    assert_same_run(requests, {"policy": "priority", **CONFIGS["small pool preempts"]}, cost)
    kept = [MemorySink(), MemorySink()]
    for sink, batch in zip(kept, (requests, [dataclasses.replace(r, priority=0)
                                            for r in requests])):
        simulate_stream(WorkloadSource(batch, TIMING, "w"),
                        {"policy": "priority", **CONFIGS["small pool preempts"]}, cost,
                        downstream=sink)
    events = [from_columns(k.header, k.tables) for k in kept]
    assert compare_decisions(*events) is not None


def test_streamed_equals_whole_workload_untimed() -> None:
    assert_same_run(poisson_requests(40, seed=4), CONFIGS["small pool preempts"], None)


def test_recipe_prompts_read_from_a_parquet_file(cost: CostModel, tmp_path) -> None:
    requests = poisson_requests(150, seed=5, recipes=True)
    path = tmp_path / "w.parquet"
    writer = WorkloadWriter(path)
    for request in requests:
        writer.write(request)
    writer.close()
    read = list(read_workload(path))
    assert [r.prompt_token_ids() for r in read] == [r.prompt_token_ids() for r in requests]
    assert_same_run(requests, {}, cost, source=workload_file_source(path, TIMING))


def test_a_variant_that_cannot_serve_some_requests_rejects_them(cost: CostModel) -> None:
    """A pool too small for some requests: the engine rejects those as a live run does, the
    rest are predicted, streamed exactly as whole (it was ``cannot run`` for the variant)."""
    requests = poisson_requests(30, seed=6)
    small = {"num_kvcache_blocks": 20, "kvcache_block_size": 16}  # 320 tokens: some fit
    assert_same_run(requests, small, cost)
    streamed = simulate_stream(WorkloadSource(requests, TIMING, "w"), small, cost)
    count = int(streamed.metrics["rejected"])
    assert 0 < count < 30 and streamed.newly_rejected == count
    assert any(n.startswith(f"{count} of 30 requests rejected") for n in streamed.notes)


def test_a_workload_out_of_arrival_order_is_an_error(cost: CostModel) -> None:
    requests = poisson_requests(10, seed=7)
    requests[4], requests[5] = requests[5], requests[4]
    with pytest.raises(ReplayLLMError, match="arrival order"):
        simulate_stream(WorkloadSource(requests, TIMING, "w"), {}, cost)


def test_finished_requests_leave_no_state(cost: CostModel) -> None:
    requests = poisson_requests(60, seed=8)
    executor = SimExecutor(TIMING.num_kvcache_blocks, SimClock(), cost)
    core = EngineCore(TIMING, executor, clock=executor.clock, record_events=False)
    inputs = StreamInputs(core, iter(WorkloadSource(requests, TIMING, "w")), executor, True, "w")
    most = 0
    while True:
        inputs.feed(core, executor.clock.now)
        result = core.step()
        if result is not None:
            inputs.on_result(result, executor.clock.now)
            most = max(most, len(core.sequences))
        elif not core.has_unfinished():
            due = inputs.next_due()
            if due is None:
                break
            executor.clock.now = max(executor.clock.now, due)
    assert inputs.added == 60
    assert core.sequences == {} and executor.tokens == {}
    assert 0 < most < 60


def test_engine_forgets_only_finished_sequences() -> None:
    config = Config(num_kvcache_blocks=64, kvcache_block_size=16, max_model_len=256)
    core = EngineCore(config, NullExecutor(64))
    first = core.add_request(list(range(1, 20)), SamplingParams(0.6, 1, True))
    second = core.add_request(list(range(1, 30)), SamplingParams(0.6, 50, True))
    core.step()
    core.forget(first.seq_id)
    core.forget(second.seq_id)
    assert first.is_finished and list(core.sequences) == [second.seq_id]


def test_recorded_tokens_as_arrays_are_served_then_released() -> None:
    executor = SimExecutor(8, SimClock())
    executor.bind(0, np.array([5, 6], dtype=np.int32))
    executor.bind(1, None)
    assert executor._token(0, 1) == 6 and type(executor._token(0, 1)) is int
    assert executor._token(0, 2) == executor._synthetic(0, 2)  # past the recording: synthetic
    executor.release(0)
    assert executor.tokens == {}
    with pytest.raises(RuntimeError, match="in order"):
        executor.bind(3, None)


def test_trace_out_writes_the_simulated_events(cost: CostModel, tmp_path) -> None:
    requests = poisson_requests(40, seed=9)
    streamed = simulate_stream(WorkloadSource(requests, TIMING, "w"), {}, cost,
                               trace_out=tmp_path / "sim")
    written = compute(from_trace(read_trace(tmp_path / "sim")), timed=True)
    for name, value in streamed.metrics.items():
        assert repr(written.summary[name]) == repr(value), name
