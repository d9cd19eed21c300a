"""Requests real clients can send that the server mishandled (hardening round s37), in process
over the app with the stand-in engine (``fake_engine``): what reaches the engine, and the
OpenAI-style error a request the server cannot honour gets."""

from __future__ import annotations

import asyncio
import copy
import threading
from typing import Any

import numpy as np
import pytest

pytest.importorskip("fastapi")

from fake_engine import MODEL, FakeEngine, app_client, tiny_tokenizer  # noqa: E402

from engine.sampling_params import SamplingParams  # noqa: E402
from engine.server.prompt import INLINE_PROMPT_CHARS, PromptPreparer  # noqa: E402
from engine.server.protocol import ApiError, parse_chat, parse_json_body  # noqa: E402

USER = [{"role": "user", "content": "hi"}]


def _error(response: Any, param: str | None) -> dict[str, Any]:
    assert response.status_code == 400, response.text
    error = response.json()["error"]
    assert error["type"] == "invalid_request_error"
    assert error["param"] == param
    assert error["message"]
    return error


def _recorded(value: float) -> float:
    """What the trace's float32 column holds for ``value``, read back."""
    return float(np.float32(value))


@pytest.mark.parametrize("path", ["/v1/completions", "/v1/chat/completions"])
@pytest.mark.parametrize("field, value", [("temperature", 1e308), ("temperature", 3.5e38),
                                          ("top_p", 5e-324), ("top_p", 1e-46)])
def test_values_the_traces_float32_columns_cannot_hold_are_400s(
        engine: FakeEngine, client: Any, path: str, field: str, value: float) -> None:
    """A temperature past float32's range or a top_p below its smallest positive value was
    run as sent and recorded as ``inf`` or ``0.0``, which ``replayllm verify`` then refused
    ("temperature must be a finite number, got inf"): the trace could not be replayed. Now a
    400 naming the field, and nothing reaches the engine."""
    body: dict[str, Any] = {"model": MODEL, field: value, "max_tokens": 2}
    body.update({"messages": USER} if "chat" in path else {"prompt": "hi"})
    before = len(engine.submitted)
    error = _error(client.post(path, json=body), field)
    assert "float32" in error["message"]
    assert len(engine.submitted) == before


@pytest.mark.parametrize("field, value", [("temperature", 1e-5), ("temperature", 0.7),
                                          ("top_p", 0.99999999), ("top_p", 0.3),
                                          ("temperature", 1e38)])
def test_the_engine_runs_the_sampling_values_the_trace_records(
        engine: FakeEngine, client: Any, field: str, value: float) -> None:
    """The engine ran a request's temperature and top_p as sent (float64) while the trace
    recorded them as float32: temperature 1e-5 sampled (not below ``GREEDY_BELOW``), but its
    recorded 9.99999975e-06 replays greedy, so ``replayllm verify`` diverged at the request's
    ``request_added``; top_p 0.99999999 ran the top-p path and was recorded as 1.0 (none).
    Now the engine gets the float32 value the trace holds, so run and replay agree."""
    before = len(engine.submitted)
    response = client.post("/v1/completions", json={"model": MODEL, "prompt": "hi",
                                                     "max_tokens": 2, field: value})
    assert response.status_code == 200, response.text
    params = engine.submitted[before].params
    recorded = SamplingParams(**{field: _recorded(value)})
    assert getattr(params, field) == getattr(recorded, field)


@pytest.mark.parametrize("raw", [
    b'{"prompt": ' + b"[" * 100_000 + b"]" * 100_000 + b"}",
    b'{"prompt": "hi", "metadata": ' + b'{"a":' * 5000 + b"1" + b"}" * 5000 + b"}",
    # Over the off-loop threshold: parsed in the body thread.
    b'{"prompt": "' + b"x" * 70_000 + b'", "metadata": ' + b"[" * 5000 + b"]" * 5000 + b"}",
], ids=["deep-list", "deep-object", "deep-offloop"])
def test_a_body_nested_too_deeply_is_a_400(engine: FakeEngine, client: Any,
                                           raw: bytes) -> None:
    """A body nested deeper than the parser's recursion limit (``[[[[...]]]]``, a few KB) was
    a 500 "internal server error: RecursionError" with a traceback in the server's log. Now a
    400 saying the body is nested too deeply."""
    before = len(engine.submitted)
    response = client.post("/v1/completions", content=raw,
                           headers={"content-type": "application/json"})
    error = _error(response, None)
    assert "nested too deeply" in error["message"]
    assert len(engine.submitted) == before


@pytest.mark.parametrize("depth", [900, 960, 985, 995])
def test_a_lone_surrogate_deep_in_a_body_is_a_400_from_any_stack(depth: int) -> None:
    """A lone surrogate escape nested near the parser's recursion limit: whether the parse
    overflowed depended on how deep the caller's stack already was (the app's passed at 950,
    failed at 980), a RecursionError (500) instead of a 400. Now, from a shallow or a deeper
    stack, it is an ``ApiError``: the surrogate's, naming the field, or the too-deep one."""
    raw = b'{"metadata": ' + b"[" * depth + b'"\\ud800"' + b"]" * depth + b"}"

    def nested(levels: int) -> Any:  # the check run from a deeper stack than the app's
        return parse_json_body(raw) if levels == 0 else nested(levels - 1)

    for levels in (0, 40):
        with pytest.raises(ApiError) as caught:
            nested(levels)
        error = caught.value
        assert error.status == 400
        assert error.param == "metadata" or "nested too deeply" in error.message


# A template that uses a message's ``name``, as some models' do (vLLM passes it through).
NAMED_TEMPLATE = ("{% for m in messages %}{{ m['role'] }}"
                  "{% if m.name %}({{ m.name }}){% endif %}: {{ m['content'] }}\n"
                  "{% endfor %}assistant:")


def test_a_messages_name_reaches_the_chat_template() -> None:
    """OpenAI's ``name`` of a message (which participant spoke) was dropped before the chat
    template rendered the prompt: a template that uses it (vLLM passes it through) got a
    different prompt, silently. Now it reaches the template; a non-string name is a 400."""
    named = FakeEngine(max_model_len=256)
    named.tokenizer = copy.copy(named.tokenizer)
    named.tokenizer.chat_template = NAMED_TEMPLATE
    messages = [{"role": "user", "content": "hi", "name": "ada"}]
    with app_client(named) as test_client:
        response = test_client.post("/v1/chat/completions",
                                    json={"model": MODEL, "messages": messages})
        assert response.status_code == 200, response.text
        expected = named.tokenizer.encode("user(ada): hi\nassistant:", add_special_tokens=False)
        assert named.submitted[-1].token_ids == expected
        bad = [{"role": "user", "content": "hi", "name": 7}]
        _error(test_client.post("/v1/chat/completions", json={"messages": bad}), "messages")


@pytest.mark.parametrize("extra", [{"foo": 1}, {"tool_call_id": "call_1"},
                                   {"refusal": "no"}, {"reasoning_content": 7}])
def test_a_message_field_the_server_does_not_know_is_a_400(engine: FakeEngine, client: Any,
                                                          extra: dict[str, Any]) -> None:
    """A message's field other than role, content, name and reasoning_content was dropped
    silently (the request ran as if the client had not sent it), where OpenAI refuses an
    unknown one and a template may use it. Now a 400 naming ``messages`` and the field (and a
    non-string reasoning_content)."""
    before = len(engine.submitted)
    messages = [{"role": "user", "content": "hi", **extra}]
    error = _error(client.post("/v1/chat/completions", json={"messages": messages}),
                   "messages")
    assert next(iter(extra)) in error["message"]
    assert len(engine.submitted) == before


REASONING_TEMPLATE = ("{% for m in messages %}{{ m['role'] }}: "
                      "{% if m.reasoning_content %}<think>{{ m.reasoning_content }}</think>"
                      "{% endif %}{{ m['content'] }}\n{% endfor %}assistant:")


def test_an_assistant_turns_reasoning_reaches_the_chat_template() -> None:
    """An assistant turn echoed back with its ``reasoning_content`` (a reasoning model's
    answer, as vLLM returns it) reaches the template, which renders or strips it (Qwen3's
    does), instead of being dropped or refused."""
    engine = FakeEngine(max_model_len=256)
    engine.tokenizer = copy.copy(engine.tokenizer)
    engine.tokenizer.chat_template = REASONING_TEMPLATE
    messages = [{"role": "user", "content": "hi"},
                {"role": "assistant", "content": "hello", "reasoning_content": "greet"},
                {"role": "user", "content": "and?"}]
    with app_client(engine) as test_client:
        response = test_client.post("/v1/chat/completions",
                                    json={"model": MODEL, "messages": messages})
        assert response.status_code == 200, response.text
    expected = engine.tokenizer.encode("user: hi\nassistant: <think>greet</think>hello\n"
                                       "user: and?\nassistant:", add_special_tokens=False)
    assert engine.submitted[-1].token_ids == expected


def test_the_empty_fields_an_echoed_assistant_message_carries_are_accepted(
        engine: FakeEngine, client: Any) -> None:
    """An assistant message a client sends back as the ``openai`` library returned it holds
    ``refusal``, ``audio``, ``function_call``, ``tool_calls`` and ``annotations``, all empty:
    accepted, as OpenAI does (they say nothing)."""
    echoed = {"role": "assistant", "content": "hello", "refusal": None, "audio": None,
              "function_call": None, "tool_calls": [], "annotations": []}
    messages = [{"role": "user", "content": "hi"}, echoed, {"role": "user", "content": "and?"}]
    response = client.post("/v1/chat/completions", json={"model": MODEL, "messages": messages})
    assert response.status_code == 200, response.text


def test_a_long_name_is_tokenized_off_the_event_loop(monkeypatch: pytest.MonkeyPatch) -> None:
    """A message's ``name`` is rendered into the prompt, so it counts toward the prompt's
    size: a chat whose long text is its names (not its contents) is tokenized in the prompt
    pool, not on the event loop, where it would stall every other stream."""
    preparer = PromptPreparer(tiny_tokenizer(), 1_000_000, 100_000)
    threads: list[str] = []
    prepare = PromptPreparer.prepare

    def watched(self: PromptPreparer, parsed: Any) -> Any:
        threads.append(threading.current_thread().name)
        return prepare(self, parsed)

    monkeypatch.setattr(PromptPreparer, "prepare", watched)
    body = {"messages": [{"role": "user", "content": "hi", "name": "n" * 10 * INLINE_PROMPT_CHARS}]}
    try:
        ids, field = asyncio.run(preparer.token_ids(parse_chat(body)))
    finally:
        preparer.close()
    assert field == "messages" and ids
    assert threads and threads[0].startswith("replayllm-prompt"), threads
