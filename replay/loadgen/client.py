"""One streamed request to an OpenAI-compatible ``/v1/completions``, timed on the client.

The HTTP client is aiohttp, as vLLM's and AIPerf's load generators use, on uvloop where it is
installed (``runner.run_loop``): under load a client's own work per request and per chunk is
part of the TTFT it reports (docs/BENCHMARKS.md section 9 measures it).

Any server, not only ``replayllm serve``: what it answers is checked, and whatever goes wrong
with one request (an error status, a dropped connection, a malformed chunk, a timeout) is that
request's ``error``, never an exception out of the run; an answer of 429, 502, 503 or 504,
or a request that never reached the server (``retry.never_reached``), is first retried
(``send``). Completion tokens are
the server's ``usage`` where it reports one, else (or where its count is below them) the output
chunks counted (``token_source`` says which).

A token's arrival (TTFT is the first, ITL the gaps between them) is a chunk of generated output
of any kind: text, a chat delta's ``content``, or a reasoning model's ``reasoning_content`` /
``reasoning``, also one whose text is "" where the server holds a token's text back
(``_held_back``); never a chat's role-only first chunk, a finish reason's chunk without text, nor
a usage chunk. e2e ends at the answer's end: its first finish reason, else its ``[DONE]``.
"""

from __future__ import annotations

import asyncio
import json
import math
import random
import re
import time
from dataclasses import dataclass, field
from typing import Any

import aiohttp

from replay.loadgen.retry import RETRY_STATUSES, SENT_WHOLE, never_reached, retry_delay
from replay.loadgen.sse import Event, EventStreamDecoder
from replay.workloads.request import Request

JSON_HEADERS = {"Content-Type": "application/json"}
# How much of a server's odd answer an error message quotes.
QUOTE_CHARS = 120
# Finish reasons of an answer the server gave up on: the request failed, however far it got.
FAILED_FINISH = frozenset({"abort", "error"})
TIMED_OUT = "timed out"  # how a timed-out request's error starts (``result.summarize`` counts)


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
    token_source: str = ""  # "usage" (the server's count), "chunks" (output chunks counted)
    done: bool = False  # answered or failed; False: never sent, or cut short by an interrupt
    retries: int = 0  # times it was sent again (``send``: after a 429, 502, 503, 504 ...)
    retry_wait_s: float = 0.0  # from the first send to the accepted attempt's (``send``)
    # When the answer ended: its first finish reason, else its [DONE] (e2e's end: an answer
    # with no output has one too).
    end_s: float = float("nan")
    # The model the server's answer named (its chunks' ``model``), else the one the request
    # named ("" for neither): a server may answer under another name than the one asked for.
    model: str = ""


class MalformedStream(ValueError):
    """A chunk of the event stream is not what the OpenAI API sends; names what it was."""


def request_body(request: Request, model: str | None) -> dict[str, Any]:
    """The completions body of a workload request (streaming, usage in the last chunk, its
    priority where it has one); a recipe prompt (``prompt_len``) is sent as its token ids."""
    body: dict[str, Any] = {
        "prompt": request.prompt_token_ids(),
        "max_tokens": request.max_tokens,
        "temperature": request.temperature,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    if model is not None:
        body["model"] = model
    if request.ignore_eos:
        body["ignore_eos"] = True  # vLLM's extension, which replayllm serve shares
    if request.priority:  # vLLM's too (lower first under policy=priority); 0 is the default
        body["priority"] = request.priority
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
               clock: Any, timeout: aiohttp.ClientTimeout | None = None,
               max_retries: int = 0, rng: random.Random | None = None) -> Measured:
    """POST ``body`` and read its event stream into ``out``; errors are recorded, not raised
    (``timeout``, else ``session``'s: ``total`` is the whole request's limit, ``sock_read``
    the longest silence, each a "timed out" error). The body is encoded before the clock
    starts: ``sent_s`` is when the request begins to go out. Only cancellation (an interrupted
    run) goes through, leaving ``out.done`` False.

    An answer of HTTP 429, 502, 503 or 504, or a request that never reached the server (no
    connection, or not written whole: ``retry.never_reached``) is sent again (never one whose
    connection was lost after it was written, before any answer: the server may be running it;
    nor one lost mid-stream, whose partial answer must not be asked for twice), up to
    ``max_retries`` times (counted in ``out.retries``), after the
    wait its ``Retry-After`` asks for, else a capped exponential backoff whose jitter ``rng``
    draws (``replay.loadgen.retry``); one still refused fails with its last error. TTFT and
    e2e count from ``sent_s``, the first attempt's send (not the accepted attempt's; not the
    scheduled arrival either, whose gap stays ``send_lag_s``), so they include the refused
    attempts and the waits: that is what a user of the server waited, and what a client that
    sends once (vLLM's benchmark) would have reported had the server queued the request
    instead of refusing it. A server's own trace sees only the accepted attempt:
    ``out.retry_wait_s`` (first send to the accepted attempt's send) is the part it does not,
    which ``whatif --compare`` subtracts (``replay.whatif.compare.client_view``). ``total``
    spans every attempt, the waits included: a wait that would end past it is not begun, and
    an attempt gets only what is left of it."""
    data = json.dumps(body).encode()
    if isinstance(body.get("model"), str):
        out.model = body["model"]  # until an answer names the model it came from
    limits = timeout or session.timeout
    out.sent_s = clock()
    deadline = out.sent_s + (limits.total or math.inf)
    attempt_timeout, note = timeout, ""
    try:
        while True:
            kwargs = {} if attempt_timeout is None else {"timeout": attempt_timeout}
            retryable, asked = await _attempt(session, url, data, kwargs, out, clock)
            if retryable is None:  # lost once sent: the server may be running it
                note = SENT_WHOLE if max_retries else ""
                break
            if not retryable or out.retries >= max_retries:
                break
            delay = retry_delay(asked, out.retries, rng=rng)
            if clock() + delay >= deadline:
                note = f"waiting {delay:.3g} s to retry would pass --request-timeout"
                break
            out.error = ""
            out.retries += 1
            await asyncio.sleep(delay)
            now = clock()
            out.retry_wait_s = now - out.sent_s
            # What is left of the request's limit, for this attempt.
            attempt_timeout = aiohttp.ClientTimeout(
                total=deadline - now if limits.total else None, connect=limits.connect,
                sock_read=limits.sock_read, sock_connect=limits.sock_connect)
    except aiohttp.ServerTimeoutError as exc:  # no byte for sock_read seconds (or no connect)
        if isinstance(exc, getattr(aiohttp, "ConnectionTimeoutError", ())):
            out.error = f"{TIMED_OUT}: connecting took over {limits.sock_connect:g} s"
        else:
            out.error = (f"{TIMED_OUT}: the server sent nothing for {limits.sock_read:g} s "
                         "(--stall-timeout)")
    except (TimeoutError, asyncio.TimeoutError):  # aiohttp's total: the whole request
        out.error = f"{TIMED_OUT}: no complete answer in {limits.total:g} s (--request-timeout)"
    except aiohttp.ClientPayloadError:
        out.error = "the server closed the connection mid-stream"
    except (aiohttp.ClientError, OSError) as exc:
        out.error = f"{type(exc).__name__}: {_one_line(str(exc))}"
    except ValueError as exc:  # MalformedStream, a line too long, bytes not UTF-8 ...
        out.error = _one_line(str(exc)) or type(exc).__name__
    except Exception as exc:  # noqa: BLE001 - one request's surprise must not end the run
        out.error = f"unexpected {type(exc).__name__}: {_one_line(str(exc))}"
    if out.error and (out.retries or note):
        why = [f"after {out.retries} {'retry' if out.retries == 1 else 'retries'}"
               ] if out.retries else []
        out.error += f" ({'; '.join([*why, note] if note else why)})"
    out.done = True
    return out


async def _attempt(session: aiohttp.ClientSession, url: str, data: bytes,
                   kwargs: dict[str, Any], out: Measured, clock: Any
                   ) -> tuple[bool | None, str | None]:
    """One POST, its answer read into ``out``: whether it may be sent again (a status of
    ``RETRY_STATUSES``, or a request that never reached the server: ``never_reached``; None for
    a connection lost after the request was written, before its status line), and the answer's
    ``Retry-After``. A timeout or a TLS error goes through."""
    try:
        response = await session.post(url, data=data, headers=JSON_HEADERS, **kwargs)
    except (aiohttp.ClientConnectionError, OSError) as exc:
        if isinstance(exc, (TimeoutError, asyncio.TimeoutError, aiohttp.ClientSSLError,
                            aiohttp.ServerFingerprintMismatch)):
            raise
        out.error = f"{type(exc).__name__}: {_one_line(str(exc))}"
        return (True if never_reached(exc) else None), None
    async with response:
        await _read_response(response, out, clock)
        return response.status in RETRY_STATUSES, response.headers.get("Retry-After")


async def _read_response(response: aiohttp.ClientResponse, out: Measured, clock: Any) -> None:
    """Read one answer into ``out``: an error status, a JSON document, or an event stream
    (``replay.loadgen.sse``: each event's data lines joined, however its lines end)."""
    content_type = response.headers.get("Content-Type", "").split(";")[0].strip().lower()
    if response.status != 200:
        text = (await response.read()).decode("utf-8", "replace")
        out.error = f"HTTP {response.status}: {_error_message(text)}"
        return
    if content_type == "application/json":  # not a stream: an error object, or stream ignored
        text = (await response.read()).decode("utf-8", "replace")
        message = _json_error(text)
        out.error = message or ("the server answered one JSON document, not an event stream "
                                "(does it support \"stream\": true?)")
        return
    decoder = EventStreamDecoder()
    seen = ended = False

    def take(events: list[Event]) -> bool:
        """Read ``events`` into ``out``; whether the answer is over ([DONE], or an error)."""
        nonlocal seen, ended
        for event in events:
            seen = True
            if event.type == "error":  # an error object's message, else its data quoted
                out.error = _error_event(event.data)
                return True
            if event.data.strip() == b"[DONE]":
                ended = True
                if math.isnan(out.end_s):
                    out.end_s = clock()
                return True
            _read_chunk(_parse(event.data), out, clock())
            if out.error:  # the server said it failed
                return True
        return False

    # Whatever each read brings, not lines: a line may end in CR alone (aiohttp's lines are
    # LF's), and a read of many events is decoded at once.
    async for piece in response.content.iter_any():
        if take(decoder.feed(piece)):
            break
    else:
        take(decoder.close())
    if out.token_source == "usage" and out.completion_tokens < len(out.chunk_times_s):
        # Each output chunk is at least one token: a usage below them is not the answer's (a
        # proxy's zeros in every chunk, as LiteLLM's, a count sent before the end).
        out.completion_tokens, out.token_source = len(out.chunk_times_s), "chunks"
    if out.error:
        return
    if not (ended or out.finish_reason):
        out.error = ("the stream ended before its finish reason or [DONE] (cut short)" if seen
                     else f"no event-stream data in the answer ({content_type or 'no type'})")


def _parse(event: bytes) -> dict[str, Any]:
    try:
        chunk = json.loads(event)
    except ValueError:
        raise MalformedStream(f"malformed event-stream data: {_quote(event)}") from None
    if not isinstance(chunk, dict):
        raise MalformedStream(f"event-stream data is not an object: {_quote(event)}")
    return chunk


def _error_event(data: bytes) -> str:
    """The error of an ``event: error``: its data's ``error`` object's message (as a chunk's),
    else a message quoting its data (``_json_error``'s where it is an error document)."""
    try:
        chunk = json.loads(data)
    except ValueError:
        chunk = None
    if isinstance(chunk, dict) and chunk.get("error"):
        return _error_of(chunk["error"])
    message = _json_error(data.decode("utf-8", "replace"))
    return f"the server sent an error event: {_quote(message or data) or '(no data)'}"


def _read_chunk(chunk: dict[str, Any], out: Measured, now: float) -> None:
    if chunk.get("error"):
        out.error = _error_of(chunk["error"])
        return
    if isinstance(chunk.get("model"), str) and chunk["model"]:
        out.model = chunk["model"]  # the server's name for the model that answered
    usage = chunk.get("usage")
    if usage is not None and not isinstance(usage, dict):
        raise MalformedStream(f"a chunk's usage is not an object: {_quote(chunk)}")
    if usage:
        if usage.get("completion_tokens") is not None:
            out.completion_tokens = _count(usage["completion_tokens"], chunk)
            out.token_source = "usage"
        if usage.get("prompt_tokens") is not None:
            out.prompt_tokens = _count(usage["prompt_tokens"], chunk)
    choices = chunk.get("choices")
    if choices is not None and not isinstance(choices, list):
        raise MalformedStream(f"a chunk's choices are not a list: {_quote(chunk)}")
    for choice in choices or []:
        if not isinstance(choice, dict):
            raise MalformedStream(f"a chunk's choice is not an object: {_quote(chunk)}")
        delta = choice.get("delta") or {}
        if not isinstance(delta, dict):
            raise MalformedStream(f"a chunk's delta is not an object: {_quote(chunk)}")
        text = choice.get("text") or delta.get("content")
        # A reasoning model's thinking is generated tokens too (not part of the answer's text).
        thought = delta.get("reasoning_content") or delta.get("reasoning")
        if not all(isinstance(t, str) for t in (text or "", thought or "")):
            raise MalformedStream(f"a chunk's text is not a string: {_quote(chunk)}")
        if text or thought or _held_back(choice, delta):
            if text and out.text is not None:
                out.text += text
            if out.first_token_s != out.first_token_s:  # NaN: the first one
                out.first_token_s = now
            out.last_token_s = now
            out.chunk_times_s.append(now)
            if out.token_source != "usage":  # no usage yet: a chunk per token (vLLM's rule)
                out.completion_tokens += 1
                out.token_source = "chunks"
        if choice.get("finish_reason"):
            if not out.finish_reason:
                out.end_s = now
            out.finish_reason = str(choice["finish_reason"])
            if out.finish_reason in FAILED_FINISH:  # the server gave up on it (vLLM, SGLang)
                out.error = f"the server ended the answer with finish_reason {out.finish_reason!r}"


def _held_back(choice: dict[str, Any], delta: dict[str, Any]) -> bool:
    """Whether a choice without text is a generated token whose text the server holds back
    (vLLM and replayllm serve send a chunk for each step that made tokens, its text ""
    for one that ends mid-character or decodes to nothing): an empty ``text`` or ``content``
    string in a chunk that is not a chat's role chunk nor a finish reason's (either may come
    with "" and no token: a framing chunk, not output)."""
    if choice.get("finish_reason") or delta.get("role"):
        return False
    return any(isinstance(value, str) for value in (
        choice.get("text"), delta.get("content"), delta.get("reasoning_content"),
        delta.get("reasoning")))


def _error_of(error: Any) -> str:
    """The message of a chunk's ``error`` (an object's ``message``, else the error itself)."""
    return _one_line(str(error.get("message", error) if isinstance(error, dict)
                         else error)) or "the server sent an error"


def _count(value: Any, chunk: dict[str, Any]) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, float, str)):
        raise MalformedStream(f"a usage count is not a number: {_quote(chunk)}")
    try:
        count = int(value)
    except ValueError:
        raise MalformedStream(f"a usage count is not a number: {_quote(chunk)}") from None
    if count < 0:
        raise MalformedStream(f"a usage count is negative: {_quote(chunk)}")
    return count


def _json_error(text: str) -> str:
    """The message of an error document (OpenAI's ``{"error": {"message"}}``, ``{"error":
    "..."}``, FastAPI's ``{"detail": ...}``, ``{"message": ...}``), "" for any other text."""
    try:
        doc = json.loads(text)
    except ValueError:
        return ""
    if not isinstance(doc, dict):
        return ""
    error = doc.get("error")
    if isinstance(error, dict):
        error = error.get("message", error)
    for found in (error, doc.get("detail"), doc.get("message")):
        if found:
            return _one_line(found if isinstance(found, str) else json.dumps(found))
    return ""


def _error_message(text: str) -> str:
    return _json_error(text) or _one_line(text)[:200]


def _one_line(text: str) -> str:
    return re.sub(r"\s+", " ", text).strip()


def _quote(value: Any) -> str:
    text = value.decode("utf-8", "replace") if isinstance(value, bytes) else (
        json.dumps(value) if isinstance(value, dict) else str(value))
    text = _one_line(text)
    return text if len(text) <= QUOTE_CHARS else text[:QUOTE_CHARS] + "..."


def monotonic_clock(start: float) -> Any:
    """Seconds since ``start`` on ``time.perf_counter``."""
    return lambda: time.perf_counter() - start
