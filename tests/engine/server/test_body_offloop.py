"""A large request body is parsed and checked off the event loop, interruptibly: while 6 MiB of
token ids are parsed, the loop's other work goes on; a small body is parsed on the loop; both
give the same answers. In process, over raw ASGI, with a stand-in engine."""

from __future__ import annotations

import asyncio
import json
import random
import threading
import time
from typing import Any

import pytest

pytest.importorskip("fastapi")

from fake_engine import MODEL, FakeEngine, app_client, http_scope  # noqa: E402

import engine.server.limits as limits  # noqa: E402
from engine.server.app import create_app  # noqa: E402
from engine.server.protocol import parse_json_body  # noqa: E402

IDS = 900_000  # ~6 MiB of JSON token ids: ~70 ms of JSON and ~130 ms of field checks


async def _post(app: Any, raw: bytes) -> list[dict[str, Any]]:
    messages = [{"type": "http.request", "body": raw, "more_body": False}]
    sent: list[dict[str, Any]] = []

    async def receive() -> dict[str, Any]:
        if messages:
            return messages.pop(0)
        await asyncio.Event().wait()
        return {"type": "http.disconnect"}

    async def send(message: dict[str, Any]) -> None:
        sent.append(message)

    await app(http_scope("/v1/completions"), receive, send)
    return sent


def test_a_large_body_is_parsed_while_the_loop_goes_on() -> None:
    """A ticker on the loop (every 1 ms) keeps ticking while a 6 MiB body of token ids is parsed
    and checked (then refused: too long for the context). On the loop its longest gap was the
    whole request (measured ~250 ms of ~250 ms); off it, a small part of it."""
    rng = random.Random(3)
    raw = json.dumps({"prompt": [rng.randrange(1000) for _ in range(IDS)]}).encode()
    assert len(raw) > limits.OFFLOOP_BODY_BYTES
    engine = FakeEngine(max_model_len=4096)

    async def scenario() -> tuple[list[dict[str, Any]], float, float]:
        app = create_app(engine, MODEL)
        ticks: list[float] = []
        stop = asyncio.Event()

        async def tick() -> None:
            while not stop.is_set():
                ticks.append(time.perf_counter())
                await asyncio.sleep(0.001)

        async with app.router.lifespan_context(app):
            ticker = asyncio.ensure_future(tick())
            await asyncio.sleep(0.02)
            start = time.perf_counter()
            sent = await _post(app, raw)
            end = time.perf_counter()
            await asyncio.sleep(0.01)
            stop.set()
            await ticker
        around = [t for t in ticks if t < start][-1:] + [t for t in ticks if start <= t]
        return sent, end - start, max(b - a for a, b in zip(around, around[1:]))

    sent, took, worst = asyncio.run(scenario())
    assert sent[0]["status"] == 400
    assert json.loads(sent[1]["body"])["error"]["code"] == "context_length_exceeded"
    assert engine.submitted == []
    assert took > 0.1, f"the request took {took:.3f} s: too short to tell"
    assert worst < took / 2, f"the request took {took:.3f} s, the loop's longest gap {worst:.3f} s"


def test_small_bodies_on_the_loop_large_ones_off_it_with_the_same_answers(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Where each body is parsed (its thread) and what the client gets: a body just over the
    threshold is parsed in the body thread, one under it on the loop's; the answers (a 200, a
    400 naming the field, a 400 for malformed JSON) are the same either way."""
    threads: list[tuple[str, bool]] = []

    def recording(raw: bytes, interruptible: bool = False) -> dict[str, Any]:
        threads.append((threading.current_thread().name, interruptible))
        return parse_json_body(raw, interruptible)

    monkeypatch.setattr(limits, "parse_json_body", recording)
    pad = " " * limits.OFFLOOP_BODY_BYTES
    with app_client(FakeEngine(max_model_len=256)) as client:
        answers = []
        for padding in ("", pad):
            for body in ('{"prompt": "hi", "max_tokens": 2}', '{"prompt": 3.5}',
                         '{"prompt": [1, 2', '{"prompt": ' + "9" * 5000 + "}"):
                answer = client.post("/v1/completions", content=(body + padding).encode())
                error = answer.json().get("error") or {}
                answers.append((answer.status_code, error.get("param"),
                                error.get("message", "")[:40]))
    small, large = answers[:4], answers[4:]
    assert small == large
    assert [status for status, _, _ in small] == [200, 400, 400, 400]
    assert small[1][1] == "prompt" and "not valid JSON" in small[3][2]
    assert all(not name.startswith("replayllm-body") and not hooks for name, hooks in threads[:4])
    assert all(name.startswith("replayllm-body") and hooks for name, hooks in threads[4:])
