"""Metrics folded from the event stream as it goes equal metrics computed from the whole stream.

What these tests prove: ``StreamingMetrics``, attached to an engine as its sink and folding the
buffer every few events (so every table is split across many folds, mid-step included), gives
exactly ``replay.metrics.compute``'s summary (every value, to the last bit, NaN where compute
has NaN) and the same per-request and per-step tables, timed or not, on runs with prefix-cache
hits, preemptions, rejections, aborts, chunked prefill and idle gaps; and it holds no events
(the engine's buffer is drained as it goes).
"""

from __future__ import annotations

import numpy as np
import pandas as pd
from hypothesis import given
from hypothesis import strategies as st

from engine.config import Config
from engine.engine_core import EngineCore
from engine.executor import NullExecutor
from engine.sampling_params import SamplingParams
from replay.metrics import compute
from replay.recorded import from_columns
from replay.stream_metrics import StreamingMetrics
from tracing.sink import MemorySink

VOCAB = 300


def run(config: Config, prompts: list[list[int]], max_tokens: list[int], fold_events: int,
        arrivals: list[float], abort_at: int | None = None) -> tuple[StreamingMetrics, object]:
    """One run on NullExecutor with both sinks: the streaming one, and all events kept."""
    kept = MemorySink()
    metrics = StreamingMetrics(fold_events=fold_events, downstream=None)
    core = EngineCore(config, NullExecutor(config.num_kvcache_blocks), sink=_Tee(metrics, kept))
    for i, (prompt, n) in enumerate(zip(prompts, max_tokens)):
        core.add_request(prompt, SamplingParams(0.6, n, True), arrival_s=arrivals[i])
        if i % 3 == 2:
            core.step()  # later requests join a running batch
        if abort_at is not None and i == abort_at:
            core.abort(1)
    core.run_until_idle()
    core.close()
    return metrics, from_columns(kept.header, kept.tables)


class _Tee:
    """Copies each step's events for ``kept`` before the streaming sink drains them."""

    def __init__(self, metrics: StreamingMetrics, kept: MemorySink) -> None:
        self.metrics, self.kept = metrics, kept

    def open(self, header: dict) -> None:
        self.metrics.open(header)
        self.kept.open(header)

    def _copy(self, buffer) -> None:
        for kind, cols in buffer.tables.items():
            for name, values in cols.items():
                self.kept.tables[kind][name].extend(values[self._seen[kind]:])
            self._seen[kind] = len(cols["event_id"])

    def on_step_end(self, buffer) -> None:
        self._seen = getattr(self, "_seen", None) or dict.fromkeys(buffer.tables, 0)
        self._copy(buffer)
        before = len(buffer.tables["token_sampled"]["event_id"])
        self.metrics.on_step_end(buffer)
        if len(buffer.tables["token_sampled"]["event_id"]) < before:  # drained
            self._seen = dict.fromkeys(buffer.tables, 0)

    def close(self, buffer, summary: dict) -> None:
        self._seen = getattr(self, "_seen", None) or dict.fromkeys(buffer.tables, 0)
        self._copy(buffer)
        self.metrics.close(buffer, summary)
        self.kept.summary = summary


def assert_same(metrics: StreamingMetrics, events, timed: bool) -> None:
    expected = compute(events, timed=timed)
    got = metrics.result(timed)
    assert list(got.summary) == list(expected.summary)
    for name, value in expected.summary.items():
        assert repr(got.summary[name]) == repr(value), name
    pd.testing.assert_frame_equal(got.requests, expected.requests)
    steps = got.steps.assign(kind=got.steps["kind"].astype(str))
    pd.testing.assert_frame_equal(steps, expected.steps)


def workload(seed: int, count: int, block: int) -> tuple[list[list[int]], list[int], list[float]]:
    rng = np.random.default_rng(seed)
    shared = rng.integers(0, VOCAB, 3 * block).tolist()
    prompts = [(shared[: int(rng.integers(0, len(shared)))] if i % 2 else [])
               + rng.integers(0, VOCAB, int(rng.integers(1, 30))).tolist() for i in range(count)]
    return prompts, rng.integers(1, 25, count).tolist(), np.cumsum(rng.random(count)).tolist()


CASES = {
    "prefix hits": Config(num_kvcache_blocks=200, kvcache_block_size=8, max_model_len=128),
    "preempts": Config(num_kvcache_blocks=12, kvcache_block_size=8, max_model_len=96,
                       max_num_batched_tokens=256),
    "chunked": Config(num_kvcache_blocks=30, kvcache_block_size=8, policy="chunked",
                      max_num_batched_tokens=24, max_model_len=128),
}


def test_equals_compute_with_folds_every_few_events() -> None:
    for name, config in CASES.items():
        prompts, max_tokens, arrivals = workload(1, 20, config.kvcache_block_size)
        prompts.append(list(range(1, 200)))  # longer than max_model_len: rejected
        max_tokens.append(4)
        arrivals.append(arrivals[-1])
        for fold in (1, 7, 1 << 16):
            metrics, events = run(config, prompts, max_tokens, fold, arrivals, abort_at=5)
            for timed in (True, False):
                assert_same(metrics, events, timed)
        assert metrics.preemptions > 0 or name != "preempts"
        assert events.tables["block_hit"]["seq_id"].size > 0 or name != "prefix hits"


@given(st.integers(0, 10_000), st.integers(1, 30), st.sampled_from(sorted(CASES)),
       st.integers(1, 40))
def test_equals_compute_property(seed: int, count: int, case: str, fold: int) -> None:
    config = CASES[case]
    prompts, max_tokens, arrivals = workload(seed, count, config.kvcache_block_size)
    metrics, events = run(config, prompts, max_tokens, fold, arrivals)
    assert_same(metrics, events, timed=True)


def test_the_engine_buffer_is_drained_as_it_goes() -> None:
    config = CASES["prefix hits"]
    prompts, max_tokens, arrivals = workload(2, 30, 8)
    metrics = StreamingMetrics(fold_events=16)
    core = EngineCore(config, NullExecutor(config.num_kvcache_blocks), sink=metrics)
    most = 0
    for prompt, n, at in zip(prompts, max_tokens, arrivals):
        core.add_request(prompt, SamplingParams(0.6, n, True), arrival_s=at)
        core.step()
        most = max(most, len(core.events.tables["token_sampled"]["event_id"]))
    core.run_until_idle()
    core.close()
    assert most < 16 + config.max_num_seqs
    assert core.events.num_events() == 0
    assert metrics.result(True).summary["requests"] == 30
