"""An in-process stand-in for the server's engine (``EngineProcess`` / ``EngineLoop``): the
frontend's whole request path (parsing, tokenizing, streaming, aborts) with no model and no
engine process, answering each request with a fixed text. It records what reached the engine
(``submitted``) and every ``finish`` (``finished``), so a test sees what the trace would hold.

``app_client(engine)``: a Starlette ``TestClient`` (an ``httpx.Client``: the official ``openai``
client takes it as its ``http_client``) over the app, its lifespan started.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

from engine.model.checkpoint import default_model_dir
from engine.model.tokenizer import load_tokenizer
from engine.sampling_params import SamplingParams
from engine.server.engine_loop import RequestStream

MODEL = "replayllm-tiny"
ANSWER = " the quick brown fox jumps over the lazy dog and runs far away"
_TOKENIZER: Any = None


def tiny_tokenizer() -> Any:
    """The tiny model's tokenizer (loaded once per test process)."""
    global _TOKENIZER
    if _TOKENIZER is None:
        _TOKENIZER = load_tokenizer(str(default_model_dir()))
    return _TOKENIZER


class FakeEngine:
    """Answers each submitted request with ``ANSWER``'s tokens (cut to ``max_tokens``), one
    token per event-loop turn, unless ``answer`` is False (then requests wait for ``finish``)."""

    def __init__(self, max_model_len: int = 256, answer: bool = True) -> None:
        self.tokenizer = tiny_tokenizer()
        self.max_model_len = max_model_len
        self.vocab_size = int(self.tokenizer.vocab_size)
        self.metrics: Any = None
        self.answer = answer
        self.healthy = True
        self.submitted: list[RequestStream] = []
        self.finished: list[tuple[RequestStream, str]] = []
        self.loop: asyncio.AbstractEventLoop | None = None
        self._start = time.perf_counter()

    def set_metrics(self, metrics: Any) -> None:
        self.metrics = metrics

    def start(self, loop: asyncio.AbstractEventLoop) -> None:
        self.loop = loop

    def shutdown(self, grace_s: float) -> dict[str, Any] | None:
        return None

    def now(self) -> float:
        return time.perf_counter() - self._start

    def admission_error(self, token_ids: list[int], params: SamplingParams) -> str | None:
        return None

    def submit(self, stream: RequestStream) -> None:
        stream.seq_id = len(self.submitted)
        self.submitted.append(stream)
        if self.answer and self.loop is not None:
            tokens = self.tokenizer.encode(ANSWER, add_special_tokens=False)
            tokens = tokens[: stream.params.max_tokens]
            for i, token in enumerate(tokens):
                reason = "length" if i == len(tokens) - 1 else None
                self.loop.call_soon(stream.queue.put_nowait, ([token], reason, None))

    def finish(self, stream: RequestStream, reason: str) -> None:
        self.finished.append((stream, reason))


def app_client(engine: FakeEngine) -> Any:
    """A ``TestClient`` over the app on ``engine`` (use it as a context manager)."""
    from starlette.testclient import TestClient

    from engine.server.app import create_app

    return TestClient(create_app(engine, MODEL), raise_server_exceptions=False)


def http_scope(path: str) -> dict[str, Any]:
    """An ASGI HTTP scope of a JSON POST to ``path``, for driving the app with raw ASGI calls.
    ASGI 2.3 (uvicorn's httptools protocol): Starlette's streaming response then watches for a
    disconnect beside the stream and cancels the stream when it comes."""
    return {"type": "http", "asgi": {"version": "3.0", "spec_version": "2.3"},
            "http_version": "1.1", "method": "POST", "scheme": "http", "path": path,
            "raw_path": path.encode(), "root_path": "", "query_string": b"",
            "headers": [(b"content-type", b"application/json"), (b"host", b"testserver")],
            "client": ("127.0.0.1", 5000), "server": ("testserver", 80)}


def tiny_engine(mode: str) -> Any:
    """A real engine on the tiny CPU model behind the server's interface, with fresh metrics:
    in its own process (``mode`` ``"process"``) or on a thread of this one (``"thread"``)."""
    from engine.server.engine_proc import EngineSpec
    from engine.server.metrics import ServerMetrics

    spec = EngineSpec(None, None, {"max_model_len": 4096, "calibration_repeats": -1})
    metrics = ServerMetrics("m")
    if mode == "process":
        from engine.server.engine_client import EngineProcess

        return EngineProcess(spec, metrics)
    from engine.server.engine_loop import EngineLoop

    return EngineLoop(spec.build(), metrics)
