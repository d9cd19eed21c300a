"""What a client can make the frontend hold is bounded: a body over the limit is a 413 before it
is all read (its Content-Length, or its chunks as they come); a long prompt finding the
tokenizing pool's queue full is a 429 with a Retry-After while short prompts go on; a client
that leaves while its prompt waits or tokenizes never reaches the engine, and the pool lets go
of it. In process, over raw ASGI or the app's test client, with a stand-in engine."""

from __future__ import annotations

import asyncio
import json
import threading
import time
from typing import Any

import pytest

pytest.importorskip("fastapi")

from fake_engine import MODEL, FakeEngine, app_client  # noqa: E402

from engine.server.app import create_app  # noqa: E402
from engine.server.limits import MIN_MAX_REQUEST_BYTES  # noqa: E402
from engine.server.prompt import PREP_WORKERS, PromptPreparer  # noqa: E402
from engine.server.protocol import ApiError, ParsedRequest  # noqa: E402

LONG = "the quick brown fox jumps over the lazy dog " * 500  # 22,000 characters: the pool's


class Client:
    """One request over raw ASGI. ``body``: its chunks (``more_body`` on all but the last);
    ``length``: a Content-Length header; ``leave``: the client disconnects once it is set.
    ``reads``: the body chunks the app asked for; ``sent``: its response messages."""

    def __init__(self, body: list[bytes], length: int | None = None,
                 leave: asyncio.Event | None = None) -> None:
        self.body, self.length, self.leave = list(body), length, leave
        self.reads = 0
        self.sent: list[dict[str, Any]] = []

    async def __call__(self, app: Any, path: str = "/v1/completions") -> Client:
        headers = [(b"content-type", b"application/json"), (b"host", b"testserver")]
        if self.length is not None:
            headers.append((b"content-length", str(self.length).encode()))
        scope = {"type": "http", "asgi": {"version": "3.0", "spec_version": "2.3"},
                 "http_version": "1.1", "method": "POST", "scheme": "http", "path": path,
                 "raw_path": path.encode(), "root_path": "", "query_string": b"",
                 "headers": headers, "client": ("127.0.0.1", 5000),
                 "server": ("testserver", 80)}

        async def receive() -> dict[str, Any]:
            if self.body:
                self.reads += 1
                chunk = self.body.pop(0)
                return {"type": "http.request", "body": chunk, "more_body": bool(self.body)}
            await (self.leave or asyncio.Event()).wait()
            return {"type": "http.disconnect"}

        async def send(message: dict[str, Any]) -> None:
            self.sent.append(message)

        await app(scope, receive, send)
        return self

    @property
    def status(self) -> int:
        return self.sent[0]["status"]

    def error(self) -> dict[str, Any]:
        return json.loads(b"".join(m.get("body", b"") for m in self.sent[1:]))["error"]

    def header(self, name: str) -> str | None:
        return dict(self.sent[0]["headers"]).get(name.encode(), b"").decode() or None


def _json(body: dict[str, Any]) -> list[bytes]:
    return [json.dumps(body).encode()]


def _gate_encodes(monkeypatch: pytest.MonkeyPatch) -> tuple[threading.Event, list[str]]:
    """Every encode of a long text waits for the returned gate; ``started`` lists those begun."""
    gate, started = threading.Event(), []
    original = PromptPreparer.encode

    def encode(self: PromptPreparer, text: str) -> Any:
        if len(text) > 10_000:
            started.append(text)
            assert gate.wait(60), "the test never opened the gate"
        return original(self, text)

    monkeypatch.setattr(PromptPreparer, "encode", encode)
    return gate, started


async def _until(condition: Any, what: str, limit_s: float = 60.0) -> None:
    deadline = time.perf_counter() + limit_s
    while not condition():
        assert time.perf_counter() < deadline, f"gave up waiting for {what}"
        await asyncio.sleep(0.001)


def test_an_oversized_body_is_a_413_before_it_is_all_read() -> None:
    """A declared 500 MB body is refused before one byte of it is read; a chunked one with no
    Content-Length, once its chunks pass the limit (here the default's floor: the context is
    small); a body of exactly the limit is served. Each 413 is an OpenAI error object."""
    engine = FakeEngine(max_model_len=256)
    mib = 2**20
    good = json.dumps({"prompt": "hi", "max_tokens": 2}).encode()

    async def scenario() -> tuple[Client, Client, Client, Client]:
        app = create_app(engine, MODEL)
        assert app.state.server.max_request_bytes == MIN_MAX_REQUEST_BYTES
        small = create_app(engine, MODEL, max_request_bytes=len(good))
        async with app.router.lifespan_context(app), small.router.lifespan_context(small):
            declared = await Client([b"{}"] * 500, length=500 * mib)(app)
            chunked = await Client([b" " * mib] * 500)(app)
            exact = await Client([good], length=len(good))(small)
            over = await Client([good + b" "])(small)
            return declared, chunked, exact, over

    declared, chunked, exact, over = asyncio.run(scenario())
    for refused in (declared, chunked, over):
        assert refused.status == 413
        error = refused.error()
        assert (error["type"], error["code"]) == ("invalid_request_error", "request_too_large")
        assert "--max-request-bytes" in error["message"]
    assert declared.reads == 0
    assert chunked.reads == MIN_MAX_REQUEST_BYTES // mib + 1
    assert exact.status == 200
    assert len(engine.submitted) == 1


def test_the_default_body_limit_grows_with_the_context() -> None:
    """128 bytes a token of the context, at least 8 MiB; a test client gets the same 413."""
    assert create_app(FakeEngine(max_model_len=10**6), MODEL).state.server.max_request_bytes \
        == 128 * 10**6
    with app_client(FakeEngine(max_model_len=256)) as client:
        answer = client.post("/v1/chat/completions", content=b" " * (MIN_MAX_REQUEST_BYTES + 1))
        assert answer.status_code == 413 and answer.json()["error"]["code"] == "request_too_large"


def test_a_client_that_leaves_while_its_prompt_is_in_the_pool_never_reaches_the_engine(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Three long prompts: two tokenizing (held at a gate), one waiting. The waiting one's
    client leaves: it leaves the queue at once and is never encoded; a tokenizing one's client
    leaves: its encode finishes unused. Neither is submitted (nothing for the trace), each is
    answered 499, and the pool holds nothing once the rest are served."""
    gate, started = _gate_encodes(monkeypatch)
    engine = FakeEngine(max_model_len=10**6)

    async def scenario() -> tuple[list[Client], Any]:
        app = create_app(engine, MODEL)
        prompts = app.state.server.prompts
        async with app.router.lifespan_context(app):
            try:
                leaves = [asyncio.Event() for _ in range(3)]
                clients = [Client(_json({"prompt": f"{i} {LONG}", "max_tokens": 2}),
                                  leave=leaves[i]) for i in range(3)]
                calls = [asyncio.ensure_future(c(app)) for c in clients]
                await _until(lambda: len(started) == PREP_WORKERS and prompts.in_pool == 3,
                             "two prompts tokenizing and one waiting")
                leaves[2].set()  # the waiting one
                await calls[2]
                await _until(lambda: prompts.in_pool == 2, "the waiting job to leave the pool")
                leaves[0].set()  # a tokenizing one
                await calls[0]
                assert engine.submitted == [] and prompts.in_pool == 2
            finally:
                gate.set()
            await calls[1]
            await _until(lambda: prompts.in_pool == 0, "the pool to empty")
            return clients, prompts

    clients, prompts = asyncio.run(scenario())
    assert [c.status for c in clients] == [499, 200, 499]
    assert [s.token_ids[:1] for s in engine.submitted] == [
        engine.tokenizer.encode("1", add_special_tokens=False)]
    assert engine.finished == [] and len(started) == 2
    assert prompts._in_pool_chars == 0


def test_a_full_pool_refuses_long_prompts_with_a_429_and_short_ones_go_on(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """With one prompt allowed to wait: two tokenizing and one waiting fill the pool; a fourth
    long prompt is a 429 (an OpenAI error object, a Retry-After in whole seconds) and is never
    encoded, while a short prompt and a token-id prompt are served. Once the pool drains, a
    long prompt is taken again."""
    gate, started = _gate_encodes(monkeypatch)
    engine = FakeEngine(max_model_len=10**6)

    async def scenario() -> tuple[list[Client], Client, Client, Client, Client]:
        app = create_app(engine, MODEL, max_waiting_prompts=1)
        prompts = app.state.server.prompts
        async with app.router.lifespan_context(app):
            try:
                held = [Client(_json({"prompt": f"{i} {LONG}", "max_tokens": 2}))
                        for i in range(3)]
                calls = [asyncio.ensure_future(c(app)) for c in held]
                await _until(lambda: prompts.in_pool == 3, "the pool to fill")
                refused = await Client(_json({"messages": [
                    {"role": "user", "content": LONG}]}))(app, "/v1/chat/completions")
                short = await Client(_json({"prompt": "hi", "max_tokens": 2}))(app)
                ids = await Client(_json({"prompt": [1, 2, 3], "max_tokens": 2}))(app)
                assert len(started) == 2 and prompts.in_pool == 3
            finally:
                gate.set()
            await asyncio.gather(*calls)
            await _until(lambda: prompts.in_pool == 0, "the pool to empty")
            again = await Client(_json({"prompt": LONG, "max_tokens": 2}))(app)
            return held, refused, short, ids, again

    held, refused, short, ids, again = asyncio.run(scenario())
    assert refused.status == 429
    error = refused.error()
    assert (error["type"], error["code"]) == ("rate_limit_error", "rate_limit_exceeded")
    assert "--max-waiting-prompts" in error["message"]
    assert int(refused.header("retry-after") or 0) >= 1
    assert [c.status for c in (*held, short, ids, again)] == [200] * 6
    assert len(engine.submitted) == 6 and len(started) == 4


def _pool_gauges(app: Any) -> dict[str, float]:
    """The tokenizer pool's gauges as ``/metrics`` shows them, for the served model."""
    from prometheus_client.parser import text_string_to_metric_families

    text = app.state.server.metrics.render().decode()
    return {sample.name: sample.value for family in text_string_to_metric_families(text)
            for sample in family.samples if "tokenizer_pool" in sample.name
            and sample.labels == {"model_name": MODEL}}


def test_metrics_show_the_prompts_and_characters_in_the_tokenizer_pool(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Three long prompts in the pool (two tokenizing at the gate, one waiting): ``/metrics``
    says 3 prompts and their characters; a short prompt adds nothing; drained, 0 and 0."""
    gate, _ = _gate_encodes(monkeypatch)
    engine = FakeEngine(max_model_len=10**6)
    texts = [f"{i} {LONG}" for i in range(3)]

    async def scenario() -> tuple[dict[str, float], dict[str, float], dict[str, float]]:
        app = create_app(engine, MODEL)
        prompts = app.state.server.prompts
        async with app.router.lifespan_context(app):
            before = _pool_gauges(app)
            try:
                calls = [asyncio.ensure_future(Client(_json({"prompt": t, "max_tokens": 2}))(app))
                         for t in texts]
                await _until(lambda: prompts.in_pool == 3, "the pool to fill")
                await Client(_json({"prompt": "hi", "max_tokens": 2}))(app)
                full = _pool_gauges(app)
            finally:
                gate.set()
            await asyncio.gather(*calls)
            await _until(lambda: prompts.in_pool == 0, "the pool to empty")
            return before, full, _pool_gauges(app)

    before, full, after = asyncio.run(scenario())
    names = ("replayllm:num_prompts_in_tokenizer_pool",
             "replayllm:num_prompt_chars_in_tokenizer_pool")
    assert before == after == dict.fromkeys(names, 0.0)
    assert full == dict(zip(names, (3.0, float(sum(map(len, texts))))))


def _refusals(count: int, in_pool_chars: int, seconds_per_char: float) -> list[int]:
    """The Retry-After of ``count`` long prompts refused by a full pool (two tokenizing, one
    waiting) holding ``in_pool_chars`` characters at ``seconds_per_char``."""
    preparer = PromptPreparer(FakeEngine().tokenizer, 10**6, 1000, max_waiting=1)
    preparer._in_pool, preparer._in_pool_chars = 3, in_pool_chars
    preparer._seconds_per_char = seconds_per_char
    retries = []
    try:
        for _ in range(count):
            with pytest.raises(ApiError) as refused:
                asyncio.run(preparer.token_ids(ParsedRequest(chat=False, model=None,
                                                             prompt=LONG)))
            assert refused.value.status == 429
            retries.append(int((refused.value.headers or {})["Retry-After"]))
    finally:
        preparer.close()
    return retries


def test_refused_clients_are_told_to_come_back_at_spread_times() -> None:
    """A pool needing 30 s for what it holds (3 slots): twelve refusals get Retry-Afters spread
    over those 30 s (each slot's share, 10 s, shifted by up to half of it), not all 30 s; the
    same sequence again from a fresh pool; past the 60 s cap, spread within 60 s; a pool that
    drains in well under a second says 1 s, never 0."""
    retries = _refusals(12, 60_000_000, 1e-6)  # 60 M characters, two threads: 30 s
    assert retries == _refusals(12, 60_000_000, 1e-6)
    assert all(5 <= r <= 35 for r in retries), retries
    assert len(set(retries)) >= 8, retries
    for slot in range(3):  # the slots in turn: 5-15 s, 15-25 s, 25-35 s
        assert all(5 + 10 * slot <= r <= 15 + 10 * slot for r in retries[slot::3]), retries
    capped = _refusals(12, 10**9, 1e-6)  # 500 s
    assert all(1 <= r <= 60 for r in capped) and len(set(capped)) >= 8, capped
    assert _refusals(3, 30_000, 1e-6) == [1, 1, 1]
