"""A long prompt is tokenized off the event loop: while it tokenizes, another stream's tokens go
on flowing and a small request sent meanwhile is answered; requests reach the engine when their
prompts are ready, stamped with that moment as their arrival (nondecreasing in the engine's
order); a text that cannot fit the context is refused before it is encoded where a safe bound
says so. In process, over raw ASGI or the app's test client, with a stand-in engine."""

from __future__ import annotations

import asyncio
import json
import random
import threading
import time
from typing import Any

import pytest

pytest.importorskip("fastapi")

from fake_engine import MODEL, FakeEngine, app_client, http_scope, tiny_tokenizer  # noqa: E402

from engine.server.app import create_app  # noqa: E402
from engine.server.engine_loop import RequestStream  # noqa: E402
from engine.server.prompt import PromptPreparer, token_floor  # noqa: E402

PACE_S = 0.005  # the streamed answer's token interval
BIG_CHARS = 2_000_000  # ~1 s of BPE on the development VM
LONG_CHARS = 50_000  # the encodes ``_watch_encodes`` records: these tests' long prompts
WORDS = "the quick brown fox jumps over a lazy dog; def f(x): return x + 1 # 42".split()


def _text(chars: int, seed: int = 0) -> str:
    rng = random.Random(seed)
    words = [rng.choice(WORDS) for _ in range(chars // 4)]
    return " ".join(words)[:chars]



async def _call(app: Any, body: dict[str, Any] | bytes, chunks: list[float] | None = None,
                leave: asyncio.Event | None = None) -> list[dict[str, Any]]:
    """One request over raw ASGI: its response messages. ``chunks`` gets the time of each body
    chunk as it is sent; ``leave``: the client disconnects once it is set."""
    raw = body if isinstance(body, bytes) else json.dumps(body).encode()
    messages = [{"type": "http.request", "body": raw, "more_body": False}]
    sent: list[dict[str, Any]] = []

    async def receive() -> dict[str, Any]:
        if messages:
            return messages.pop(0)
        if leave is not None:
            await leave.wait()
        else:
            await asyncio.Event().wait()  # a client that stays until its answer is complete
        return {"type": "http.disconnect"}

    async def send(message: dict[str, Any]) -> None:
        if chunks is not None and message.get("body"):
            chunks.append(time.perf_counter())
        sent.append(message)

    await app(http_scope("/v1/completions"), receive, send)
    return sent


async def _until(condition: Any, what: str, limit_s: float = 120.0) -> None:
    """Wait (polling the event loop) until ``condition()``; fail after ``limit_s``."""
    deadline = time.perf_counter() + limit_s
    while not condition():
        assert time.perf_counter() < deadline, f"gave up waiting for {what}"
        await asyncio.sleep(0.001)


class PacedEngine(FakeEngine):
    """Answers with one token every ``PACE_S`` seconds, by ``call_later`` on the event loop (a
    blocked loop delays them), up to ``max_tokens`` or until the request is finished."""

    def __init__(self, max_model_len: int) -> None:
        super().__init__(max_model_len=max_model_len, answer=False)
        self.token = self.tokenizer.encode(" fox", add_special_tokens=False)[0]

    def submit(self, stream: RequestStream) -> None:
        super().submit(stream)
        assert self.loop is not None
        left = [stream.params.max_tokens]

        def tick() -> None:
            if any(done is stream for done, _ in self.finished):
                return
            left[0] -= 1
            stream.queue.put_nowait(([self.token], None if left[0] else "length", None))
            if left[0]:
                self.loop.call_later(PACE_S, tick)  # type: ignore[union-attr]

        self.loop.call_soon(tick)


def _watch_encodes(monkeypatch: pytest.MonkeyPatch, gate: threading.Event | None = None
                   ) -> list[tuple[float, float]]:
    """Record (start, end) of each encode of a long text (in the prompt pool's thread); with
    ``gate``, such an encode first waits for it."""
    spans: list[tuple[float, float]] = []
    original = PromptPreparer.encode

    def encode(self: PromptPreparer, text: str) -> Any:
        if len(text) < LONG_CHARS:
            return original(self, text)
        start = time.perf_counter()
        if gate is not None:
            spans.append((start, start))  # started: the test may go on
            gate.wait(60)
        result = original(self, text)
        spans.append((start, time.perf_counter()))
        return result

    monkeypatch.setattr(PromptPreparer, "encode", encode)
    return spans


def test_a_long_prompt_tokenizes_while_another_stream_flows(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """A stream is answered a token every 5 ms while a 2 MB prompt is tokenized: its chunks
    keep coming. On the loop the tokenization held the interpreter for its whole length (the
    stream's gap spanned it: measured 1.4 s of 1.4 s); off it, the longest gap is a small part
    of the tokenization's measured time, whatever that is on a loaded machine."""
    spans = _watch_encodes(monkeypatch)
    engine = PacedEngine(max_model_len=10**7)
    chunks: list[float] = []
    body = json.dumps({"prompt": _text(BIG_CHARS), "max_tokens": 1}).encode()

    async def scenario() -> list[dict[str, Any]]:
        app = create_app(engine, MODEL)
        async with app.router.lifespan_context(app):
            leave = asyncio.Event()
            stream = asyncio.ensure_future(_call(
                app, {"prompt": "hi", "max_tokens": 10**6, "stream": True}, chunks, leave))
            await _until(lambda: len(chunks) >= 3, "the stream to flow")
            big = await _call(app, body)
            await _until(lambda: chunks[-1] > spans[0][1] + 0.05, "the stream after it")
            leave.set()
            await stream
            return big

    big = asyncio.run(scenario())
    assert big[0]["status"] == 200, big
    assert json.loads(big[-1]["body"])["usage"]["prompt_tokens"] > BIG_CHARS // 10
    [(start, end)] = spans
    took = end - start
    assert took > 0.2, f"the prompt tokenized in {took:.3f} s: too short to tell"
    inside = [t for t in chunks if start <= t <= end]
    before = [t for t in chunks if t < start][-1:]
    after = [t for t in chunks if t > end][:1]
    around = before + inside + after
    worst = max(b - a for a, b in zip(around, around[1:]))
    assert len(inside) >= 5 and worst < took / 2, (
        f"tokenizing took {took:.3f} s; the stream sent {len(inside)} chunks meanwhile, "
        f"its longest gap {worst:.3f} s")


def test_a_small_request_sent_behind_a_tokenizing_one_reaches_the_engine_first(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """The ordering rule: a request goes to the engine when its prompt is ready, not in the
    order requests came in. A small request sent while a long prompt tokenizes is answered in
    full meanwhile; the long one follows, its arrival the moment it was handed over (after the
    tokenization), so the engine's arrivals are nondecreasing in its order of adds."""
    gate = threading.Event()
    spans = _watch_encodes(monkeypatch, gate)
    engine = FakeEngine(max_model_len=10**6)
    released: list[float] = []

    async def scenario() -> tuple[list, list]:
        app = create_app(engine, MODEL)
        async with app.router.lifespan_context(app):
            try:
                big = asyncio.ensure_future(_call(
                    app, {"prompt": _text(100_000), "max_tokens": 2}))
                await _until(lambda: bool(spans), "the long prompt to tokenize (at the gate)")
                small = await _call(app, {"prompt": "hi", "max_tokens": 3})
                assert len(engine.submitted) == 1 and not big.done()
                released.append(engine.now())
            finally:
                gate.set()
            return small, await big

    small, big = asyncio.run(scenario())
    assert small[0]["status"] == 200 and big[0]["status"] == 200
    first, second = engine.submitted
    assert len(first.token_ids) < 10 < len(second.token_ids)
    assert first.arrival_s <= released[0] <= second.arrival_s
    assert [s.seq_id for s in engine.submitted] == [0, 1]


def test_a_text_beyond_the_context_is_refused_before_it_is_encoded(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """20,000 characters can be no fewer than 157 tokens of the Qwen vocabulary (its longest
    token is 128 bytes): with a 64-token context that is refused without encoding, prompt or
    chat. A text the bound cannot speak for (not NFC: the tokenizer normalizes it shorter)
    is encoded and refused by its count; token ids, by their count before their values."""
    calls: list[int] = []
    original = PromptPreparer.encode

    def encode(self: PromptPreparer, text: str) -> Any:
        calls.append(len(text))
        return original(self, text)

    monkeypatch.setattr(PromptPreparer, "encode", encode)
    long_text = "a " * 10_000
    with app_client(FakeEngine(max_model_len=64)) as client:
        for path, body, param in [
            ("/v1/completions", {"prompt": long_text}, "prompt"),
            ("/v1/chat/completions", {"messages": [{"role": "user", "content": long_text}]},
             "messages"),
        ]:
            error = client.post(path, json=body).json()["error"]
            assert (error["code"], error["param"]) == ("context_length_exceeded", param)
            assert "is at least 157 tokens" in error["message"], error
        assert calls == []
        error = client.post("/v1/completions", json={"prompt": "e\u0301" * 200}).json()["error"]
        assert error["code"] == "context_length_exceeded" and "the prompt has" in error["message"]
        assert calls == [400]
        error = client.post("/v1/completions", json={"prompt": [10**9] * 100}).json()["error"]
        assert error["code"] == "context_length_exceeded", error


def test_the_token_floor_is_never_above_the_real_count_and_the_ids_are_encodes() -> None:
    """The bound is safe: for texts built to pack many bytes into few tokens (runs of spaces
    and dashes, special tokens, multi-byte characters) it never exceeds the real count; the
    off-loop encoding gives ``tokenizer.encode``'s ids."""
    tokenizer = tiny_tokenizer()
    floor = token_floor(tokenizer)
    assert floor is not None and floor.max_token_bytes == 128 and floor.nfc
    preparer = PromptPreparer(tokenizer, 10**6, tokenizer.vocab_size)
    pieces = [" " * 300, "-" * 500, "//" + "-" * 112, "<|im_start|>", "<|endoftext|>", "中文",
              "é", "e\u0301", "\n\n", "\t", "abc", "1234567", "😀"]
    rng = random.Random(7)
    try:
        for _ in range(200):
            text = "".join(rng.choice(pieces) for _ in range(rng.randint(1, 40)))
            encoded = preparer.encode(text)
            assert floor.tokens_at_least(text) <= len(encoded), text
            assert encoded.ids == tokenizer.encode(text, add_special_tokens=False)
    finally:
        preparer.close()
