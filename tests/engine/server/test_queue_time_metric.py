"""``/metrics``' ``vllm:request_queue_time_seconds`` (vLLM's: from a request's arrival to its
first scheduling) is observed once per request, with the time it waited. It was declared and
never observed: every dashboard read an empty histogram however long requests queued. Both
engines (its own process, a thread of the server), running the tiny model."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import pytest

from engine.sampling_params import SamplingParams
from engine.server.engine_loop import RequestStream
from engine.server.engine_proc import EngineSpec
from engine.server.metrics import ServerMetrics


def _engine(mode: str) -> Any:
    spec = EngineSpec(None, None, {"max_model_len": 4096, "calibration_repeats": -1,
                                   "num_kvcache_blocks": 1})
    metrics = ServerMetrics("m")
    if mode == "process":
        from engine.server.engine_client import EngineProcess

        return EngineProcess(spec, metrics)
    from engine.server.engine_loop import EngineLoop

    return EngineLoop(spec.build(), metrics)


def _queue(metrics: ServerMetrics, what: str) -> float | None:
    return metrics.registry.get_sample_value(f"vllm:request_queue_time_seconds_{what}",
                                             {"model_name": "m"})


@pytest.mark.parametrize("mode", ["process", "thread"])
def test_queue_time_is_observed_once_per_request_with_its_wait(mode: str) -> None:
    """One KV block (256 tokens): of two requests sent together, the second waits for the
    first to finish (40 tokens) and free it. Two observations, one each; together at least
    half of the time from the submission to the first's end (the second waited about all of
    it). Before: none."""
    engine = _engine(mode)
    metrics = engine.metrics

    async def run() -> float:
        engine.start(asyncio.get_running_loop())
        params = SamplingParams(max_tokens=40, ignore_eos=True)
        first = RequestStream([10, 11, 12], params, engine.now())
        second = RequestStream([20, 21, 22], params, engine.now())
        sent = time.perf_counter()
        engine.submit(first)
        engine.submit(second)
        first_end = None
        for stream in (first, second):
            while True:
                _, finish, error = await stream.queue.get()
                assert error is None
                if finish is not None:
                    break
            first_end = first_end or time.perf_counter() - sent
        await asyncio.get_running_loop().run_in_executor(None, engine.shutdown, 0.0)
        return first_end

    first_took = asyncio.run(run())
    assert _queue(metrics, "count") == 2
    assert _queue(metrics, "sum") >= 0.5 * first_took
