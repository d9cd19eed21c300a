"""A misbehaving OpenAI-compatible server for loadgen's tests: an aiohttp app on a free loopback
port, in a thread of the test's process, whose completions answer is whatever the test's
handler does (``answer(request, body, n)``, ``n`` counting the completion requests from 0)."""

from __future__ import annotations

import asyncio
import json
import threading
from collections.abc import Awaitable, Callable, Iterable
from pathlib import Path
from typing import Any

from aiohttp import web

Handler = Callable[[web.Request, dict[str, Any], int], Awaitable[web.StreamResponse]]


class FakeServer:
    """``with FakeServer(handler) as server: ... server.url ...``; ``/v1/models`` lists "m"."""

    def __init__(self, handler: Handler, models: Handler | None = None) -> None:
        self.handler, self.models = handler, models
        self.count = 0
        self.bodies: list[dict[str, Any]] = []
        self._ready = threading.Event()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stop: asyncio.Event | None = None
        self.url = ""

    async def _completion(self, request: web.Request) -> web.StreamResponse:
        body = await request.json()
        n = self.count
        self.count += 1
        self.bodies.append(body)
        return await self.handler(request, body, n)

    async def _models(self, request: web.Request) -> web.StreamResponse:
        if self.models is not None:
            return await self.models(request, {}, 0)
        return web.json_response({"object": "list", "data": [{"id": "m", "object": "model"}]})

    async def _main(self) -> None:
        app = web.Application()
        app.router.add_post("/v1/completions", self._completion)
        app.router.add_post("/v1/chat/completions", self._completion)
        app.router.add_get("/v1/models", self._models)
        runner = web.AppRunner(app, handle_signals=False, shutdown_timeout=0.1)
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
        self.url = f"http://127.0.0.1:{port}"
        self._loop, self._stop = asyncio.get_running_loop(), asyncio.Event()
        self._ready.set()
        await self._stop.wait()
        await runner.cleanup()

    def __enter__(self) -> FakeServer:
        self._thread = threading.Thread(target=asyncio.run, args=(self._main(),), daemon=True)
        self._thread.start()
        assert self._ready.wait(10), "the fake server did not start"
        return self

    def __exit__(self, *exc: object) -> None:
        assert self._loop is not None and self._stop is not None
        self._loop.call_soon_threadsafe(self._stop.set)
        self._thread.join(5)


def chunk(text: str | None = None, finish: str | None = None,
          usage: dict[str, int] | None = None, choices: bool = True) -> bytes:
    """One ``data:`` line of a completions stream."""
    event: dict[str, Any] = {"id": "c", "object": "text_completion", "model": "m",
                             "choices": [{"index": 0, "text": text or "",
                                          "finish_reason": finish}] if choices else []}
    if usage is not None:
        event["usage"] = usage
    return b"data: " + json.dumps(event).encode() + b"\n\n"


def tokens(n: int, finish: str = "length", usage: bool = True) -> list[bytes]:
    """A well-formed stream of ``n`` one-token chunks, its finish, usage (vLLM's order)."""
    lines = [chunk(f" t{k}") for k in range(n)]
    lines.append(chunk(finish=finish))
    if usage:
        lines.append(chunk(usage={"prompt_tokens": 3, "completion_tokens": n,
                                  "total_tokens": n + 3}, choices=False))
    return [*lines, b"data: [DONE]\n\n"]


async def stream(request: web.Request, lines: Iterable[bytes], first_delay: float = 0.0,
                 gap: float = 0.0, content_type: str = "text/event-stream",
                 close_after: int | None = None) -> web.StreamResponse:
    """Send ``lines`` as a chunked 200 answer: the first after ``first_delay`` s, each later one
    ``gap`` s after the one before; ``close_after``: drop the connection after that many."""
    response = web.StreamResponse(headers={"Content-Type": content_type})
    try:
        if close_after == 0:  # before the headers
            assert request.transport is not None
            request.transport.close()
            return response
        await response.prepare(request)
        for k, line in enumerate(lines):
            if close_after is not None and k == close_after:
                assert request.transport is not None
                request.transport.close()
                return response
            await asyncio.sleep(first_delay if k == 0 else gap)
            await response.write(line)
        await response.write_eof()
    except ConnectionResetError:  # the client went away (a timeout, an interrupt)
        pass
    return response


def workload(path: Path, n: int, max_tokens: int = 4, arrival_gap: float = 0.0) -> Path:
    """``n`` text-prompt requests, ``arrival_gap`` s apart."""
    path.write_text("".join(json.dumps({"prompt": f"p{i}", "max_tokens": max_tokens,
                                        "arrival_s": arrival_gap * i}) + "\n"
                            for i in range(n)))
    return path
