"""What a client reads of one answer: the ``Measured`` record of a request and the reading of
an OpenAI-compatible event stream's chunks into it (``read_chunk``), with the error messages
quoted from a server's odd answers. ``client`` sends and times; this module owns the record.

A token's arrival (TTFT is the first, ITL the gaps between them) is a chunk of generated output
of any kind: text, a chat delta's ``content``, or a reasoning model's ``reasoning_content`` /
``reasoning``, also one whose text is "" where the server holds a token's text back
(``_held_back``); never a chat's role-only first chunk, a finish reason's chunk without text, nor
a usage chunk. e2e ends at the answer's end: its first finish reason, else its ``[DONE]``.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from typing import Any

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


def parse_event(event: bytes) -> dict[str, Any]:
    try:
        chunk = json.loads(event)
    except ValueError:
        raise MalformedStream(f"malformed event-stream data: {quote(event)}") from None
    if not isinstance(chunk, dict):
        raise MalformedStream(f"event-stream data is not an object: {quote(event)}")
    return chunk


def error_event(data: bytes) -> str:
    """The error of an ``event: error``: its data's ``error`` object's message (as a chunk's),
    else a message quoting its data (``json_error``'s where it is an error document)."""
    try:
        chunk = json.loads(data)
    except ValueError:
        chunk = None
    if isinstance(chunk, dict) and chunk.get("error"):
        return _error_of(chunk["error"])
    message = json_error(data.decode("utf-8", "replace"))
    return f"the server sent an error event: {quote(message or data) or '(no data)'}"


def read_chunk(chunk: dict[str, Any], out: Measured, now: float) -> None:
    if chunk.get("error"):
        out.error = _error_of(chunk["error"])
        return
    if isinstance(chunk.get("model"), str) and chunk["model"]:
        out.model = chunk["model"]  # the server's name for the model that answered
    usage = chunk.get("usage")
    if usage is not None and not isinstance(usage, dict):
        raise MalformedStream(f"a chunk's usage is not an object: {quote(chunk)}")
    if usage:
        if usage.get("completion_tokens") is not None:
            out.completion_tokens = _count(usage["completion_tokens"], chunk)
            out.token_source = "usage"
        if usage.get("prompt_tokens") is not None:
            out.prompt_tokens = _count(usage["prompt_tokens"], chunk)
    choices = chunk.get("choices")
    if choices is not None and not isinstance(choices, list):
        raise MalformedStream(f"a chunk's choices are not a list: {quote(chunk)}")
    for choice in choices or []:
        if not isinstance(choice, dict):
            raise MalformedStream(f"a chunk's choice is not an object: {quote(chunk)}")
        delta = choice.get("delta") or {}
        if not isinstance(delta, dict):
            raise MalformedStream(f"a chunk's delta is not an object: {quote(chunk)}")
        text = choice.get("text") or delta.get("content")
        # A reasoning model's thinking is generated tokens too (not part of the answer's text).
        thought = delta.get("reasoning_content") or delta.get("reasoning")
        if not all(isinstance(t, str) for t in (text or "", thought or "")):
            raise MalformedStream(f"a chunk's text is not a string: {quote(chunk)}")
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
    return one_line(str(error.get("message", error) if isinstance(error, dict)
                         else error)) or "the server sent an error"


def _count(value: Any, chunk: dict[str, Any]) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, float, str)):
        raise MalformedStream(f"a usage count is not a number: {quote(chunk)}")
    try:
        count = int(value)
    except ValueError:
        raise MalformedStream(f"a usage count is not a number: {quote(chunk)}") from None
    if count < 0:
        raise MalformedStream(f"a usage count is negative: {quote(chunk)}")
    return count


def json_error(text: str) -> str:
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
            return one_line(found if isinstance(found, str) else json.dumps(found))
    return ""


def error_message(text: str) -> str:
    return json_error(text) or one_line(text)[:200]


def one_line(text: str) -> str:
    return re.sub(r"\s+", " ", text).strip()


def quote(value: Any) -> str:
    text = value.decode("utf-8", "replace") if isinstance(value, bytes) else (
        json.dumps(value) if isinstance(value, dict) else str(value))
    text = one_line(text)
    return text if len(text) <= QUOTE_CHARS else text[:QUOTE_CHARS] + "..."
