"""Send a workload: each request at its arrival time (open loop), or N in flight (closed loop)."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import httpx
from tqdm.auto import tqdm

from engine.errors import ReplayLLMError
from replay.loadgen.client import Measured, monotonic_clock, request_body, send
from replay.workloads.request import Request

# Per request: connecting and reading may take as long as a long answer does.
REQUEST_TIMEOUT_S = 3600.0


def run_load(
    requests: list[Request],
    url: str,
    model: str | None = None,
    time_scale: float = 1.0,
    max_concurrency: int | None = None,
    use_tqdm: bool = True,
) -> tuple[list[Measured], float]:
    """Send ``requests`` to ``url`` (a server's base URL, e.g. http://127.0.0.1:8000);
    returns what was measured per request (workload order) and the wall seconds of the run.

    Open loop (``max_concurrency`` None): request i is sent ``arrival_s * time_scale`` seconds
    after the start, whatever is in flight. Closed loop: requests go in workload order, at most
    ``max_concurrency`` in flight, the next one as soon as one finishes.
    """
    if time_scale <= 0:
        raise ReplayLLMError(f"--time-scale must be > 0, got {time_scale}")
    if max_concurrency is not None and max_concurrency < 1:
        raise ReplayLLMError(f"--max-concurrency must be >= 1, got {max_concurrency}")
    if not requests:
        raise ReplayLLMError("the workload has no requests")
    return asyncio.run(_run(requests, url.rstrip("/"), model, time_scale, max_concurrency,
                            use_tqdm))


async def _run(requests: list[Request], url: str, model: str | None, time_scale: float,
               max_concurrency: int | None, use_tqdm: bool) -> tuple[list[Measured], float]:
    endpoint = url + "/v1/completions"
    if model is None:
        model = await _served_model(url)
    limits = httpx.Limits(max_connections=max_concurrency or len(requests),
                          max_keepalive_connections=max_concurrency or len(requests))
    bar = tqdm(total=len(requests), desc="loadgen", disable=not use_tqdm, dynamic_ncols=True)
    start = time.perf_counter()
    clock = monotonic_clock(start)
    measured = [Measured(i, len(r.prompt) if not isinstance(r.prompt, str) else 0,
                         r.max_tokens, r.arrival_s * time_scale if max_concurrency is None
                         else 0.0) for i, r in enumerate(requests)]
    errors = 0

    async with httpx.AsyncClient(timeout=REQUEST_TIMEOUT_S, limits=limits) as client:
        async def one(i: int) -> None:
            nonlocal errors
            await send(client, endpoint, request_body(requests[i], model), measured[i], clock)
            errors += bool(measured[i].error)
            bar.update(1)
            bar.set_postfix(errors=errors)

        if max_concurrency is None:
            async def at_arrival(i: int) -> None:
                delay = measured[i].arrival_s - clock()
                if delay > 0:
                    await asyncio.sleep(delay)
                await one(i)

            await asyncio.gather(*(at_arrival(i) for i in range(len(requests))))
        else:
            queue = iter(range(len(requests)))

            async def worker() -> None:
                for i in queue:
                    measured[i].arrival_s = clock()
                    await one(i)

            await asyncio.gather(*(worker() for _ in range(min(max_concurrency,
                                                               len(requests)))))
    bar.close()
    return measured, clock()


async def _served_model(url: str) -> str | None:
    """The first model ``/v1/models`` lists (servers that need a model name get one)."""
    try:
        async with httpx.AsyncClient(timeout=30) as client:
            response = await client.get(url + "/v1/models")
        data: Any = response.json().get("data") or []
        return str(data[0]["id"]) if data else None
    except (httpx.HTTPError, ValueError, KeyError, IndexError, AttributeError) as exc:
        raise ReplayLLMError(f"cannot reach {url}/v1/models: {exc}") from None
