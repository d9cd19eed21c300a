"""A request that meets a stopped engine is a 503 (``service_unavailable``, with ``Retry-After``),
never a 500, whichever engine and wherever the stop finds it: the engine process dead before
the frontend noticed (the request is sent down a broken pipe), or dying while the request runs;
the in-thread engine stopped (the grace period over) before it took a request already
submitted. A stream, whose 200 is already sent, ends with an error event of the same type and
``[DONE]``. Before, each of these was a 500 ``server_error`` for a whole answer (and a
``server_error`` event for a stream), though a request arriving once the stop was known was
already a 503: the client could not tell a dead or stopping server from a bug of ours.

The app runs in this test's event loop over the real engines on the tiny model, so a test can
kill the engine process between two of the loop's turns."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from typing import Any

import pytest

pytest.importorskip("fastapi")

import httpx  # noqa: E402

from engine.server.app import create_app  # noqa: E402
from engine.server.engine_proc import EngineSpec  # noqa: E402

MODEL = "replayllm-tiny"
WAIT_S = 60.0  # every wait below ends on an event long before this on a working server
PATHS = {"completions": ("/v1/completions", {"prompt": "hello"}),
         "chat": ("/v1/chat/completions", {"messages": [{"role": "user", "content": "hello"}]})}
# An answer far longer than a test: the engine is still producing it when it stops.
LONG = {"max_tokens": 4000, "ignore_eos": True}


def _spec() -> EngineSpec:
    return EngineSpec(None, None, {"max_model_len": 4096, "calibration_repeats": -1})


@asynccontextmanager
async def _served(engine: Any) -> AsyncIterator[httpx.AsyncClient]:
    """A client of the app over ``engine``, in this event loop, its lifespan started."""
    app = create_app(engine, MODEL)
    async with app.router.lifespan_context(app):
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://testserver",
                                     timeout=WAIT_S) as client:
            yield client


def _kill(engine: Any) -> None:
    """kill -9 of the engine process, waited for (blocking the loop: nothing reads its EOF)."""
    os.kill(engine.process.pid, signal.SIGKILL)
    engine.process.join(WAIT_S)
    assert not engine.process.is_alive()


def _assert_unavailable(response: httpx.Response) -> dict[str, Any]:
    assert response.status_code == 503, response.text
    assert int(response.headers["Retry-After"]) >= 1
    error = response.json()["error"]
    assert error["type"] == "service_unavailable"
    return error


def _events(response: httpx.Response) -> list[str]:
    return [line for line in response.text.splitlines() if line]


async def _when(ready: Callable[[], bool]) -> None:
    deadline = time.monotonic() + WAIT_S
    while not ready():
        assert time.monotonic() < deadline, "timed out"
        await asyncio.sleep(0.005)


def _run(test: Callable[[], Awaitable[None]]) -> None:
    asyncio.run(asyncio.wait_for(test(), 3 * WAIT_S))


def _process_engine() -> Any:
    from engine.server.engine_client import EngineProcess

    return EngineProcess(_spec())


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "stream"])
@pytest.mark.parametrize("kind", list(PATHS))
def test_a_request_sent_to_an_engine_process_that_just_died_is_a_503(kind: str,
                                                                     stream: bool) -> None:
    """The engine process is dead but the frontend has not read its EOF yet: the request passes
    the intake gate and its ``add`` meets a broken pipe, so ``submit`` refuses it as a stopped
    engine's (``the engine process died``). That was a 500 ``server_error`` (a stream: a 200,
    then an error event); a request a moment later (the death known) was already a 503."""
    path, body = PATHS[kind]
    engine = _process_engine()

    async def test() -> None:
        async with _served(engine) as client:
            assert (await client.post(path, json={**body, "max_tokens": 2})).status_code == 200
            _kill(engine)
            sent = {**body, "max_tokens": 2, "stream": stream}
            error = _assert_unavailable(await client.post(path, json=sent))
            assert error["message"] == "the engine process died"
            late = _assert_unavailable(await client.post(path, json={**body, "max_tokens": 2}))
            assert late["message"] == "the engine failed: the engine process died"

    _run(test)


@pytest.mark.parametrize("kind", list(PATHS))
def test_a_whole_answer_the_engine_process_dies_under_is_a_503(kind: str) -> None:
    """A non-streamed request the engine was answering when its process died (kill -9)."""
    path, body = PATHS[kind]
    engine = _process_engine()

    async def test() -> None:
        async with _served(engine) as client:
            answer = asyncio.ensure_future(client.post(path, json={**body, **LONG}))
            await _when(lambda: engine.counts.tokens > 0)  # it is being answered
            _kill(engine)
            error = _assert_unavailable(await answer)
            assert error["message"] == "the engine process died"

    _run(test)


@pytest.mark.parametrize("kind", list(PATHS))
def test_a_stream_the_engine_process_dies_under_ends_with_a_service_unavailable_event(
        kind: str) -> None:
    """A stream (its 200 already sent) ends with an error event of the whole answer's type,
    then ``[DONE]``; it was a ``server_error`` event."""
    path, body = PATHS[kind]
    engine = _process_engine()

    async def test() -> None:
        async with _served(engine) as client:
            stream = asyncio.ensure_future(client.post(path, json={**body, **LONG,
                                                                   "stream": True}))
            await _when(lambda: engine.counts.tokens > 0)
            _kill(engine)
            response = await stream
            assert response.status_code == 200
            lines = _events(response)
            assert lines[-1] == "data: [DONE]"
            error = json.loads(lines[-2].removeprefix("data: "))["error"]
            assert error == {"message": "the engine process died",
                             "type": "service_unavailable", "param": None, "code": None}

    _run(test)


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "stream"])
def test_a_request_the_thread_engine_stopped_before_taking_it_is_a_503(stream: bool) -> None:
    """``--engine thread``: a request submitted (intake still open) that the engine thread had
    not yet taken when the grace period ended (``shutdown(0)``): the engine fails it with ``the
    server is shutting down``. A whole answer was a 500, a stream a ``server_error`` event;
    the process engine adds such a request and aborts it."""
    from engine.server.engine_loop import EngineLoop

    class LateEngineLoop(EngineLoop):
        """Its thread starts only when the test says (``go``), so a request waits for it."""

        def start(self, loop: asyncio.AbstractEventLoop) -> None:
            self._loop = loop

        def go(self) -> None:
            super().start(self._loop)

    engine = LateEngineLoop(_spec().build())
    path, body = PATHS["completions"]

    async def test() -> None:
        async with _served(engine) as client:
            request = asyncio.ensure_future(client.post(path, json={**body, **LONG,
                                                                    "stream": stream}))
            await _when(lambda: engine.num_active == 1)  # submitted, not taken
            await asyncio.get_running_loop().run_in_executor(None, engine.shutdown, 0.0)
            engine.go()
            response = await request
            if stream:
                lines = _events(response)
                assert response.status_code == 200 and lines[-1] == "data: [DONE]"
                error = json.loads(lines[-2].removeprefix("data: "))["error"]
                assert error["type"] == "service_unavailable"
            else:
                error = _assert_unavailable(response)
            assert error["message"] == "the server is shutting down"

    _run(test)
