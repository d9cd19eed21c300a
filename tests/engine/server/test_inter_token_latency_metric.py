"""``/metrics``' ``vllm:inter_token_latency_seconds`` is observed as vLLM observes it: once per
engine step that gives a request a token after its first, with the time since that request's
previous token, on the engine's clock (vLLM: ``IterationStats.update_from_output``, one
``engine_core_timestamp - last_token_ts`` per ``EngineCoreOutput`` of a decoding request).

Before, the frontend observed it when a token reached the request's stream: a stream that fell
behind the engine took the steps piled up in its queue as one batch and observed one averaged
value for all of them, so the histogram's count fell as the frontend fell behind (a stream read
only after the engine finished the request observed none at all). Both engines (its own
process, a thread of the server), running the tiny model."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import pytest
from fake_engine import tiny_engine

from engine.sampling_params import SamplingParams
from engine.server.engine_loop import RequestStream
from engine.server.generation import Generation
from engine.server.metrics import ServerMetrics

TOKENS = 12


def _sample(metrics: ServerMetrics, name: str, what: str) -> float:
    value = metrics.registry.get_sample_value(f"vllm:{name}_seconds_{what}", {"model_name": "m"})
    return 0.0 if value is None else value


def _answer(engine: Any, behind: bool) -> tuple[str, float]:
    """One request of TOKENS tokens through ``Generation``; ``behind``: its stream is read only
    once the engine has put every step's tokens on it (a frontend far behind the engine).
    Returns the text and the seconds from the submission to the answer's end."""

    async def run() -> tuple[str, float]:
        engine.start(asyncio.get_running_loop())
        stream = RequestStream([10, 11, 12], SamplingParams(max_tokens=TOKENS, ignore_eos=True),
                               engine.now())
        generation = Generation(engine, stream, engine.tokenizer, engine.metrics,
                                time.perf_counter())
        sent = time.perf_counter()
        engine.submit(stream)
        if behind:
            while stream.queue.qsize() < TOKENS:  # every step's token, not yet read
                await asyncio.sleep(0.005)
            await asyncio.sleep(0.05)  # and the finish, where it comes on its own
        text = "".join([piece.text async for piece in generation.pieces()])
        took = time.perf_counter() - sent
        await asyncio.get_running_loop().run_in_executor(None, engine.shutdown, 0.0)
        return text, took

    return asyncio.run(run())


@pytest.mark.parametrize("mode", ["process", "thread"])
@pytest.mark.parametrize("behind", [True, False])
def test_one_inter_token_latency_per_engine_step_however_far_behind_the_frontend(
        mode: str, behind: bool) -> None:
    """TOKENS tokens, one per step: TOKENS - 1 observations (the first token is TTFT's), each
    a step's time, in all no more than the request took; the same whether the frontend read
    each step as it came or all of them at once (before: 0 observations when it was behind)."""
    engine = tiny_engine(mode)
    _, took = _answer(engine, behind)
    metrics = engine.metrics
    assert _sample(metrics, "time_to_first_token", "count") == 1
    assert _sample(metrics, "inter_token_latency", "count") == TOKENS - 1
    assert 0 < _sample(metrics, "inter_token_latency", "sum") <= took


def test_a_request_ended_between_steps_leaves_no_engine_side_state() -> None:
    """The engine keeps the time of each running request's last token, to observe the next
    one's latency; a request the frontend ends between steps (an abort, a stop string) never
    finishes in a step, and its entry goes with the next step: nothing grows per request."""
    engine = tiny_engine("thread")

    async def run() -> None:
        engine.start(asyncio.get_running_loop())
        params = SamplingParams(max_tokens=2000, ignore_eos=True)
        streams = [RequestStream([10, 11, 12], params, engine.now()) for _ in range(3)]
        try:
            for stream in streams:
                engine.submit(stream)
            for stream in streams:
                await stream.queue.get()  # each has a token: it is in the engine's table
            for stream in streams[:2]:
                engine.finish(stream, "aborted")
            await asyncio.sleep(0.05)  # steps of the last one, after the aborts
            last = engine.token_clock.last_token_s
            assert set(last) == {streams[2].seq_id}
        finally:  # an engine thread left running keeps the test process alive
            await asyncio.get_running_loop().run_in_executor(None, engine.shutdown, 0.0)

    asyncio.run(run())
