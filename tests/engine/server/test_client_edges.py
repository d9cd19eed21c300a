"""What real clients do at the edges of a request, over raw ASGI with a stand-in engine
(``fake_engine``): a client that leaves while its body is still coming in, and a server whose
KV pool holds less than its context (``--set num_kvcache_blocks``), as OpenAI clients meet it."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import pytest

pytest.importorskip("fastapi")

from fake_engine import MODEL, FakeEngine, http_scope  # noqa: E402

from engine.server.app import create_app  # noqa: E402


def _send_part_then_leave(engine: FakeEngine, path: str, first: bytes) -> list[dict[str, Any]]:
    """Drive ``path`` with a body of which only ``first`` arrives (more announced) before the
    client disconnects; what the app sent back."""
    app = create_app(engine, MODEL)
    sent: list[dict[str, Any]] = []

    async def scenario() -> None:
        messages = [{"type": "http.request", "body": first, "more_body": True},
                    {"type": "http.disconnect"}]

        async def receive() -> dict[str, Any]:
            if messages:
                return messages.pop(0)
            await asyncio.sleep(3600)  # nothing more ever comes
            raise AssertionError("unreachable")

        async def send(message: dict[str, Any]) -> None:
            sent.append(message)

        async with app.router.lifespan_context(app):
            await asyncio.wait_for(app(http_scope(path), receive, send), 5)

    asyncio.run(scenario())
    return sent


@pytest.mark.parametrize("path", ["/v1/completions", "/v1/chat/completions"])
def test_a_client_that_leaves_mid_body_is_a_499_not_a_server_error(path: str) -> None:
    """A client gone before its body is whole (a timeout while uploading, a dropped
    connection, ``Expect: 100-continue`` then nothing) raised Starlette's ``ClientDisconnect``
    out of the handler: a 500 and an "Exception in ASGI application" traceback in the server's
    log per such client. It is now the 499 of any client that left, and nothing reaches the
    engine."""
    engine = FakeEngine()
    sent = _send_part_then_leave(engine, path, b'{"prompt": "hel')
    starts = [m for m in sent if m["type"] == "http.response.start"]
    assert [m["status"] for m in starts] == [499]
    assert engine.submitted == []


class SmallPoolEngine(FakeEngine):
    """A stand-in engine whose KV pool holds ``pool_tokens`` tokens, fewer than its context:
    a request whose prompt and answer (less its last token, never stored) need more is one it
    could never serve, as ``Scheduler.admission_error`` says of a small ``num_kvcache_blocks``."""

    def __init__(self, pool_tokens: int) -> None:
        super().__init__(max_model_len=256)
        self.pool_tokens = pool_tokens

    def admission_error(self, token_ids: list[int], params: Any) -> str | None:
        needed = len(token_ids) + params.max_tokens - 1
        if needed > self.pool_tokens:
            return f"request needs {needed} tokens of KV cache but the whole pool has " \
                   f"{self.pool_tokens}"
        return None


def _post(engine: FakeEngine, path: str, body: dict[str, Any]) -> tuple[int, dict[str, Any]]:
    from fake_engine import app_client

    with app_client(engine) as client:
        response = client.post(path, content=json.dumps(body))
        return response.status_code, response.json()


def test_a_chat_without_max_tokens_gets_what_a_small_kv_pool_can_hold() -> None:
    """A chat that sets no ``max_tokens`` asks for the rest of the context (vLLM's default). On
    a server whose KV pool holds less than the context, every such chat (what chat UIs and
    most SDK calls send) was a 400 naming ``messages`` that the client could not fix. Its
    default is now the longest answer the engine could ever hold; the answer runs to it."""
    engine = SmallPoolEngine(pool_tokens=100)
    assert engine.pool_tokens < engine.max_model_len
    status, body = _post(engine, "/v1/chat/completions",
                         {"messages": [{"role": "user", "content": "hi"}]})
    assert status == 200, body
    (stream,) = engine.submitted
    ids, given = stream.token_ids, stream.params.max_tokens
    assert engine.admission_error(ids, stream.params) is None
    assert engine.admission_error(ids, stream.params.__class__(max_tokens=given + 1)) is not None


@pytest.mark.parametrize("path, body, field", [
    ("/v1/completions", {"prompt": "hi", "max_tokens": 150}, "max_tokens"),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}],
                              "max_completion_tokens": 150}, "max_completion_tokens"),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}],
                              "max_tokens": 150}, "max_tokens"),
    ("/v1/completions", {"prompt": list(range(1, 151)), "max_tokens": 1}, "prompt"),
])
def test_a_request_past_the_kv_pool_names_the_field_that_does_not_fit(
        path: str, body: dict[str, Any], field: str) -> None:
    """A request the pool could never hold is a 400 naming what does not fit: the length the
    client asked for where the prompt alone fits (it named the prompt, or the messages, that
    the client had no reason to change), else the prompt."""
    engine = SmallPoolEngine(pool_tokens=100)
    status, answer = _post(engine, path, body)
    assert status == 400
    assert answer["error"]["param"] == field
    assert answer["error"]["type"] == "invalid_request_error"
    assert engine.submitted == []


# Mistral's and Llama 2's templates refuse a conversation whose roles do not alternate.
ALTERNATING_TEMPLATE = (
    "{% for message in messages %}"
    "{% if (message['role'] == 'user') != (loop.index0 % 2 == 0) %}"
    "{{ raise_exception('Conversation roles must alternate user/assistant/user/assistant/...') }}"
    "{% endif %}"
    "{{ message['role'] + ': ' + message['content'] + '\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ 'assistant: ' }}{% endif %}"
)


@pytest.mark.parametrize("long", [False, True], ids=["on-the-loop", "in-the-pool"])
def test_messages_the_models_chat_template_refuses_are_a_400(long: bool) -> None:
    """A checkpoint whose chat template refuses the messages (``raise_exception``: two user
    turns in a row under Mistral's or Llama 2's template, a system turn under Gemma's) was a
    500 ``internal server error: TemplateError`` and a traceback in the log; it is a 400
    naming ``messages`` with the template's own message, as vLLM answers, whether the prompt
    is rendered on the loop or in the tokenizing pool; a conversation it takes is served."""
    import copy

    engine = FakeEngine(max_model_len=8192)
    engine.tokenizer = copy.copy(engine.tokenizer)
    engine.tokenizer.chat_template = ALTERNATING_TEMPLATE
    text = "hi " * (3000 if long else 1)
    status, answer = _post(engine, "/v1/chat/completions", {
        "messages": [{"role": "user", "content": text}, {"role": "user", "content": "again"}],
        "max_tokens": 2})
    assert status == 400, answer
    assert answer["error"]["param"] == "messages"
    assert "roles must alternate" in answer["error"]["message"]
    assert engine.submitted == []
    status, answer = _post(engine, "/v1/chat/completions", {
        "messages": [{"role": "user", "content": text}], "max_tokens": 2})
    assert status == 200, answer
