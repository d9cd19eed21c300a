"""One streamed request to an OpenAI-compatible ``/v1/completions``, timed on the client.

The HTTP client is aiohttp, as vLLM's and AIPerf's load generators use, on uvloop where it is
installed (``runner.run_loop``): under load a client's own work per request and per chunk is
part of the TTFT it reports (docs/BENCHMARKS.md section 9 measures it).
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field
from typing import Any

import aiohttp

from replay.workloads.request import Request

JSON_HEADERS = {"Content-Type": "application/json"}


@dataclass
class Measured:
    """What the client saw of one request (times in seconds since the load run started)."""

    index: int
    prompt_len: int  # as the workload has it (0 for a text prompt: the server's count is used)
    max_tokens: int
    arrival_s: float  # when it was due
    sent_s: float = float("nan")
    first_token_s: float = float("nan")
    last_token_s: float = float("nan")
    completion_tokens: int = 0
    prompt_tokens: int = 0
    chunk_times_s: list[float] = field(default_factory=list)
    finish_reason: str = ""
    error: str = ""
    text: str | None = None  # the answer's text, when kept (a conversation's next turn needs it)


def request_body(request: Request, model: str | None) -> dict[str, Any]:
    """The completions body of a workload request (streaming, usage in the last chunk)."""
    body: dict[str, Any] = {
        "prompt": request.prompt,
        "max_tokens": request.max_tokens,
        "temperature": request.temperature,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    if model is not None:
        body["model"] = model
    if request.ignore_eos:
        body["ignore_eos"] = True  # vLLM's extension, which replayllm serve shares
    return body


def chat_body(messages: list[dict[str, str]], request: Request,
              model: str | None) -> dict[str, Any]:
    """The chat-completions body of a conversation's turn (``messages``: its history and the
    new user turn); sampling settings as ``request_body``."""
    body = request_body(request, model)
    del body["prompt"]
    body["messages"] = messages
    return body


async def send(session: aiohttp.ClientSession, url: str, body: dict[str, Any], out: Measured,
               clock: Any) -> Measured:
    """POST ``body`` and read its event stream into ``out``; errors are recorded, not raised
    (a read timeout of ``session``: the stream stalled). The body is encoded before the clock
    starts: ``sent_s`` is when the request begins to go out."""
    data = json.dumps(body).encode()
    out.sent_s = clock()
    try:
        async with session.post(url, data=data, headers=JSON_HEADERS) as response:
            if response.status != 200:
                text = (await response.read()).decode("utf-8", "replace")
                out.error = f"HTTP {response.status}: {_error_message(text)}"
                return out
            async for line in response.content:  # one line at a time
                if not line.startswith(b"data: "):
                    continue
                event = line[len(b"data: "):].strip()
                if event == b"[DONE]":
                    break
                _read_chunk(json.loads(event), out, clock())
    except (aiohttp.ClientError, TimeoutError, json.JSONDecodeError, ValueError) as exc:
        out.error = f"{type(exc).__name__}: {exc}"
    if not out.error and not out.finish_reason:
        out.error = "the stream ended without a finish reason"
    return out


def _read_chunk(chunk: dict[str, Any], out: Measured, now: float) -> None:
    if "error" in chunk:
        out.error = str(chunk["error"].get("message", chunk["error"]))
        return
    usage = chunk.get("usage")
    if usage:
        out.completion_tokens = int(usage.get("completion_tokens", out.completion_tokens))
        out.prompt_tokens = int(usage.get("prompt_tokens", 0))
    for choice in chunk.get("choices") or []:
        text = choice.get("text") or (choice.get("delta") or {}).get("content")
        if text:
            if out.text is not None:
                out.text += text
            if out.first_token_s != out.first_token_s:  # NaN: the first one
                out.first_token_s = now
            out.last_token_s = now
            out.chunk_times_s.append(now)
            if not usage:
                out.completion_tokens += 1  # without usage: a chunk per token (vLLM's rule)
        if choice.get("finish_reason"):
            out.finish_reason = str(choice["finish_reason"])


def _error_message(text: str) -> str:
    try:
        return str(json.loads(text)["error"]["message"])
    except (ValueError, KeyError, TypeError):
        return text.strip()[:200]


def monotonic_clock(start: float) -> Any:
    """Seconds since ``start`` on ``time.perf_counter``."""
    return lambda: time.perf_counter() - start
