"""The pipes to the engine process cannot lose or deadlock: the frontend's event loop reads the
engine's outputs without blocking (its end non-blocking) and never writes to the command pipe
itself, so a loop busy elsewhere neither loses a request nor stops the engine for good, and
every request completes once the loop reads again."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable

import pytest

from engine.sampling_params import SamplingParams
from engine.server.engine_client import EngineProcess
from engine.server.engine_loop import RequestStream
from engine.server.engine_proc import EngineSpec
from engine.server.proxy import ProxyStepTimes

# Fast steps: the engine writes outputs far faster than a frontend that does not read them.
FAST = ProxyStepTimes(base_s=2e-4, prefill_token_s=0.0, decode_seq_s=0.0)
DECODERS = 64
MAX_TOKENS = 1500
BIG_ADDS = 300
BIG_PROMPT = 1500


def _loop_factories() -> list:
    """asyncio's own loop and uvloop (what uvicorn runs when it is installed, as the serve
    extra has it): uvloop makes the fds it watches non-blocking, asyncio does not."""
    import uvloop

    return [pytest.param(asyncio.new_event_loop, id="asyncio"),
            pytest.param(uvloop.new_event_loop, id="uvloop")]


@pytest.mark.parametrize("loop_factory", _loop_factories())
def test_a_busy_event_loop_loses_no_request_and_never_blocks(
        loop_factory: Callable[[], asyncio.AbstractEventLoop]) -> None:
    engine = EngineProcess(EngineSpec(None, None, {"max_model_len": 4096}, proxy=FAST))
    try:
        params = SamplingParams(max_tokens=MAX_TOKENS, ignore_eos=True)
        streams = [RequestStream(list(range(10, 40)), params, 0.0) for _ in range(DECODERS)]
        big = [RequestStream(list(range(10, 10 + BIG_PROMPT)),
                             SamplingParams(max_tokens=4, ignore_eos=True), 0.0)
               for _ in range(BIG_ADDS)]  # far more bytes than a pipe holds

        async def collect(stream: RequestStream) -> tuple[int, str | None]:
            count = 0
            while True:
                tokens, reason, error = await stream.queue.get()
                assert error is None, error
                count += len(tokens)
                if reason is not None:
                    return count, reason

        async def run() -> tuple[float, list[tuple[int, str | None]]]:
            loop = asyncio.get_running_loop()
            engine.start(loop)
            for stream in streams:
                engine.submit(stream)
            # The loop is busy elsewhere: nothing reads the engine's outputs, which fill the
            # output pipe until the engine waits to write them and stops reading commands.
            time.sleep(2.0)
            began = time.perf_counter()
            for stream in big:
                engine.submit(stream)
            submit_s = time.perf_counter() - began
            out = await asyncio.wait_for(
                asyncio.gather(*(collect(s) for s in streams + big)), 120.0)
            await loop.run_in_executor(None, engine.shutdown, 0.0)  # as the app's lifespan
            return submit_s, out

        with asyncio.Runner(loop_factory=loop_factory) as runner:
            submit_s, results = runner.run(run())
        assert submit_s < 5.0, f"submit blocked on the pipe for {submit_s:.1f} s"
        assert results[:DECODERS] == [(MAX_TOKENS, "length")] * DECODERS
        assert results[DECODERS:] == [(4, "length")] * BIG_ADDS
        assert engine.num_active == 0
        assert engine.counts.adds == DECODERS + BIG_ADDS
        assert engine.summary is not None  # the engine closed its trace and said so
    finally:
        engine.process.kill()
