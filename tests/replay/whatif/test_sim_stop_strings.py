"""A request the source ended at a stop string is simulated to stop at the same token.

A stop string is found in a request's text, so it ends the request after a fixed number of
its tokens whatever the clock says. The simulator fed a recorded stop like an abort, at the
recorded time (or step): a variant slower or faster than the recording stopped requests tokens
early or late (the source's own configuration, timed, predicted 9 tokens for a request that
recorded 2, and synthesised the rest). These tests record a law-timed run that stops requests
at chosen token counts (as ``LLM.check_stops`` does) and prove every variant, timed or not,
ends each stopped request after exactly its recorded tokens, synthesising none.
"""

from __future__ import annotations

import numpy as np
import pytest

from engine.config import Config
from engine.engine_core import EngineCore
from replay.recorded import from_columns
from replay.verify import compare_decisions
from replay.whatif.cost.model import CostModel
from replay.whatif.sim_executor import SimClock
from replay.whatif.simulate import load_source, run_variant
from replay.whatif.synthetic import LawExecutor, StepLaw
from replay.workloads.request import Request
from tracing.sink import MemorySink

CONFIG = Config(num_kvcache_blocks=64, kvcache_block_size=16, max_model_len=256,
                max_num_batched_tokens=512, max_num_seqs=4, enforce_eager=True)


def record_with_stops(stop_after: dict[int, int]):
    """Twelve requests (all at time 0, 20 tokens each at most); request i is stopped once it
    has sampled ``stop_after[i]`` tokens, between steps, as a stop string found in its text."""
    rng = np.random.default_rng(3)
    clock = SimClock(0.0)
    sink = MemorySink()
    core = EngineCore(CONFIG, LawExecutor(CONFIG.num_kvcache_blocks, clock, StepLaw(), seed=1),
                      sink=sink, clock=clock)
    for _ in range(12):
        prompt = rng.integers(0, 500, size=int(rng.integers(5, 60))).tolist()
        core.add_request(prompt, Request(prompt, max_tokens=20, ignore_eos=True)
                         .sampling_params(), arrival_s=0.0)
    while core.has_unfinished():
        result = core.step()
        if result is None:
            continue
        for seq in result.batch.sampled_seqs:
            limit = stop_after.get(seq.seq_id)
            if limit is not None and not seq.is_finished and seq.num_completion_tokens >= limit:
                core.finish(seq.seq_id, "stop")
    core.close()
    return from_columns(sink.header, sink.tables)


STOPS = {0: 1, 1: 2, 3: 5, 6: 3, 9: 1, 11: 7}


@pytest.fixture(scope="module")
def recording():
    return record_with_stops(STOPS)


def _tokens(events) -> list[int]:
    seq = np.asarray(events.tables["token_sampled"]["seq_id"])
    return np.bincount(seq, minlength=12).tolist()


@pytest.mark.parametrize("overrides", [{}, {"max_num_seqs": 1}, {"max_num_seqs": 12},
                                       {"policy": "chunked", "max_num_batched_tokens": 32}])
@pytest.mark.parametrize("timed", [True, False])
def test_stopped_requests_stop_after_their_recorded_tokens(recording, overrides, timed):
    """Under every variant, timed or not, each request stopped in the source samples exactly
    its recorded tokens and finishes with reason ``stop``; no token is synthetic."""
    recorded = _tokens(recording)
    assert [recorded[i] for i in STOPS] == list(STOPS.values())
    workload = load_source(recording)
    cost = CostModel.fit(recording) if timed else None
    result = run_variant(workload, overrides, cost)
    assert result.ok, result.status
    assert _tokens(result.events) == recorded
    reasons = dict(zip(result.requests["seq_id"], result.requests["finish_reason"]))
    assert {i for i, r in reasons.items() if r == "stop"} == set(STOPS)
    assert not any("synthetic" in note for note in result.notes), result.notes


def test_as_recorded_reproduces_the_decisions(recording):
    """The source's own configuration, timed, makes the recorded decisions, stops included."""
    result = run_variant(load_source(recording), {}, CostModel.fit(recording))
    assert compare_decisions(recording, result.events) is None
