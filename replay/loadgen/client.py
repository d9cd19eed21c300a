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
How an answer's chunks are read (a token's arrival, e2e's end): ``answer``.
"""

from __future__ import annotations

import asyncio
import json
import math
import random
import time
from typing import Any

import aiohttp

from replay.loadgen.answer import (
    TIMED_OUT,
    Measured,
    error_event,
    error_message,
    json_error,
    one_line,
    parse_event,
    read_chunk,
)
from replay.loadgen.retry import RETRY_STATUSES, SENT_WHOLE, never_reached, retry_delay
from replay.loadgen.settings import read_at_most
from replay.loadgen.sse import Event, EventStreamDecoder
from replay.workloads.request import Request

JSON_HEADERS = {"Content-Type": "application/json"}
# An error answer, or a JSON one where a stream was asked for, is read up to this much: only
# its message is kept, and a broken server (a proxy's endless page) could send gigabytes.
MAX_BODY_BYTES = 64 * 1024


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
        out.error = f"{type(exc).__name__}: {one_line(str(exc))}"
    except ValueError as exc:  # MalformedStream, a line too long, bytes not UTF-8 ...
        out.error = one_line(str(exc)) or type(exc).__name__
    except Exception as exc:  # noqa: BLE001 - one request's surprise must not end the run
        out.error = f"unexpected {type(exc).__name__}: {one_line(str(exc))}"
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
        out.error = f"{type(exc).__name__}: {one_line(str(exc))}"
        return (True if never_reached(exc) else None), None
    async with response:
        await _read_response(response, out, clock)
        return response.status in RETRY_STATUSES, response.headers.get("Retry-After")


async def _read_response(response: aiohttp.ClientResponse, out: Measured, clock: Any) -> None:
    """Read one answer into ``out``: an error status, a JSON document, or an event stream
    (``replay.loadgen.sse``: each event's data lines joined, however its lines end)."""
    content_type = response.headers.get("Content-Type", "").split(";")[0].strip().lower()
    if response.status != 200:
        body, cut = await read_at_most(response, MAX_BODY_BYTES)
        text = body.decode("utf-8", "replace")
        out.error = f"HTTP {response.status}: {error_message(text)}{_cut_note(cut)}"
        return
    if content_type == "application/json":  # not a stream: an error object, or stream ignored
        body, cut = await read_at_most(response, MAX_BODY_BYTES)
        message = json_error(body.decode("utf-8", "replace"))
        out.error = (message or "the server answered one JSON document, not an event stream "
                     "(does it support \"stream\": true?)") + _cut_note(cut)
        return
    decoder = EventStreamDecoder()
    seen = ended = False

    def take(events: list[Event]) -> bool:
        """Read ``events`` into ``out``; whether the answer is over ([DONE], or an error)."""
        nonlocal seen, ended
        for event in events:
            seen = True
            if event.type == "error":  # an error object's message, else its data quoted
                out.error = error_event(event.data)
                return True
            if event.data.strip() == b"[DONE]":
                ended = True
                if math.isnan(out.end_s):
                    out.end_s = clock()
                return True
            read_chunk(parse_event(event.data), out, clock())
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


def _cut_note(cut: bool) -> str:
    return f" (the answer's body was cut at {MAX_BODY_BYTES // 1024} KiB, unread)" if cut else ""


def monotonic_clock(start: float) -> Any:
    """Seconds since ``start`` on ``time.perf_counter``."""
    return lambda: time.perf_counter() - start
