"""A load run's settings, checked before anything is sent, and the server it goes to: its
base URL, and whether it can be reached at all (``served_model``)."""

from __future__ import annotations

import asyncio
import json
import math
import os
from dataclasses import dataclass, field
from typing import Any

import aiohttp

from engine.errors import ReplayLLMError

# A request not answered whole in this long is timed out (a long answer at a slow rate fits).
DEFAULT_REQUEST_TIMEOUT_S = 3600.0
# A stream that sends nothing (not even its headers) for this long is an error, not a hang.
DEFAULT_STALL_TIMEOUT_S = 600.0
# How often a refused request (429, 502, 503, 504; no answer) is sent again before it fails.
DEFAULT_MAX_RETRIES = 3
# Finding the server (``/v1/models``) before the run: a server that does not answer this is down.
PROBE_TIMEOUT_S = 30.0
# How many of a server's model names the error for a model it does not list shows.
MODELS_SHOWN = 5
# ``/v1/models`` is read up to this much: a list of thousands of models fits (a router's, each
# with its description), a broken server's endless answer does not fill the memory.
MAX_MODELS_BYTES = 8 << 20
# After an interrupt, how long a client process has to send what it measured.
WORKER_STOP_TIMEOUT_S = 30.0
# Client processes per CPU at most: each is a whole Python process (~100 MB) there to use a
# core; more than a few a core add nothing, and a typo (--workers 100000) started that many.
WORKERS_PER_CPU = 4


@dataclass(frozen=True)
class ClientSettings:
    """How every client process sends: the server, the model name, the arrival scale, the
    closed-loop limit (None: open loop), the stall timeout (seconds without a byte), the
    request timeout (seconds for a whole answer, retries included), how many times a refused
    request is retried and the seed of the retries' backoff jitter (``replay.loadgen.retry``;
    None: unseeded)."""

    url: str
    model: str | None
    time_scale: float
    max_concurrency: int | None
    stall_timeout_s: float
    request_timeout_s: float = DEFAULT_REQUEST_TIMEOUT_S
    max_retries: int = DEFAULT_MAX_RETRIES
    seed: int | None = None
    api_key: str | None = field(default=None, repr=False)  # never printed nor written


def auth_headers(api_key: str | None) -> dict[str, str]:
    """The headers a server started with an API key (vLLM's ``--api-key``, OpenAI's) expects."""
    return {"Authorization": f"Bearer {api_key}"} if api_key else {}


def check_settings(time_scale: float = 1.0, max_concurrency: int | None = None,
                   workers: int = 1, stall_timeout_s: float = DEFAULT_STALL_TIMEOUT_S,
                   request_timeout_s: float = DEFAULT_REQUEST_TIMEOUT_S,
                   num_requests: int | None = None,
                   max_retries: int = DEFAULT_MAX_RETRIES) -> None:
    """A ``ReplayLLMError`` naming the option for a setting a run cannot use: a scale, count or
    timeout of zero, below, or not finite (NaN would send every request at once), a negative
    retry count, more client processes than ``max_workers()``."""
    positive = {"--time-scale": time_scale, "--stall-timeout": stall_timeout_s,
                "--request-timeout": request_timeout_s}
    for option, value in positive.items():
        if not (math.isfinite(value) and value > 0):
            raise ReplayLLMError(f"{option} must be a finite number > 0, got {value}")
    counts = {"--max-concurrency": max_concurrency, "--workers": workers,
              "--num-requests": num_requests}
    for option, count in counts.items():
        if count is not None and count < 1:
            raise ReplayLLMError(f"{option} must be >= 1, got {count}")
    if workers > max_workers():
        raise ReplayLLMError(f"--workers must be at most {max_workers()} ({WORKERS_PER_CPU} a "
                             f"CPU: each is a Python process), got {workers}")
    if max_retries < 0:
        raise ReplayLLMError(f"--max-retries must be >= 0 (0: no retries), got {max_retries}")


def max_workers() -> int:
    """The most client processes a run may start (``--workers``): ``WORKERS_PER_CPU`` for each
    CPU of this machine."""
    return WORKERS_PER_CPU * (os.cpu_count() or 1)


def base_url(url: str) -> str:
    """The server's base URL, ``http(s)://HOST[:PORT]`` and any path prefix, without the
    ``/v1`` an OpenAI client's base URL ends in (the endpoints add it); a ``ReplayLLMError``
    for one that is not an http(s) URL with a host."""
    from yarl import URL

    try:
        parsed = URL(url.strip())
    except (ValueError, TypeError) as exc:
        raise ReplayLLMError(f"--url {url!r} is not a URL ({exc})") from None
    if parsed.scheme not in ("http", "https") or not parsed.host:
        raise ReplayLLMError(f"--url must be http(s)://HOST[:PORT], got {url!r}")
    base = str(parsed.with_query(None).with_fragment(None)).rstrip("/")
    return base[: -len("/v1")] if base.endswith("/v1") else base


async def served_model(url: str, model: str | None, api_key: str | None = None) -> str | None:
    """``model``, else the first model ``/v1/models`` lists (servers that need a model name get
    one; one that lists none, or has no such endpoint, gets none). Asked either way: a server
    that cannot be reached, or a ``model`` its list does not hold (every request would be
    a 404), is one ``ReplayLLMError`` now, not a failure per request. The list is read up to
    ``MAX_MODELS_BYTES``: one longer cannot name the model (an error without ``model``) nor
    check it (``model`` goes unchecked)."""
    try:
        timeout = aiohttp.ClientTimeout(total=PROBE_TIMEOUT_S)
        async with aiohttp.ClientSession(timeout=timeout, headers=auth_headers(api_key)) as client:
            async with client.get(url + "/v1/models") as response:
                body, cut = await read_at_most(response, MAX_MODELS_BYTES)
    except (aiohttp.ClientError, OSError) as exc:
        raise ReplayLLMError(f"cannot reach {url}: {type(exc).__name__}: {exc}") from None
    except (TimeoutError, asyncio.TimeoutError):
        raise ReplayLLMError(f"cannot reach {url}: no answer to GET /v1/models in "
                             f"{PROBE_TIMEOUT_S:g} s") from None
    if response.status in (401, 403):
        raise ReplayLLMError(f"{url} refused the client (HTTP {response.status}): give its "
                             "API key with --api-key (or OPENAI_API_KEY)")
    if cut and response.status == 200:  # a list that could not be read whole: not guessed at
        if model is None:
            raise ReplayLLMError(f"{url}/v1/models answered over {MAX_MODELS_BYTES >> 20} MiB "
                                 f"(cut at {MAX_MODELS_BYTES >> 20} MiB, unread): name the model "
                                 "with --model")
        return model  # unchecked: a name the server does not know fails each request
    listed = _listed_models(body) if response.status == 200 else []
    if model is None:
        return listed[0] if listed else None
    if listed and model not in listed:  # every request would be a 404: said once, now
        shown = ", ".join(repr(name) for name in listed[:MODELS_SHOWN])
        more = f" and {len(listed) - MODELS_SHOWN} more" if len(listed) > MODELS_SHOWN else ""
        raise ReplayLLMError(f"{url} does not serve the model {model!r} (--model): its "
                             f"/v1/models lists {shown}{more}")
    return model


async def read_at_most(response: aiohttp.ClientResponse, limit: int) -> tuple[bytes, bool]:
    """The first ``limit`` bytes of ``response``'s body, and whether it held more (then the
    rest is left unread: the connection is closed on release, not reused)."""
    body = bytearray()
    while len(body) <= limit:  # one byte past the limit tells a cut body from a full one
        piece = await response.content.read(limit + 1 - len(body))
        if not piece:
            break
        body += piece
    return bytes(body[:limit]), len(body) > limit


def _listed_models(body: bytes) -> list[str]:
    """The model ids of a ``/v1/models`` answer, in its order ([] where it holds none or is
    not such a list: a server that lists nothing is not checked)."""
    try:
        data: Any = json.loads(body).get("data") or []
        return [str(entry["id"]) for entry in data]
    except (ValueError, KeyError, TypeError, AttributeError):
        return []
