"""What the server takes as vLLM takes it though the OpenAI schema is stricter: an integer field
written as a whole float (``5.0``), an empty model name; and where it keeps OpenAI's rule
(``stream_options: {}``). In process over the app with the stand-in engine (``fake_engine``)."""

from __future__ import annotations

import json
from typing import Any

import pytest

pytest.importorskip("fastapi")

from fake_engine import MODEL, FakeEngine  # noqa: E402

from engine.server.protocol import INT_FIELDS  # noqa: E402

USER = [{"role": "user", "content": "hi"}]
COMPLETION = ("/v1/completions", {"model": MODEL, "prompt": "hi"})
CHAT = ("/v1/chat/completions", {"model": MODEL, "messages": USER})


def _submitted(engine: FakeEngine, client: Any, path: str, body: dict) -> Any:
    before = len(engine.submitted)
    response = client.post(path, json=body)
    assert response.status_code == 200, (body, response.text)
    assert len(engine.submitted) == before + 1
    return engine.submitted[-1]


@pytest.mark.parametrize("path, base", [COMPLETION, CHAT], ids=["completions", "chat"])
def test_whole_floats_in_integer_fields_are_served_as_ints(engine: FakeEngine, client: Any,
                                                           path: str, base: dict) -> None:
    """``"max_tokens": 5.0``, ``"seed": 3.0``, ``"top_k": 20.0`` (and every other integer
    field: ``n``, ``best_of``, ``priority``, ``top_logprobs``, chat's
    ``max_completion_tokens``) were 400s ("must be an integer"); vLLM's pydantic takes a whole
    float for an int. Served now, reaching the engine as the ints themselves (an int in the
    trace's columns, not a float)."""
    floats = {"max_tokens": 5.0, "seed": 3.0, "top_k": 20.0, "n": 1.0, "best_of": 1.0,
              "priority": -2.0}
    if path == CHAT[0]:
        floats |= {"top_logprobs": 0.0, "max_completion_tokens": 4.0}
    stream = _submitted(engine, client, path, {**base, **floats})
    params = stream.params
    assert params.max_tokens == (4 if path == CHAT[0] else 5)
    assert (params.seed, params.top_k, stream.priority) == (3, 20, -2)
    for value in (params.max_tokens, params.seed, params.top_k, stream.priority):
        assert type(value) is int
    ints = {name: int(value) for name, value in floats.items()}
    same = _submitted(engine, client, path, {**base, **ints})
    assert (same.params.max_tokens, same.params.seed, same.params.top_k, same.priority) == \
        (params.max_tokens, params.seed, params.top_k, stream.priority)


@pytest.mark.parametrize("name", INT_FIELDS)
def test_a_fraction_or_a_bool_in_an_integer_field_is_a_400_naming_it(
        engine: FakeEngine, client: Any, name: str) -> None:
    """``5.5`` in any integer field is a 400 whose ``param`` names the field (vLLM refuses it
    too); ``true`` stays refused, as before; nothing reaches the engine."""
    path, base = CHAT if name in ("max_completion_tokens", "top_logprobs") else COMPLETION
    before = len(engine.submitted)
    for bad in (5.5, 0.5, True):
        response = client.post(path, json={**base, name: bad})
        assert response.status_code == 400, (name, bad, response.text)
        error = response.json()["error"]
        assert error["param"] == name, (name, bad, error)
    assert len(engine.submitted) == before


def test_token_id_prompts_take_whole_floats(engine: FakeEngine, client: Any) -> None:
    """A prompt of token ids written as floats (``[1.0, 2.0]``, also a batch of one) is the
    same prompt as ints (vLLM: ``list[int]`` in lax mode); one with a fraction is a 400 naming
    ``prompt``. Before: "prompt must be a string or a list of token ids"."""
    ids = [100, 200, 300]
    for prompt in ([float(t) for t in ids], [[float(t) for t in ids]], [100, 200.0, 300]):
        stream = _submitted(engine, client, "/v1/completions",
                            {"model": MODEL, "prompt": prompt, "max_tokens": 2})
        assert list(stream.token_ids) == ids
    response = client.post("/v1/completions", json={"model": MODEL, "prompt": [100, 200.5]})
    assert response.status_code == 400 and response.json()["error"]["param"] == "prompt"


@pytest.mark.parametrize("path, base", [COMPLETION, CHAT], ids=["completions", "chat"])
def test_an_empty_model_name_is_the_served_model(engine: FakeEngine, client: Any, path: str,
                                                  base: dict) -> None:
    """``"model": ""`` was a 404 ``model_not_found``; vLLM serves its default model for an
    empty name (``check_model``: ``if not model_name``), as for none. Served now, answered
    under the served name; another name stays a 404."""
    response = client.post(path, json={**base, "model": "", "max_tokens": 2})
    assert response.status_code == 200, response.text
    assert response.json()["model"] == MODEL
    other = client.post(path, json={**base, "model": "gpt-4o", "max_tokens": 2})
    assert other.status_code == 404 and other.json()["error"]["code"] == "model_not_found"


def _chunks(client: Any, options: dict) -> list[dict]:
    body = {**COMPLETION[1], "max_tokens": 3, "stream": True, "stream_options": options}
    with client.stream("POST", "/v1/completions", json=body) as response:
        assert response.status_code == 200
        lines = [line for line in response.iter_lines() if line.startswith("data: ")]
    assert lines[-1] == "data: [DONE]"
    return [json.loads(line[6:]) for line in lines[:-1]]


def test_empty_stream_options_send_no_usage_as_openai_documents(client: Any) -> None:
    """``stream_options: {}`` sends no usage chunk: OpenAI's reference gives ``include_usage``
    no default ("If set, an additional chunk will be streamed"), the rule kept; vLLM's
    ``StreamOptions`` defaults it to true. ``{"include_usage": true}`` adds the usage chunk
    (empty choices, the counts)."""
    assert all(chunk.get("usage") is None for chunk in _chunks(client, {}))
    with_usage = _chunks(client, {"include_usage": True})
    assert with_usage[-1]["choices"] == []
    assert with_usage[-1]["usage"]["completion_tokens"] == 3
