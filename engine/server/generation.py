"""One request's answer in the frontend: tokens from the engine thread to text, stop strings,
latency metrics, and the OpenAI response objects (whole or as server-sent-event chunks)."""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

from engine.server.engine_loop import EngineStopped, RequestStream
from engine.server.fast_text import StreamDetokenizer, backend_decoder

# The engine's finish reasons as OpenAI's.
OPENAI_FINISH = {"eos": "stop", "stop": "stop", "length": "length", "aborted": "abort"}


class GenerationError(Exception):
    """The engine refused the request after it was queued (an engine that stopped before
    finishing it raises ``EngineStopped`` instead)."""


@dataclass
class Piece:
    """Text that became final, and the finish reason once the answer is complete."""

    text: str
    finish_reason: str | None = None


class Generation:
    """Turns a ``RequestStream``'s tokens into text pieces (``pieces``), finishing the request
    in the engine when a stop string appears and aborting it when the consumer goes away."""

    def __init__(self, engine: Any, stream: RequestStream, tokenizer: Any,
                 metrics: Any, arrived: float) -> None:
        self.engine, self.stream, self.metrics = engine, stream, metrics
        self.detok = StreamDetokenizer(tokenizer, stream.params.stop, skip_special_tokens=True,
                                       decoder=backend_decoder(tokenizer))
        self.arrived = arrived  # time.perf_counter() when the HTTP request came in
        self.num_completion_tokens = 0
        self.first_token_at: float | None = None
        self.done = False

    @property
    def num_prompt_tokens(self) -> int:
        return len(self.stream.token_ids)

    def usage(self) -> dict[str, int]:
        return {"prompt_tokens": self.num_prompt_tokens,
                "completion_tokens": self.num_completion_tokens,
                "total_tokens": self.num_prompt_tokens + self.num_completion_tokens}

    async def pieces(self) -> AsyncIterator[Piece]:
        """The answer's text as it becomes final; the last piece carries the finish reason.
        ``GenerationError``: the engine refused the request; ``EngineStopped``: the engine
        stopped (died, or the server's grace period ended) before finishing it."""
        try:
            while True:
                tokens, reason, error = await self.stream.queue.get()
                queue = self.stream.queue
                while not queue.empty() and reason is None and error is None:
                    # The stream fell behind the engine: what piled up goes out as one piece.
                    more, reason, error = queue.get_nowait()
                    tokens = tokens + more
                if error is not None:
                    self.done = True
                    if isinstance(error, EngineStopped):
                        raise error
                    raise GenerationError(error)
                text = self.detok.add(tokens)
                # The detokenizer takes tokens up to the one that completes a stop string and
                # no further: later ones (the engine's overlapped step, a backlog merged above)
                # are not part of the answer, nor of its usage (vLLM's and LLM.generate's).
                taken = len(self.detok.tokens) - self.num_completion_tokens
                if taken:
                    self._observe_tokens(taken)
                if self.detok.stopped:
                    self.done = True
                    if reason is None:
                        self.engine.finish(self.stream, "stop")
                    yield self._final(text + self.detok.finish(), "stop")
                    return
                if reason is not None:
                    self.done = True
                    yield self._final(text + self.detok.finish(), OPENAI_FINISH[reason])
                    return
                if text:
                    yield Piece(text)
        finally:
            self.close()  # the consumer left early (client disconnect, cancelled task)

    def close(self) -> None:
        """Abort the request if it is still running (idempotent): what the response calls
        when it ends, however it ends, so a request whose consumer is gone never runs on
        unrecorded, even one whose ``pieces`` was never started."""
        if not self.done:
            self.done = True
            self.engine.finish(self.stream, "aborted")
            if self.metrics is not None:
                self.metrics.finished("abort")

    def _observe_tokens(self, count: int) -> None:
        """TTFT, when the first token reaches the stream. The inter-token latency is the
        engine's to observe (``step_stats``: one per step, on its clock): here, a stream behind
        the engine reads several steps' tokens at once, and their times are not known."""
        if self.first_token_at is None:
            self.first_token_at = now = time.perf_counter()
            if self.metrics is not None:
                self.metrics.ttft.observe(now - self.arrived)
        self.num_completion_tokens += count

    def _final(self, text: str, reason: str) -> Piece:
        metrics = self.metrics
        if metrics is not None:
            now = time.perf_counter()
            metrics.e2e.observe(now - self.arrived)
            if self.first_token_at is not None and self.num_completion_tokens > 1:
                metrics.tpot.observe((now - self.first_token_at)
                                     / (self.num_completion_tokens - 1))
            metrics.finished(reason)
        return Piece(text, reason)


# --- OpenAI objects ---------------------------------------------------------------------------


def new_id(chat: bool) -> str:
    return ("chatcmpl-" if chat else "cmpl-") + uuid.uuid4().hex


def full_response(chat: bool, request_id: str, model: str, created: int, text: str,
                  finish_reason: str | None, usage: dict[str, int]) -> dict[str, Any]:
    """A non-streaming completion or chat completion."""
    if chat:
        choice = {"index": 0, "message": {"role": "assistant", "content": text},
                  "logprobs": None, "finish_reason": finish_reason}
        kind = "chat.completion"
    else:
        choice = {"index": 0, "text": text, "logprobs": None, "finish_reason": finish_reason}
        kind = "text_completion"
    return {"id": request_id, "object": kind, "created": created, "model": model,
            "choices": [choice], "usage": usage}


def chunk(chat: bool, request_id: str, model: str, created: int, text: str | None,
          finish_reason: str | None, include_usage: bool, first: bool = False,
          usage: dict[str, int] | None = None) -> str:
    """One server-sent event of a streamed answer; ``usage``: the usage so far, with
    ``include_usage`` (``continuous_usage_stats``; else null until the last event)."""
    if chat:
        delta: dict[str, Any] = {}
        if first:
            delta["role"] = "assistant"
        if text is not None:
            delta["content"] = text
        choice = {"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish_reason}
        kind = "chat.completion.chunk"
    else:
        choice = {"index": 0, "text": text or "", "logprobs": None,
                  "finish_reason": finish_reason}
        kind = "text_completion"
    body: dict[str, Any] = {"id": request_id, "object": kind, "created": created,
                            "model": model, "choices": [choice]}
    if include_usage:
        body["usage"] = usage
    return sse(body)


def usage_chunk(chat: bool, request_id: str, model: str, created: int,
                usage: dict[str, int]) -> str:
    """The last event when ``stream_options.include_usage`` is set: no choices, the usage."""
    kind = "chat.completion.chunk" if chat else "text_completion"
    return sse({"id": request_id, "object": kind, "created": created, "model": model,
                "choices": [], "usage": usage})


def sse(body: dict[str, Any]) -> str:
    return f"data: {json.dumps(body, ensure_ascii=False)}\n\n"


DONE = "data: [DONE]\n\n"


class ChunkWriter:
    """The server-sent events of one streamed answer's content (``piece``): exactly
    ``generation.chunk``'s text for a chunk with text and no finish reason."""

    def __init__(self, chat: bool, request_id: str, model: str, created: int,
                 include_usage: bool) -> None:
        marker = "\x00"
        sample = chunk(chat, request_id, model, created, marker, None,
                                         include_usage)
        quoted = json.dumps(marker)
        head, tail = sample.split(quoted)
        self.head, self.tail = head, tail

    def piece(self, text: str) -> str:
        return self.head + json.dumps(text, ensure_ascii=False) + self.tail

