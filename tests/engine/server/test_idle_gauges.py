"""``/metrics``' engine gauges (requests running and waiting, KV-cache usage) say what the
engine holds also once it is idle: the last request ended by an input between steps (a client
that left, a stop string the frontend found) leaves no step after it to report the change.
Both engines (its own process, a thread of the server), running the tiny model."""

from __future__ import annotations

import asyncio
import time

import pytest
from fake_engine import tiny_engine

from engine.sampling_params import SamplingParams
from engine.server.engine_loop import RequestStream
from engine.server.metrics import ServerMetrics

SETTLE_S = 2.0  # far longer than a step: what the gauges say by then they keep saying


def _gauges(metrics: ServerMetrics) -> tuple[float | None, ...]:
    """Requests running, waiting and the KV-cache usage, as ``/metrics`` shows them."""
    return tuple(metrics.registry.get_sample_value(name, {"model_name": "m"}) for name in (
        "vllm:num_requests_running", "vllm:num_requests_waiting", "vllm:kv_cache_usage_perc"))


@pytest.mark.parametrize("mode", ["process", "thread"])
@pytest.mark.parametrize("reason", ["aborted", "stop"])
def test_gauges_fall_to_zero_when_the_last_request_ends_between_steps(mode: str,
                                                                     reason: str) -> None:
    """One request, ended by the frontend (an abort, or a stop string) after its first
    tokens: the engine goes idle with nothing running, nothing waiting, no KV block held. The
    gauges kept the last step's values (1 running, its blocks in use) for as long as the
    server stayed idle: a dashboard showed a request that no longer existed."""
    engine = tiny_engine(mode)
    metrics = engine.metrics

    async def run() -> tuple[float, float, float]:
        engine.start(asyncio.get_running_loop())
        # A request that may end on EOS, as clients send them: the engine cannot launch its
        # next step before its tokens are in, so no step is in flight when the end comes.
        stream = RequestStream([10, 11], SamplingParams(max_tokens=3000), engine.now())
        engine.submit(stream)
        tokens = 0
        while tokens < 3:
            got, finish, error = await stream.queue.get()
            assert finish is None and error is None
            tokens += len(got)
        assert _gauges(metrics)[0] == 1  # what the steps so far reported
        engine.finish(stream, reason)
        deadline = time.perf_counter() + SETTLE_S
        while time.perf_counter() < deadline and _gauges(metrics) != (0, 0, 0):
            await asyncio.sleep(0.01)
        gauges = _gauges(metrics)
        # As the app's lifespan stops it: the process engine's last words are read on the loop.
        await asyncio.get_running_loop().run_in_executor(None, engine.shutdown, 0.0)
        return gauges

    assert asyncio.run(run()) == (0, 0, 0)
