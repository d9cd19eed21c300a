"""What the server takes in at most, so that no client can make it hold unbounded memory or
stall its event loop with what it sends.

- A request body is at most ``max_request_bytes`` (``replayllm serve --max-request-bytes``):
  a larger one is an OpenAI-style 413 before the rest of it is read. A ``Content-Length`` over
  the limit is refused before any of the body is read (a client that sent ``Expect:
  100-continue`` never sends it); a chunked body, or one that runs past what its header said,
  is counted as it arrives and refused once over. uvicorn reads and discards the rest of the
  body (the connection stays usable), so the client gets the 413. JSON parsing then never holds
  the interpreter for more than that many bytes' worth.
- The default is what a prompt filling the context could take with a wide margin:
  ``BODY_BYTES_PER_TOKEN`` bytes per token of ``max_model_len`` (byte-level BPE: no Qwen token
  stands for more than 128 bytes; real text is about 4, JSON-escaped CJK about 10, a token id
  at most 8), and never less than ``MIN_MAX_REQUEST_BYTES`` (conversations, chat templates,
  small test contexts). vLLM's Python server has no limit; its Rust frontend a fixed 32 MiB.
- A body over ``OFFLOOP_BODY_BYTES`` is parsed and checked in a thread of its own
  (``BodyParser``), interruptibly (``parse_json_body``): on the loop, 8 MiB of token ids held it
  ~270 ms (JSON ~90, the field checks ~180), of small objects ~95 ms, of floats ~700 ms; in the
  thread the loop's longest gap was ~15-35 ms. A body that is one long string parses in one C
  call that no thread can interrupt: ~10 ms for 8 MiB of ASCII, ~25-45 ms escaped CJK.
- The prompt pool's bound (``--max-waiting-prompts``): ``engine.server.prompt``.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any, TypeVar

from starlette.requests import ClientDisconnect

from engine.server.prompt import ClientLeft
from engine.server.protocol import ApiError, parse_json_body

T = TypeVar("T")

BODY_BYTES_PER_TOKEN = 128
MIN_MAX_REQUEST_BYTES = 8 * 2**20
# Bodies up to this size are parsed on the event loop: at most ~5 ms (all floats), ~1 ms
# for prompts of text or ids, less than a hop to a thread may cost on a busy loop.
OFFLOOP_BODY_BYTES = 64 * 2**10


def default_max_request_bytes(max_model_len: int) -> int:
    """The body limit a server of this context gets unless told otherwise."""
    return max(MIN_MAX_REQUEST_BYTES, BODY_BYTES_PER_TOKEN * max_model_len)


async def read_body(request: Any, limit: int) -> bytes:
    """The body of a Starlette ``request``, at most ``limit`` bytes; a 413 ``ApiError`` as soon
    as it is known to be larger (from its ``Content-Length``, else as it arrives);
    ``ClientLeft`` when the client disconnects before the body is whole (an ordinary client
    event, not the server's error)."""
    declared = request.headers.get("content-length")
    if declared is not None and declared.strip().isdigit() and int(declared) > limit:
        raise _too_large(f"is {int(declared)} bytes", limit)
    chunks, size = [], 0
    try:
        async for chunk in request.stream():
            size += len(chunk)
            if size > limit:
                raise _too_large(f"runs past {limit} bytes", limit)
            chunks.append(chunk)
    except ClientDisconnect:
        raise ClientLeft from None
    return b"".join(chunks)


def _too_large(what: str, limit: int) -> ApiError:
    return ApiError(f"the request body {what}, more than this server takes ({limit} bytes; "
                    "replayllm serve --max-request-bytes)", status=413,
                    code="request_too_large")


class BodyParser:
    """Parses a request body and checks its fields (``check``, e.g. ``parse_completion``): on
    the loop up to ``OFFLOOP_BODY_BYTES``, else in one thread (more would only share the
    interpreter), interruptibly, so the loop's streams go on. ``close()`` stops the thread."""

    def __init__(self) -> None:
        self._pool = ThreadPoolExecutor(1, thread_name_prefix="replayllm-body")

    async def parse(self, raw: bytes, check: Callable[[dict[str, Any]], T]) -> T:
        if len(raw) <= OFFLOOP_BODY_BYTES:
            return check(parse_json_body(raw))
        return await asyncio.get_running_loop().run_in_executor(
            self._pool, lambda: check(parse_json_body(raw, interruptible=True)))

    def close(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)
