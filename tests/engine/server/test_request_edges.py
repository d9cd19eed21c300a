"""Request bodies that used to crash the engine or the server, or got an answer OpenAI's API does
not give: each is now a 4xx OpenAI error object naming the field, and none reaches the engine
(so none reaches the trace). In process, over the app with a stand-in engine (``fake_engine``):
no model, no engine process."""

from __future__ import annotations

from typing import Any

import pytest

pytest.importorskip("fastapi")

from fake_engine import MODEL, FakeEngine, app_client  # noqa: E402

from engine.sampling_params import SamplingParams  # noqa: E402
from engine.server.protocol import ApiError, parse_chat, parse_json_body  # noqa: E402


@pytest.fixture(scope="module")
def engine() -> FakeEngine:
    return FakeEngine(max_model_len=64)


def _error(client: Any, body: bytes, path: str = "/v1/completions",
           status: int = 400) -> dict[str, Any]:
    """POST ``body``; the OpenAI error object of the answer, which must have ``status``."""
    response = client.post(path, content=body, headers={"content-type": "application/json"})
    assert response.status_code == status, response.text
    error = response.json()["error"]
    assert set(error) == {"message", "type", "param", "code"}
    assert error["message"]
    return error


def _never_reaches_the_engine(engine: FakeEngine, client: Any, body: bytes,
                              path: str = "/v1/completions") -> dict[str, Any]:
    before = len(engine.submitted)
    error = _error(client, body, path)
    assert len(engine.submitted) == before, "the request reached the engine"
    return error


@pytest.mark.parametrize("body, param", [
    (b'{"prompt": "hi", "stop": "\\ud800", "max_tokens": 2}', "stop"),
    (b'{"prompt": "hi", "stop": ["ok", "\\udfff"], "stream": true}', "stop"),
    (b'{"prompt": "a\\ud800b", "max_tokens": 2}', "prompt"),
    (b'{"prompt": "hi", "user": "\\ud83d"}', "user"),
])
def test_a_lone_surrogate_escape_is_a_400_naming_its_field(engine: FakeEngine, client: Any,
                                                           body: bytes, param: str) -> None:
    """A ``\\ud800`` escape decodes to a string no UTF-8 encoder takes: in a stop string it
    reached the trace's Parquet writer and killed the engine (every later request a 503), in a
    prompt the tokenizer (a plain-text 500). Now a 400 naming the field, the engine untouched;
    a well-formed surrogate pair (an emoji) is still fine."""
    error = _never_reaches_the_engine(engine, client, body)
    assert error["param"] == param and "surrogate" in error["message"]
    chat = b'{"messages": [{"role": "user", "content": [{"type": "text", "text": "\\udc00"}]}]}'
    assert _never_reaches_the_engine(engine, client, chat, "/v1/chat/completions")[
        "param"] == "messages"
    pair = parse_json_body(b'{"prompt": "\\ud83d\\ude42", "stop": "\\\\ud800"}')
    assert pair == {"prompt": "\U0001f642", "stop": "\\ud800"}


@pytest.mark.parametrize("body", [
    b'{"prompt": "hi", "temperature": Infinity}',
    b'{"prompt": "hi", "temperature": -Infinity}',
    b'{"prompt": "hi", "top_p": NaN}',
    b'{"prompt": "hi", "temperature": 1e400}',
])
def test_non_json_numbers_are_400s(engine: FakeEngine, client: Any, body: bytes) -> None:
    """``Infinity``, ``NaN`` and numbers past a float's range are not JSON; Python's parser took
    them, and ``temperature: Infinity`` reached the engine (and the trace) as a sampling
    setting."""
    assert "not valid JSON" in _never_reaches_the_engine(engine, client, body)["message"]


def test_top_k_beyond_the_traces_int32_column_is_a_400(engine: FakeEngine, client: Any) -> None:
    """``top_k`` 2**40 passed every check and overflowed the trace's int32 column when the
    recorder wrote it: the engine died. Now a 400; a large top_k that fits is still served."""
    error = _never_reaches_the_engine(engine, client, b'{"prompt": "hi", "top_k": 1099511627776}')
    assert error["param"] == "top_k"
    ok = client.post("/v1/completions", json={"prompt": "hi", "top_k": 2**31 - 1,
                                              "max_tokens": 2})
    assert ok.status_code == 200, ok.text


@pytest.mark.parametrize("part", [{"type": "text", "text": 5}, {"type": "text"},
                                  {"type": "text", "text": None}])
def test_a_text_part_without_a_string_is_a_400(engine: FakeEngine, client: Any,
                                               part: dict) -> None:
    """A content part's ``text`` must be a string: ``5`` became the prompt "5" and a missing
    text an empty one, silently."""
    import json

    body = json.dumps({"messages": [{"role": "user", "content": [part]}]}).encode()
    error = _never_reaches_the_engine(engine, client, body, "/v1/chat/completions")
    assert error["param"] == "messages" and "text" in error["message"]


@pytest.mark.parametrize("body, param", [
    (b'{"prompt": "hi", "stream": true, "stream_options": {"include_usage": "no"}}',
     "stream_options"),
    (b'{"prompt": "hi", "user": 5}', "user"),
])
def test_wrongly_typed_fields_are_400s(engine: FakeEngine, client: Any, body: bytes,
                                       param: str) -> None:
    """``include_usage: "no"`` was taken as true (any non-empty string), ``user: 5`` served."""
    assert _never_reaches_the_engine(engine, client, body)["param"] == param


def test_an_assistant_turn_may_have_null_content_but_no_tool_calls() -> None:
    """OpenAI's assistant messages may carry ``content: null``: it was a 400; tool calls in the
    history are refused by name (this server has no tools)."""
    history = {"messages": [{"role": "user", "content": "hi"},
                            {"role": "assistant", "content": None},
                            {"role": "user", "content": "again"}]}
    assert parse_chat(history).messages[1] == {"role": "assistant", "content": ""}
    history["messages"][1]["tool_calls"] = [{"id": "1", "type": "function"}]
    with pytest.raises(ApiError, match="tool calls"):
        parse_chat(history)


def test_a_prompt_longer_than_the_context_says_so(engine: FakeEngine, client: Any) -> None:
    """A prompt over ``max_model_len`` with no max_tokens was a 400 saying it "asks for -913
    more" tokens; now it says the prompt leaves no room, with OpenAI's code."""
    body = b'{"messages": [{"role": "user", "content": "' + b"word " * 200 + b'"}]}'
    error = _never_reaches_the_engine(engine, client, body, "/v1/chat/completions")
    assert error["code"] == "context_length_exceeded" and error["param"] == "messages"
    assert "-" not in error["message"] and "no room" in error["message"]
    error = _never_reaches_the_engine(engine, client, b'{"prompt": "hi", "max_tokens": 100}')
    assert error["code"] == "context_length_exceeded" and "at most 63" in error["message"]


def test_an_unknown_model_is_openais_404(engine: FakeEngine, client: Any) -> None:
    """OpenAI answers a model it does not serve with a 404 ``model_not_found`` (the ``openai``
    client raises ``NotFoundError``); it was a 400."""
    error = _error(client, b'{"model": "gpt-4", "prompt": "x"}', status=404)
    assert error["code"] == "model_not_found" and error["param"] == "model"


def test_models_retrieve_and_unknown_routes(client: Any) -> None:
    """``GET /v1/models/{id}`` (``client.models.retrieve``) was a 404; unknown paths and methods
    answered ``{"detail": ...}``, which OpenAI clients cannot read as an error."""
    import openai

    api = openai.OpenAI(base_url="http://testserver/v1", api_key="none", http_client=client,
                        max_retries=0)
    assert api.models.retrieve(MODEL).id == MODEL
    with pytest.raises(openai.NotFoundError):
        api.models.retrieve("gpt-4")
    for method, path, status in [("GET", "/v1/nope", 404), ("DELETE", "/v1/models", 405),
                                 ("GET", "/v1/completions", 405)]:
        response = client.request(method, path)
        assert response.status_code == status
        assert response.json()["error"]["type"] == "invalid_request_error"


def test_an_unexpected_exception_is_an_openai_500() -> None:
    """A bug of ours (any exception in a route) was a plain-text "Internal Server Error" that
    OpenAI clients cannot parse; now an OpenAI error object of type ``server_error``."""

    class Broken(FakeEngine):
        def admission_error(self, token_ids: list[int], params: SamplingParams) -> str | None:
            raise RuntimeError("boom")

    with app_client(Broken()) as client:
        response = client.post("/v1/completions", json={"prompt": "hi"})
    assert response.status_code == 500
    error = response.json()["error"]
    assert error["type"] == "server_error" and "boom" in error["message"]


def test_bookkeeping_fields_clients_send_are_accepted_and_ignored() -> None:
    """``store``, ``metadata``, ``service_tier`` and the like change nothing in an answer and
    clients send them by default: a request with them parses as the same request without them
    (they were a 400 "unsupported field"); a modality other than text stays a 400."""
    base = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 3}
    extra = {"store": False, "metadata": {"run": "a"}, "service_tier": "auto",
             "prompt_cache_key": "k", "safety_identifier": "u1", "modalities": ["text"]}
    assert parse_chat({**base, **extra}) == parse_chat(base)
    with pytest.raises(ApiError, match="modalities"):
        parse_chat({**base, "modalities": ["text", "audio"]})
