"""What users of the official ``openai`` client get, in process over the app with a stand-in
engine (``fake_engine``) whose tokens all arrive before the frontend reads them, as a backlog
of an engine that runs ahead of the frontend does (async scheduling: a step's token is made
before the frontend has finished the request at a stop string)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

openai = pytest.importorskip("openai")
pytest.importorskip("fastapi")

from fake_engine import ANSWER, MODEL, FakeEngine, app_client  # noqa: E402

from engine.detokenizer import IncrementalDetokenizer  # noqa: E402


@pytest.fixture(scope="module")
def api(engine: FakeEngine) -> Iterator[Any]:
    with app_client(engine) as client:
        yield openai.OpenAI(base_url="http://testserver/v1", api_key="none",
                            http_client=client, max_retries=0)


def _through_stop(engine: FakeEngine, stop: str) -> tuple[str, int]:
    """The answer's text before ``stop`` and its tokens up to and including the one that
    completed it, fed one at a time as ``LLM.generate`` does."""
    detok = IncrementalDetokenizer(engine.tokenizer, (stop,))
    for token in engine.tokenizer.encode(ANSWER, add_special_tokens=False):
        detok.add((token,))
        if detok.stopped:
            break
    assert detok.stopped
    detok.finish()
    return detok.text, len(detok.tokens)


@pytest.mark.parametrize("stop", ["brown", " over"])
def test_usage_counts_tokens_through_the_stop_string(engine: FakeEngine, api: Any,
                                                     stop: str) -> None:
    """A stop string's answer counts the tokens up to and including the one that completed
    it, streamed (``include_usage``) or not, completions and chat: the tokens the engine made
    after it (backlogged in the stream's queue) were counted too."""
    text, num_tokens = _through_stop(engine, stop)
    total = len(engine.tokenizer.encode(ANSWER, add_special_tokens=False))
    assert num_tokens < total
    whole = api.completions.create(model=MODEL, prompt="hi", max_tokens=64, stop=[stop])
    assert (whole.choices[0].text, whole.choices[0].finish_reason) == (text, "stop")
    assert whole.usage.completion_tokens == num_tokens
    assert whole.usage.total_tokens == whole.usage.prompt_tokens + num_tokens
    chunks = list(api.completions.create(model=MODEL, prompt="hi", max_tokens=64, stop=stop,
                                         stream=True, stream_options={"include_usage": True}))
    assert "".join(c.choices[0].text for c in chunks if c.choices) == text
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "stop"
    assert chunks[-1].usage.completion_tokens == num_tokens
    messages = [{"role": "user", "content": "hi"}]
    chat = api.chat.completions.create(model=MODEL, messages=messages, stop=[stop])
    assert chat.choices[0].message.content == text
    assert chat.usage.completion_tokens == num_tokens
    chunks = list(api.chat.completions.create(model=MODEL, messages=messages, stop=[stop],
                                              stream=True,
                                              stream_options={"include_usage": True}))
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == text
    assert chunks[-1].usage.completion_tokens == num_tokens


def test_continuous_usage_stats_puts_usage_in_every_chunk(engine: FakeEngine, api: Any) -> None:
    """``stream_options.continuous_usage_stats`` (vLLM's) was accepted and ignored: every
    chunk's usage was null. Now each chunk carries the usage so far, the tokens it counts
    never decreasing, ending at the final usage chunk's (vLLM's shape)."""
    options = {"include_usage": True, "continuous_usage_stats": True}
    for chat in (False, True):
        if chat:
            chunks = list(api.chat.completions.create(
                model=MODEL, messages=[{"role": "user", "content": "hi"}], max_tokens=5,
                stream=True, stream_options=options))
        else:
            chunks = list(api.completions.create(model=MODEL, prompt="hi", max_tokens=5,
                                                 stream=True, stream_options=options))
        assert all(c.usage is not None for c in chunks), chunks
        counts = [c.usage.completion_tokens for c in chunks]
        assert counts == sorted(counts) and counts[-1] == 5
        prompt = chunks[-1].usage.prompt_tokens
        assert all(c.usage.prompt_tokens == prompt for c in chunks)
        assert all(c.usage.total_tokens == prompt + c.usage.completion_tokens for c in chunks)
    plain = list(api.completions.create(model=MODEL, prompt="hi", max_tokens=5, stream=True,
                                        stream_options={"include_usage": True}))
    assert [c.usage is None for c in plain] == [True] * (len(plain) - 1) + [False]


@pytest.mark.parametrize("bad", [0, -1, "5", 2.5, True])
def test_max_tokens_beside_max_completion_tokens_is_checked(engine: FakeEngine, api: Any,
                                                            bad: Any) -> None:
    """With ``max_completion_tokens`` set, a wrong ``max_tokens`` beside it was ignored
    (``max_tokens: 0`` or ``"5"`` served); now a 400 naming it. A valid pair is served with
    ``max_completion_tokens`` (OpenAI's newer field) as the limit."""
    before = len(engine.submitted)
    messages = [{"role": "user", "content": "hi"}]
    with pytest.raises(openai.BadRequestError) as refused:
        api.chat.completions.create(model=MODEL, messages=messages, max_completion_tokens=3,
                                    max_tokens=bad)
    assert refused.value.body["param"] == "max_tokens"
    assert len(engine.submitted) == before
    out = api.chat.completions.create(model=MODEL, messages=messages, max_completion_tokens=3,
                                      max_tokens=7)
    assert out.usage.completion_tokens == 3


def test_max_tokens_past_the_context_names_its_field(engine: FakeEngine, api: Any) -> None:
    """A prompt that fits with a ``max_tokens`` that does not: the 400
    ``context_length_exceeded`` named the prompt (``prompt`` / ``messages``) as the culprit;
    now the field the client set (``max_tokens`` or ``max_completion_tokens``), with the most
    it may ask. A default that does not fit still names the prompt."""
    messages = [{"role": "user", "content": "hi"}]
    cases = [
        (lambda: api.completions.create(model=MODEL, prompt="hi", max_tokens=10**9),
         "max_tokens"),
        (lambda: api.chat.completions.create(model=MODEL, messages=messages,
                                             max_tokens=256), "max_tokens"),
        (lambda: api.chat.completions.create(model=MODEL, messages=messages,
                                             max_completion_tokens=2**40),
         "max_completion_tokens"),
        (lambda: api.completions.create(model=MODEL, prompt=list(range(1, 250))), "prompt"),
    ]
    for call, param in cases:
        with pytest.raises(openai.BadRequestError) as refused:
            call()
        error = refused.value.body
        assert (error["param"], error["code"]) == (param, "context_length_exceeded"), error
        assert "at most" in error["message"]


def test_text_parts_are_joined_as_vllm_joins_them(engine: FakeEngine, api: Any) -> None:
    """A message whose content is a list of text parts is the parts joined by newlines, the
    prompt vLLM builds for it (``chat_utils``: ``"\\n".join(texts)``); they were run together
    ("What is" + "a KV cache?" became "What isa KV cache?")."""
    from engine.server.chat import chat_prompt_ids

    parts = [{"type": "text", "text": "What is"}, {"type": "text", "text": "a KV cache?"}]
    api.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": parts}],
                                max_tokens=2)
    expected = chat_prompt_ids(engine.tokenizer,
                               [{"role": "user", "content": "What is\na KV cache?"}])
    assert engine.submitted[-1].token_ids == expected
