"""A server stopping (its grace period over) while the step that finishes a request is still in
flight: under async scheduling (on by default, the CPU runner included) that step's sequences
are already finished with its placeholder tokens when the stop's abort comes. The request must
end as the trace records it (``length``, every token), not be told ``abort`` one token short
while the trace says ``length`` (what ``loadgen`` then counted as a failed request).

Both engines are driven here step by step over a ``NullExecutor`` that overlaps, the process
engine's ``PipeInputs`` through real pipes, the thread engine's ``EngineLoop`` with its
deliveries collected."""

from __future__ import annotations

import contextlib
import multiprocessing
import os
from typing import Any

import pytest

from engine.config import Config
from engine.drive import drive
from engine.engine_core import EngineCore
from engine.executor import NullExecutor
from engine.sampling_params import SamplingParams
from engine.server.engine_loop import EngineLoop, RequestStream
from engine.server.engine_proc import PipeInputs
from engine.server.frames import MessageReader
from tracing.sink import MemorySink

MAX_TOKENS = 4
PROMPT = [5, 6, 7, 8]


def _core() -> tuple[EngineCore, MemorySink]:
    sink = MemorySink()
    config = Config(kvcache_block_size=4, num_kvcache_blocks=64, max_model_len=64,
                    max_num_batched_tokens=64, max_num_seqs=4, eos=1)
    return EngineCore(config, NullExecutor(64, overlap=True), sink=sink), sink


def _params(max_tokens: int) -> SamplingParams:
    return SamplingParams(max_tokens=max_tokens, ignore_eos=True)


def _step_until_finished_in_flight(core: EngineCore, on_result: Any) -> None:
    """Step ``core`` until sequence 0 is finished while the step that finished it has not been
    returned yet (the stop then comes between that launch and its result)."""
    for _ in range(50):
        result = core.step()
        if result is not None:
            on_result(result, 0.0)
        if core.sequences[0].is_finished:
            assert result is None or not any(s.seq_id == 0 for s in result.finished), \
                "the finishing step was not deferred: the test shows nothing"
            return
    raise AssertionError("sequence 0 never finished")


def _finished_rows(sink: MemorySink) -> dict[int, tuple[str, int]]:
    """What the trace records of each request's end: seq_id -> (reason, tokens)."""
    rows = sink.tables["request_finished"]
    return {seq: (reason, n) for seq, reason, n in
            zip(rows["seq_id"], rows["reason"], rows["num_completion_tokens"])}


def test_the_process_engine_stopping_keeps_a_finish_its_step_in_flight_made() -> None:
    """``PipeInputs``: the request finished by the step in flight when ``stop`` came gets its
    every token and ``length`` (as recorded); the one still running is aborted."""
    core, sink = _core()
    commands, frontend_end = multiprocessing.Pipe(duplex=False)
    out_read, out_write = os.pipe()
    inputs = PipeInputs(commands, out_write, core)
    frontend_end.send(("add", 100, PROMPT, _params(MAX_TOKENS), 0.0, 0))
    frontend_end.send(("add", 101, PROMPT, _params(40), 0.0, 0))
    inputs.feed(core, 0.0)
    _step_until_finished_in_flight(core, inputs.on_result)
    frontend_end.send(("stop",))
    drive(core, inputs, lambda: 0.0, lambda due: None)
    core.close()
    os.close(out_write)
    reader = MessageReader(out_read)
    tokens: dict[int, int] = {100: 0, 101: 0}
    finishes: dict[int, str] = {}
    messages = []
    with contextlib.suppress(EOFError):  # every message read: the writer's end is closed
        while (message := reader.read_one(5.0)) is not None:
            messages.append(message)
    for message in messages:
        _, rids, toks, ends, errors, _ = message
        assert not errors
        for rid in rids:
            tokens[rid] += 1
        for rid, reason in ends:
            assert rid not in finishes, f"request {rid} finished twice"
            finishes[rid] = reason
    os.close(out_read)
    assert finishes == {100: "length", 101: "aborted"}
    assert tokens[100] == MAX_TOKENS
    recorded = _finished_rows(sink)
    assert recorded[0] == ("length", MAX_TOKENS)
    assert recorded[1][0] == "aborted" and recorded[1][1] == tokens[101]


class _Llm:
    """What ``EngineLoop`` uses of an ``LLMEngine`` here: its core, and ``close``."""

    def __init__(self, core: EngineCore) -> None:
        self.core = core

    def close(self) -> dict[str, Any]:
        return self.core.close()


class _Loop:
    """Runs what the engine thread hands the event loop at once (no event loop here)."""

    def call_soon_threadsafe(self, fn: Any, *args: Any) -> None:
        fn(*args)


@pytest.fixture
def event_loop_streams() -> Any:
    import asyncio

    loop = asyncio.new_event_loop()
    asyncio.set_event_loop(loop)
    yield loop
    asyncio.set_event_loop(None)
    loop.close()


def test_the_thread_engine_stopping_keeps_a_finish_its_step_in_flight_made(
        event_loop_streams: Any) -> None:
    """``EngineLoop``: as the process engine, the request the in-flight step finished ends
    ``length`` with all its tokens, the running one ``aborted``; each stream ends once."""
    core, sink = _core()
    engine = EngineLoop(_Llm(core))  # type: ignore[arg-type]
    engine._loop = _Loop()  # type: ignore[assignment]
    done = RequestStream(list(PROMPT), _params(MAX_TOKENS), 0.0)
    running = RequestStream(list(PROMPT), _params(40), 0.0)
    engine.submit(done)
    engine.submit(running)
    engine.feed(core, 0.0)
    _step_until_finished_in_flight(core, engine.on_result)
    engine._stop = True  # what ``shutdown`` sets once the grace period is over
    engine._accepting = False
    drive(core, engine, lambda: 0.0, lambda due: None)
    core.close()

    def drained(stream: RequestStream) -> tuple[int, list[str]]:
        count, reasons = 0, []
        while not stream.queue.empty():
            tokens, reason, error = stream.queue.get_nowait()
            assert error is None, error
            count += len(tokens)
            if reason is not None:
                reasons.append(reason)
        return count, reasons

    assert drained(done) == (MAX_TOKENS, ["length"])
    count, reasons = drained(running)
    assert reasons == ["aborted"]
    assert engine.num_active == 0
    recorded = _finished_rows(sink)
    assert recorded[0] == ("length", MAX_TOKENS)
    assert recorded[1] == ("aborted", count)
