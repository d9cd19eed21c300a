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
- The prompt pool's bound (``--max-waiting-prompts``): ``engine.server.prompt``.
"""

from __future__ import annotations

from typing import Any

from engine.server.protocol import ApiError

BODY_BYTES_PER_TOKEN = 128
MIN_MAX_REQUEST_BYTES = 8 * 2**20


def default_max_request_bytes(max_model_len: int) -> int:
    """The body limit a server of this context gets unless told otherwise."""
    return max(MIN_MAX_REQUEST_BYTES, BODY_BYTES_PER_TOKEN * max_model_len)


async def read_body(request: Any, limit: int) -> bytes:
    """The body of a Starlette ``request``, at most ``limit`` bytes; a 413 ``ApiError`` as soon
    as it is known to be larger (from its ``Content-Length``, else as it arrives)."""
    declared = request.headers.get("content-length")
    if declared is not None and declared.strip().isdigit() and int(declared) > limit:
        raise _too_large(f"is {int(declared)} bytes", limit)
    chunks, size = [], 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > limit:
            raise _too_large(f"runs past {limit} bytes", limit)
        chunks.append(chunk)
    return b"".join(chunks)


def _too_large(what: str, limit: int) -> ApiError:
    return ApiError(f"the request body {what}, more than this server takes ({limit} bytes; "
                    "replayllm serve --max-request-bytes)", status=413,
                    code="request_too_large")
