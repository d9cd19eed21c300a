"""Requests real clients send that the server refused though they ask for nothing it lacks, or
refused without saying why (bug hunt s38), in process over the app with the stand-in engine
(``fake_engine``): what reaches the engine and the error a client reads."""

from __future__ import annotations

import json
from typing import Any

import pytest

pytest.importorskip("fastapi")

from fake_engine import MODEL, FakeEngine  # noqa: E402

USER = [{"role": "user", "content": "hi"}]


@pytest.mark.parametrize("path, body", [
    ("/v1/completions", {"model": MODEL, "prompt": "hi", "max_tokens": 2}),
    ("/v1/chat/completions", {"model": MODEL, "messages": USER, "max_tokens": 2}),
])
def test_a_body_with_a_utf8_byte_order_mark_is_served(engine: FakeEngine, client: Any,
                                                      path: str, body: dict) -> None:
    """A JSON body that starts with a UTF-8 byte order mark (Windows PowerShell's ``utf8``
    files, .NET's default ``UTF8Encoding``) was a 400 ("Unexpected UTF-8 BOM"); RFC 8259 lets
    a parser ignore it and vLLM's (Starlette's ``json.loads`` of the bytes) does. Served now,
    the same request as without it; a BOM anywhere else is still not JSON."""
    before = len(engine.submitted)
    raw = json.dumps(body).encode()
    response = client.post(path, content=b"\xef\xbb\xbf" + raw,
                           headers={"content-type": "application/json"})
    assert response.status_code == 200, response.text
    assert len(engine.submitted) == before + 1
    plain = client.post(path, content=raw, headers={"content-type": "application/json"})
    assert engine.submitted[-1].token_ids == engine.submitted[-2].token_ids
    assert plain.json()["usage"] == response.json()["usage"]
    inside = client.post(path, content=raw[:1] + b"\xef\xbb\xbf" + raw[1:])
    assert inside.status_code == 400 and "not valid JSON" in inside.json()["error"]["message"]


@pytest.mark.parametrize("extra", [{"top_logprobs": 0}, {"top_logprobs": 0, "logprobs": False},
                                   {"top_logprobs": None, "logprobs": None}])
def test_top_logprobs_zero_without_logprobs_is_served(engine: FakeEngine, client: Any,
                                                      extra: dict) -> None:
    """``top_logprobs: 0`` with ``logprobs`` off asks for no log probabilities (vLLM serves it;
    it refuses ``top_logprobs`` > 0 only without ``logprobs: true``); it was a 400
    "top_logprobs is not supported". Asking for any (``top_logprobs`` > 0, or ``logprobs:
    true``) is still a 400 naming the field; a wrongly typed one too."""
    before = len(engine.submitted)
    response = client.post("/v1/chat/completions",
                           json={"model": MODEL, "messages": USER, "max_tokens": 2, **extra})
    assert response.status_code == 200, response.text
    assert response.json()["choices"][0]["logprobs"] is None
    assert len(engine.submitted) == before + 1
    for bad, param in [({"top_logprobs": 2}, "top_logprobs"),
                       ({"top_logprobs": 0, "logprobs": True}, "logprobs"),
                       ({"top_logprobs": -1}, "top_logprobs"),
                       ({"top_logprobs": "0"}, "top_logprobs"),
                       ({"top_logprobs": False}, "top_logprobs")]:
        refused = client.post("/v1/chat/completions",
                              json={"model": MODEL, "messages": USER, **bad})
        assert refused.status_code == 400, (bad, refused.text)
        assert refused.json()["error"]["param"] == param, (bad, refused.text)
    assert len(engine.submitted) == before + 1


@pytest.mark.parametrize("content, content_type", [
    (b"prompt=hi&max_tokens=2", "application/x-www-form-urlencoded"),
    (b"--b\r\nContent-Disposition: form-data; name=\"prompt\"\r\n\r\nhi\r\n--b--\r\n",
     "multipart/form-data; boundary=b"),
    (b"hi", "text/plain"),
])
def test_a_form_body_says_the_content_type_is_wrong(engine: FakeEngine, client: Any,
                                                    content: bytes, content_type: str) -> None:
    """A form or text body (``curl -F``, ``requests.post(data=...)``) was a 400 "the request
    body is not valid JSON: Expecting value at line 1 column 1", which does not say what the
    client got wrong; the 400 now names the Content-Type it sent and the one to send (vLLM:
    "Only 'application/json' is allowed"). A JSON body is still served under any declared
    type (``curl -d`` sends it as a form), and a malformed body declared JSON gets no such
    hint."""
    before = len(engine.submitted)
    response = client.post("/v1/completions", content=content,
                           headers={"content-type": content_type})
    assert response.status_code == 400, response.text
    message = response.json()["error"]["message"]
    assert "not valid JSON" in message and content_type.split(";")[0] in message, message
    assert "application/json" in message, message
    assert len(engine.submitted) == before
    served = client.post("/v1/completions", content=json.dumps(
        {"model": MODEL, "prompt": "hi", "max_tokens": 2}), headers={"content-type": content_type})
    assert served.status_code == 200, served.text
    declared = client.post("/v1/completions", content=content,
                           headers={"content-type": "application/json"})
    assert declared.status_code == 400
    assert "Content-Type" not in declared.json()["error"]["message"]
    field = client.post("/v1/completions", content=json.dumps({"prompt": "hi", "n": 2}),
                        headers={"content-type": content_type})
    assert field.json()["error"]["message"].startswith("n must be 1"), field.text
