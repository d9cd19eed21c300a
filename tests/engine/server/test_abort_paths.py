"""A request the client no longer waits for is aborted in the engine at once, whichever way the
response ended: the client left before the stream's first chunk, or the handler of a
non-streamed answer was cancelled (uvicorn does that to what still runs when a shutdown's grace
period is over). Driven over raw ASGI, with a stand-in engine that never answers."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import pytest

pytest.importorskip("fastapi")

from fake_engine import MODEL, FakeEngine, http_scope  # noqa: E402

from engine.server.app import create_app  # noqa: E402


async def _with_app(engine: FakeEngine, body: Any) -> None:
    """Run ``body(app)`` with the app's lifespan started (the engine gets the loop)."""
    app = create_app(engine, MODEL)
    async with app.router.lifespan_context(app):
        await body(app)


@pytest.mark.parametrize("path, body, sends", [
    ("/v1/completions", {"prompt": "hi"}, 0),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}]}, 1),
], ids=["before-the-headers", "during-the-chat-role-chunk"])
def test_a_stream_left_before_its_first_token_is_aborted(path: str, body: dict,
                                                         sends: int) -> None:
    """The client is gone before the stream's first token: while the headers went out
    (Starlette cancels the response before the body's generator ran) or while a chat's first
    chunk (the role, sent before any token) went out. Nothing aborted the request, which ran
    on to ``max_tokens`` (a chat's default: the rest of the context) and was recorded as
    finished normally."""
    engine = FakeEngine(answer=False)
    payload = json.dumps({**body, "max_tokens": 50, "stream": True}).encode()

    async def scenario(app: Any) -> None:
        messages = [{"type": "http.request", "body": payload, "more_body": False}]
        sent: list[dict[str, Any]] = []

        async def receive() -> dict[str, Any]:
            if messages:
                return messages.pop(0)
            while len(sent) <= sends:
                await asyncio.sleep(0.001)
            return {"type": "http.disconnect"}

        async def send(message: dict[str, Any]) -> None:
            sent.append(message)
            await asyncio.sleep(0.05)  # the disconnect is seen while this goes out

        await app(http_scope(path), receive, send)
        await asyncio.sleep(0.05)
        assert len(sent) == sends + 1

    asyncio.run(_with_app(engine, scenario))
    assert len(engine.submitted) == 1
    assert engine.finished == [(engine.submitted[0], "aborted")]


def test_a_cancelled_non_streamed_request_is_aborted_at_once() -> None:
    """Cancelling the handler of a non-streamed answer left its collecting task running,
    waiting on the engine: the request was not aborted (a shutdown then waited for it)."""
    engine = FakeEngine(answer=False)
    payload = json.dumps({"prompt": "hi", "max_tokens": 50}).encode()

    async def scenario(app: Any) -> None:
        messages = [{"type": "http.request", "body": payload, "more_body": False}]
        connected = asyncio.Event()

        async def receive() -> dict[str, Any]:
            if messages:
                return messages.pop(0)
            await connected.wait()  # the client stays
            return {"type": "http.disconnect"}

        async def send(message: dict[str, Any]) -> None:
            pass

        task = asyncio.ensure_future(app(http_scope("/v1/completions"), receive, send))
        while not engine.submitted:
            await asyncio.sleep(0.01)
        await asyncio.sleep(0.05)
        assert engine.finished == []
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        await asyncio.sleep(0.05)
        assert [t for t in asyncio.all_tasks() if t is not asyncio.current_task()] == []

    asyncio.run(_with_app(engine, scenario))
    assert engine.finished == [(engine.submitted[0], "aborted")]


def test_a_client_that_leaves_a_whole_answer_is_aborted_once() -> None:
    """The client of a non-streamed answer disconnects: one abort, and the metrics count it
    once (the handler's own clean-up must not count it again)."""
    engine = FakeEngine(answer=False)
    payload = json.dumps({"prompt": "hi", "max_tokens": 50}).encode()
    sent: list[dict[str, Any]] = []

    async def scenario(app: Any) -> None:
        messages = [{"type": "http.request", "body": payload, "more_body": False}]

        async def receive() -> dict[str, Any]:
            if messages:
                return messages.pop(0)
            await asyncio.sleep(0.1)
            return {"type": "http.disconnect"}

        async def send(message: dict[str, Any]) -> None:
            sent.append(message)

        await app(http_scope("/v1/completions"), receive, send)

    asyncio.run(_with_app(engine, scenario))
    assert engine.finished == [(engine.submitted[0], "aborted")]
    assert sent[0]["status"] == 499
    text = engine.metrics.render().decode()
    assert 'vllm:request_success_total{finished_reason="abort",model_name="replayllm-tiny"} 1.0' \
        in text
