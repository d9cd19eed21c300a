"""The OpenAI API over real HTTP on loopback, with the official ``openai`` client: answers equal
``LLM.generate``'s, streaming and not, completions and chat, sync and async; bad requests are
400s naming the field while good ones complete; a client that disconnects is recorded aborted
with its blocks freed; 64 concurrent streams all complete; every request is in the trace, which
verifies after SIGTERM."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

openai = pytest.importorskip("openai")
pytest.importorskip("fastapi")

from server_process import ServerProcess  # noqa: E402

from engine import LLM, SamplingParams  # noqa: E402
from engine.server.chat import chat_prompt_ids  # noqa: E402
from replay.verify import verify  # noqa: E402
from tracing import read_trace  # noqa: E402

MODEL = "replayllm-tiny"
PROMPTS = ["The quick brown fox", "Hello, my name is", "def fibonacci(n):"]
# (temperature, top_p, top_k, seed): greedy, and seeded draws with and without filtering.
SETTINGS = [(0.0, 1.0, 0, None), (1.0, 1.0, 0, 11), (0.8, 0.9, 40, 5)]
MAX_TOKENS = 8


class Sent:
    """Requests the tests sent that reach the engine (counted against the trace)."""

    def __init__(self) -> None:
        self.count = 0
        self.lock = threading.Lock()

    def add(self, n: int = 1) -> None:
        with self.lock:
            self.count += n


@pytest.fixture(scope="module")
def trace_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("serve") / "trace"


@pytest.fixture(scope="module")
def sent() -> Sent:
    return Sent()


@pytest.fixture(scope="module")
def server(trace_dir: Path) -> Iterator[ServerProcess]:
    proc = ServerProcess(trace_dir)
    yield proc
    proc.kill()


@pytest.fixture(scope="module")
def reference() -> Iterator[LLM]:
    llm = LLM(None, record_events=False, calibration_repeats=0)
    yield llm
    llm.close()


def _expected(llm: LLM, prompt: str | list[int], setting: tuple) -> tuple[str, int]:
    temperature, top_p, top_k, seed = setting
    params = SamplingParams(temperature=temperature, max_tokens=MAX_TOKENS, top_p=top_p,
                            top_k=top_k, seed=seed)
    out = llm.generate([prompt], params, use_tqdm=False)[0]
    return llm.tokenizer.decode(out["token_ids"], skip_special_tokens=True), len(out["token_ids"])


def _client(server: ServerProcess) -> openai.OpenAI:
    return openai.OpenAI(base_url=server.url + "/v1", api_key="none", max_retries=0)


def _extra(setting: tuple) -> dict:
    temperature, top_p, top_k, seed = setting
    return {"temperature": temperature, "top_p": top_p, "seed": seed,
            "extra_body": {"top_k": top_k}}


@pytest.mark.parametrize("setting", SETTINGS, ids=["greedy", "seeded", "top-p-top-k"])
def test_completions_equal_generate(server: ServerProcess, reference: LLM, sent: Sent,
                                    setting: tuple) -> None:
    """Non-streaming and streaming answers both equal LLM.generate's text for the prompt."""
    client = _client(server)
    for prompt in PROMPTS:
        text, num_tokens = _expected(reference, prompt, setting)
        whole = client.completions.create(model=MODEL, prompt=prompt, max_tokens=MAX_TOKENS,
                                          **_extra(setting))
        assert whole.choices[0].text == text
        assert whole.usage.completion_tokens == num_tokens
        chunks = list(client.completions.create(model=MODEL, prompt=prompt,
                                                max_tokens=MAX_TOKENS, stream=True,
                                                stream_options={"include_usage": True},
                                                **_extra(setting)))
        assert "".join(c.choices[0].text for c in chunks if c.choices) == text
        assert chunks[-1].usage.completion_tokens == num_tokens
        assert chunks[-1].usage.prompt_tokens == whole.usage.prompt_tokens
        sent.add(2)


def test_chat_sync_and_async_equal_generate(server: ServerProcess, reference: LLM,
                                            sent: Sent) -> None:
    """Chat prompts go through the ChatML template; the async client streams the same text."""
    messages = [{"role": "system", "content": "Be brief."},
                {"role": "user", "content": "What is a KV cache?"}]
    setting = SETTINGS[1]
    text, _ = _expected(reference, chat_prompt_ids(reference.tokenizer, messages), setting)
    whole = _client(server).chat.completions.create(model=MODEL, messages=messages,
                                                    max_tokens=MAX_TOKENS, **_extra(setting))
    assert whole.choices[0].message.content == text
    assert whole.choices[0].message.role == "assistant"

    async def stream() -> str:
        client = openai.AsyncOpenAI(base_url=server.url + "/v1", api_key="none", max_retries=0)
        pieces = []
        async for chunk in await client.chat.completions.create(
                model=MODEL, messages=messages, max_tokens=MAX_TOKENS, stream=True,
                **_extra(setting)):
            if chunk.choices and chunk.choices[0].delta.content:
                pieces.append(chunk.choices[0].delta.content)
        await client.close()
        return "".join(pieces)

    assert asyncio.run(stream()) == text
    sent.add(2)


def test_a_stop_string_ends_the_answer(server: ServerProcess, reference: LLM,
                                       sent: Sent) -> None:
    """The text before the stop string, and usage counting the tokens through the one that
    completed it, as LLM.generate's token_ids (not a token the overlapped engine made after
    it), streamed or not."""
    text, _ = _expected(reference, PROMPTS[0], SETTINGS[0])
    stop = text[3:5]
    params = SamplingParams(temperature=0, max_tokens=MAX_TOKENS, stop=[stop])
    num_tokens = len(reference.generate([PROMPTS[0]], params, use_tqdm=False)[0]["token_ids"])
    client = _client(server)
    for _ in range(3):
        out = client.completions.create(model=MODEL, prompt=PROMPTS[0], max_tokens=MAX_TOKENS,
                                        temperature=0, stop=[stop])
        assert out.choices[0].text == text[: text.find(stop)]
        assert out.choices[0].finish_reason == "stop"
        assert out.usage.completion_tokens == num_tokens
        chunks = list(client.completions.create(model=MODEL, prompt=PROMPTS[0],
                                                max_tokens=MAX_TOKENS, temperature=0,
                                                stop=stop, stream=True,
                                                stream_options={"include_usage": True}))
        assert "".join(c.choices[0].text for c in chunks if c.choices) == out.choices[0].text
        assert chunks[-1].usage.completion_tokens == num_tokens
        sent.add(2)


BAD_REQUESTS = [
    (b'{"prompt": "x", "max_tokens": ', None),  # malformed JSON
    (b'{"prompt": "\xff\xfe"}', None),  # not UTF-8
    (b'{"max_tokens": 3}', "prompt"),  # missing field
    (b'{"prompt": "x", "max_tokens": 0}', "max_tokens"),
    (b'{"prompt": "x", "n": 2}', "n"),
    (b'{"prompt": "x", "temperature": -0.5}', "temperature"),
    (b'{"prompt": "x", "logprobs": 3}', "logprobs"),
    (b'{"prompt": "x", "frobnicate": true}', "frobnicate"),
    (b'{"prompt": [1, 2, 99999999]}', "prompt"),
    (b'{"prompt": "' + b"word " * 5000 + b'"}', "prompt"),  # over max_model_len
]


def test_bad_requests_get_400s_while_good_ones_complete(server: ServerProcess,
                                                        sent: Sent) -> None:
    """Each bad body gets a 400 with an OpenAI error object naming the field, while streams
    running alongside complete."""
    results: list[int] = []

    def good() -> None:
        out = _client(server).completions.create(model=MODEL, prompt="good", max_tokens=24,
                                                 temperature=0, extra_body={"ignore_eos": True})
        results.append(out.usage.completion_tokens)

    workers = [threading.Thread(target=good) for _ in range(4)]
    for w in workers:
        w.start()
    for body, param in BAD_REQUESTS:
        response = httpx.post(server.url + "/v1/completions", content=body,
                              headers={"content-type": "application/json"}, timeout=30)
        assert response.status_code == 400, body[:60]
        error = response.json()["error"]
        assert error["type"] == "invalid_request_error"
        assert error["message"]
        if param is not None:
            assert error["param"] == param, error
    chat = httpx.post(server.url + "/v1/chat/completions", json={"messages": []}, timeout=30)
    assert chat.status_code == 400 and chat.json()["error"]["param"] == "messages"
    unknown = httpx.post(server.url + "/v1/completions", json={"model": "gpt-4", "prompt": "x"},
                         timeout=30)  # OpenAI's answer: 404 model_not_found
    assert unknown.status_code == 404 and unknown.json()["error"]["param"] == "model"
    for w in workers:
        w.join(60)
    assert results == [24] * 4
    sent.add(4)


def test_an_oversized_body_is_a_413_the_client_reads(server: ServerProcess,
                                                     sent: Sent) -> None:
    """Over real HTTP, a 12 MiB body (the tiny model's limit is the 8 MiB floor), sized or
    chunked, is a 413 the client receives (uvicorn discards the rest of the body, so neither a
    reset connection nor a buffered body); the openai client raises its status error; the
    server goes on serving."""
    body = b'{"prompt": "' + b"x" * (12 * 2**20) + b'"}'

    def chunks() -> Iterator[bytes]:
        for i in range(0, len(body), 2**20):
            yield body[i:i + 2**20]

    with httpx.Client(timeout=60) as client:
        for content in (body, chunks()):
            response = client.post(server.url + "/v1/completions", content=content,
                                   headers={"content-type": "application/json"})
            assert response.status_code == 413, response.text[:200]
            assert response.json()["error"]["code"] == "request_too_large"
    with pytest.raises(openai.APIStatusError) as refused:
        _client(server).completions.create(model=MODEL, prompt="x" * (12 * 2**20),
                                           max_tokens=2)
    assert refused.value.status_code == 413
    out = _client(server).completions.create(model=MODEL, prompt="after", max_tokens=2)
    assert out.usage.completion_tokens == 2
    sent.add()


def test_a_client_that_disconnects_is_aborted(server: ServerProcess, trace_dir: Path,
                                              sent: Sent) -> None:
    """Closing a stream after its first token aborts the request: the trace records it
    ``aborted`` (written at shutdown, checked in the last test), and the server keeps serving."""
    with httpx.stream("POST", server.url + "/v1/completions", timeout=30,
                      json={"prompt": "abandon", "max_tokens": 2000, "stream": True,
                            "ignore_eos": True, "temperature": 0}) as response:
        for line in response.iter_lines():
            if line.startswith("data: "):
                break
    sent.add()
    out = _client(server).completions.create(model=MODEL, prompt="after", max_tokens=2)
    assert out.usage.completion_tokens == 2
    sent.add()


def test_64_concurrent_streams_complete(server: ServerProcess, sent: Sent) -> None:
    async def one(client: openai.AsyncOpenAI, i: int) -> int:
        count = 0
        async for chunk in await client.completions.create(
                model=MODEL, prompt=f"request {i}", max_tokens=6, stream=True,
                stream_options={"include_usage": True}, extra_body={"ignore_eos": True}):
            if chunk.usage is not None:
                count = chunk.usage.completion_tokens
        return count

    async def many() -> list[int]:
        client = openai.AsyncOpenAI(base_url=server.url + "/v1", api_key="none", max_retries=0,
                                    timeout=120)
        counts = await asyncio.gather(*(one(client, i) for i in range(64)))
        await client.close()
        return list(counts)

    assert asyncio.run(many()) == [6] * 64
    sent.add(64)


def test_models_health_and_metrics(server: ServerProcess) -> None:
    models = _client(server).models.list()
    assert [m.id for m in models.data] == [MODEL]
    assert httpx.get(server.url + "/health").status_code == 200
    text = httpx.get(server.url + "/metrics").text
    for name in ("vllm:time_to_first_token_seconds_count", "vllm:inter_token_latency_seconds",
                 "vllm:e2e_request_latency_seconds_count", "vllm:num_requests_running",
                 "vllm:num_requests_waiting", "vllm:kv_cache_usage_perc",
                 "vllm:prefix_cache_queries_total", "vllm:prefix_cache_hits_total",
                 "vllm:num_preemptions_total", "vllm:request_success_total"):
        assert name in text, name
    ttft = next(line for line in text.splitlines()
                if line.startswith("vllm:time_to_first_token_seconds_count"))
    assert float(ttft.split()[-1]) > 60


def test_sigterm_closes_a_trace_with_every_request(server: ServerProcess, trace_dir: Path,
                                                   sent: Sent) -> None:
    """After SIGTERM the trace is complete, holds every request the tests sent, records the
    disconnected one as aborted with all its blocks freed, and verifies. The server exits
    normally (status 0, its summary line printed), as on SIGINT: SIGTERM used to kill it after
    the trace closed, before ``serve`` returned."""
    status = server.terminate()
    assert status == 0, server.output()
    assert f"stopped after {sent.count} requests" in server.output()
    trace = read_trace(trace_dir)
    assert trace.complete
    added = trace.table("request_added").to_pandas()
    assert len(added) == sent.count
    # Arrivals are stamped as requests are handed to the engine: nondecreasing in its order of
    # adds (what the what-if feeds a recording by), each before the engine added it.
    assert added.sort_values("seq_id").arrival_s.is_monotonic_increasing
    assert (added.added_s >= added.arrival_s).all()
    finished = trace.table("request_finished").to_pandas()
    assert sorted(finished.seq_id) == sorted(added.seq_id)
    aborted = finished[finished.reason == "aborted"].seq_id.tolist()
    assert len(aborted) == 1
    held = (trace.table("block_allocated").to_pandas().seq_id == aborted[0]).sum() + (
        trace.table("block_hit").to_pandas().seq_id == aborted[0]).sum()
    freed = (trace.table("block_freed").to_pandas().seq_id == aborted[0]).sum()
    assert held == freed > 0
    assert finished[finished.seq_id == aborted[0]].num_completion_tokens.iloc[0] < 2000
    assert verify(trace_dir).identical
