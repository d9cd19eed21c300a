"""The pipe to the engine process cannot deadlock: the frontend's event loop never blocks on a
write, so the engine (which blocks writing its outputs once the frontend stops reading) always
gets its inputs read, and every request still completes once the frontend reads again."""

from __future__ import annotations

import asyncio
import threading
import time

from engine.sampling_params import SamplingParams
from engine.server.engine_client import EngineProcess
from engine.server.engine_loop import RequestStream
from engine.server.engine_proc import EngineSpec
from engine.server.proxy import ProxyStepTimes

# Fast steps: the engine writes outputs far faster than a frontend that does not read them.
FAST = ProxyStepTimes(base_s=2e-4, prefill_token_s=0.0, decode_seq_s=0.0)
DECODERS = 64
MAX_TOKENS = 1500
BIG_ADDS = 150
BIG_PROMPT = 1500


def test_submit_never_blocks_while_the_frontend_is_not_reading() -> None:
    engine = EngineProcess(EngineSpec(None, None, {"max_model_len": 4096}, proxy=FAST))
    try:
        params = SamplingParams(max_tokens=MAX_TOKENS, ignore_eos=True)
        streams = [RequestStream(list(range(10, 40)), params, 0.0) for _ in range(DECODERS)]
        for stream in streams:
            engine.submit(stream)
        # Nothing reads the engine's outputs yet (the loop is busy elsewhere): they fill the
        # pipe and the engine blocks writing them, so it no longer reads its inputs either.
        time.sleep(2.0)
        big = [RequestStream(list(range(10, 10 + BIG_PROMPT)),
                             SamplingParams(max_tokens=4, ignore_eos=True), 0.0)
               for _ in range(BIG_ADDS)]  # far more bytes than the pipe holds
        submitter = threading.Thread(target=lambda: [engine.submit(s) for s in big],
                                     daemon=True)
        submitter.start()
        submitter.join(10.0)
        assert not submitter.is_alive(), "submit blocked on the pipe: a deadlock"

        async def collect(stream: RequestStream) -> tuple[int, str | None]:
            count = 0
            while True:
                tokens, reason, error = await stream.queue.get()
                assert error is None, error
                count += len(tokens)
                if reason is not None:
                    return count, reason

        async def run() -> list[tuple[int, str | None]]:
            loop = asyncio.get_running_loop()
            engine.start(loop)
            out = await asyncio.wait_for(
                asyncio.gather(*(collect(s) for s in streams + big)), 120.0)
            await loop.run_in_executor(None, engine.shutdown, 0.0)  # as the app's lifespan
            return out

        results = asyncio.run(run())
        assert results[:DECODERS] == [(MAX_TOKENS, "length")] * DECODERS
        assert results[DECODERS:] == [(4, "length")] * BIG_ADDS
        assert engine.num_active == 0
        assert engine.counts.adds == DECODERS + BIG_ADDS
        assert engine.summary is not None  # the engine closed its trace and said so
    finally:
        engine.process.kill()
