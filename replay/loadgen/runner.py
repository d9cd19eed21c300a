"""Send a workload: each request at its arrival time (open loop), or N in flight (closed loop).

A conversation (requests sharing a ``conversation_id``) goes through the chat endpoint: its
first turn at its arrival, each later turn ``think_time_s`` after the previous answer ended, its
messages the history (every earlier user turn and the answer text the server gave) and the new
user turn. Other requests go to the completions endpoint. ``workers`` > 1 splits the sessions
over that many client processes (one Python event loop cannot read tens of thousands of
streamed chunks a second); their times share one clock (``time.perf_counter``,
CLOCK_MONOTONIC, one clock for every process of a machine).
"""

from __future__ import annotations

import asyncio
import contextlib
import multiprocessing
import signal
import time
from collections.abc import Callable, Coroutine
from dataclasses import replace
from multiprocessing.connection import Connection, wait
from typing import Any, TypeVar

import aiohttp
from tqdm.auto import tqdm

from engine.errors import ReplayLLMError
from replay.loadgen.answer import Measured
from replay.loadgen.client import chat_body, monotonic_clock, request_body, send
from replay.loadgen.interrupt import STOP_SIGNALS, Interrupt, StopWorkersOnSigint
from replay.loadgen.retry import retry_rng
from replay.loadgen.settings import (
    DEFAULT_MAX_RETRIES,
    DEFAULT_REQUEST_TIMEOUT_S,
    DEFAULT_STALL_TIMEOUT_S,
    WORKER_STOP_TIMEOUT_S,
    ClientSettings,
    auth_headers,
    base_url,
    check_settings,
    served_model,
)
from replay.workloads.request import Request

T = TypeVar("T")

# Client processes start (import) before the run's clock starts; then they all begin together.
WORKER_READY_TIMEOUT_S = 120.0


def run_loop(coro: Coroutine[Any, Any, T]) -> T:
    """Run ``coro`` to completion on a new event loop: uvloop's where it is installed (its
    per-callback cost is a fraction of asyncio's, and the client's own delays are measured
    as the server's), asyncio's otherwise."""
    try:
        import uvloop
    except ImportError:
        return asyncio.run(coro)
    with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
        return runner.run(coro)


async def sleep_until(target_s: float, clock: Callable[[], float]) -> None:
    """Return once ``clock()`` reads ``target_s`` or later. One sleep is not enough: uvloop
    keeps its loop time in whole milliseconds, cached per iteration, so a timer can fire up to
    about a millisecond before it is due, and an open loop must never send early."""
    while (delay := target_s - clock()) > 0:
        await asyncio.sleep(delay)


def sessions_of(requests: list[Request]) -> list[list[int]]:
    """Indices of ``requests`` grouped into what is sent one after another: a conversation's
    turns in turn order, every other request alone; ordered by first arrival."""
    sessions: list[list[int]] = []
    by_conversation: dict[str, list[int]] = {}
    for i, request in enumerate(requests):
        if request.conversation_id is None:
            sessions.append([i])
        elif request.conversation_id in by_conversation and request.follows_previous_turn:
            by_conversation[request.conversation_id].append(i)
        else:  # a conversation's first turn (a new one under a reused id starts over)
            by_conversation[request.conversation_id] = [i]
            sessions.append(by_conversation[request.conversation_id])
    for session in sessions:
        session.sort(key=lambda i: requests[i].turn)
    return sessions


def run_load(
    requests: list[Request],
    url: str,
    model: str | None = None,
    time_scale: float = 1.0,
    max_concurrency: int | None = None,
    use_tqdm: bool = True,
    tokenizer: Any = None,
    workers: int = 1,
    stall_timeout_s: float = DEFAULT_STALL_TIMEOUT_S,
    request_timeout_s: float = DEFAULT_REQUEST_TIMEOUT_S,
    api_key: str | None = None,
    max_retries: int = DEFAULT_MAX_RETRIES,
    seed: int | None = None,
) -> tuple[list[Measured], float]:
    """Send ``requests`` to ``url`` (a server's base URL, e.g. http://127.0.0.1:8000);
    returns what was measured per request (workload order) and the wall seconds of the run.

    Open loop (``max_concurrency`` None): a session (a request, or a conversation's first
    turn) is sent ``arrival_s * time_scale`` seconds after the start, whatever is in flight.
    Closed loop: sessions go in workload order, at most ``max_concurrency`` in flight, the
    next one as soon as one ends. ``tokenizer`` (a checkpoint directory or a loaded tokenizer)
    turns token-id prompts of conversations into the text of their chat messages. A request
    whose server sends nothing for ``stall_timeout_s`` seconds, or has not answered whole in
    ``request_timeout_s``, fails as timed out. A server that cannot be reached, or refuses the
    client (``api_key``: sent as a bearer token), is a ``ReplayLLMError`` before anything is
    sent. A refused request is retried up to ``max_retries`` times, its backoff's jitter
    drawn from ``seed`` and its index (``retry.retry_rng``: the same seed, the same waits).

    SIGINT (Ctrl-C) or SIGTERM ends the run early: the requests in flight are abandoned and
    the call returns; a request that was answered or failed has ``done`` set, the others not
    (where client processes were lost, None).
    """
    check_settings(time_scale, max_concurrency, workers, stall_timeout_s, request_timeout_s,
                   max_retries=max_retries)
    if not requests:
        raise ReplayLLMError("the workload has no requests")
    url = base_url(url)
    model = run_loop(served_model(url, model, api_key))
    settings = ClientSettings(url, model, time_scale, max_concurrency, stall_timeout_s,
                              request_timeout_s, max_retries=max_retries, seed=seed,
                              api_key=api_key)
    sessions = sessions_of(requests)
    texts = _turn_texts(requests, sessions, tokenizer)
    if workers == 1 or len(sessions) == 1:
        start = time.perf_counter()
        measured = run_loop(_run(requests, sessions, texts, settings, use_tqdm, start))
        return measured, time.perf_counter() - start
    return _run_workers(requests, sessions, texts, settings, min(workers, len(sessions)),
                        use_tqdm)


def _turn_texts(requests: list[Request], sessions: list[list[int]],
                tokenizer: Any) -> dict[int, str]:
    """A conversation turn's user message text, by request index."""
    texts: dict[int, str] = {}
    loaded = None
    for session in sessions:
        if requests[session[0]].conversation_id is None:
            continue
        for i in session:
            prompt = requests[i].prompt_token_ids()
            if isinstance(prompt, str):
                texts[i] = prompt
                continue
            if tokenizer is None:
                raise ReplayLLMError("a conversation with token-id prompts goes through the chat "
                                     "endpoint as text: give --tokenizer (a checkpoint directory)")
            if loaded is None:
                loaded = tokenizer
                if isinstance(tokenizer, str):
                    from engine.model.tokenizer import load_tokenizer

                    try:
                        loaded = load_tokenizer(tokenizer)
                    except ReplayLLMError as exc:  # it said "model directory": name the option
                        raise ReplayLLMError(f"--tokenizer {tokenizer}: {exc}") from None
            texts[i] = loaded.decode(prompt)
    return texts


async def _run(requests: list[Request], sessions: list[list[int]], texts: dict[int, str],
               settings: ClientSettings, use_tqdm: bool, start: float,
               stop_fd: int | None = None) -> list[Measured]:
    """Run ``sessions`` on one event loop; the measured requests, in ``requests`` order (None
    where a request belongs to another worker's sessions). The run stops early, returning what
    it has, on SIGINT or SIGTERM (in the main thread) or, given ``stop_fd``, once that is
    readable."""
    measured: list[Any] = [None] * len(requests)
    for session in sessions:
        for i in session:
            r = requests[i]
            due = r.arrival_s * settings.time_scale
            measured[i] = Measured(i, len(r.prompt) if not isinstance(r.prompt, str) else 0,
                                   r.max_tokens, due if settings.max_concurrency is None
                                   and i == session[0] else 0.0)
    with Interrupt(stop_fd) as interrupt:
        try:
            await _run_sessions(requests, sessions, texts, settings, use_tqdm, start, measured)
        except asyncio.CancelledError:
            if not interrupt.fired:
                raise
            if (uncancel := getattr(interrupt.task, "uncancel", None)) is not None:
                uncancel()  # Python 3.11+: the task goes on, not cancelled
    return measured


async def _run_sessions(requests: list[Request], sessions: list[list[int]],
                        texts: dict[int, str], settings: ClientSettings, use_tqdm: bool,
                        start: float, measured: list[Any]) -> None:
    """Send ``sessions``, filling ``measured`` (made by ``_run``) as each request ends."""
    url, model, time_scale = settings.url, settings.model, settings.time_scale
    max_concurrency = settings.max_concurrency
    limit = max_concurrency or sum(map(len, sessions))
    bar = tqdm(total=sum(map(len, sessions)), desc="loadgen", disable=not use_tqdm,
               dynamic_ncols=True)
    clock = monotonic_clock(start)
    errors = 0

    timeout = aiohttp.ClientTimeout(total=settings.request_timeout_s,
                                    sock_connect=settings.stall_timeout_s,
                                    sock_read=settings.stall_timeout_s)
    connector = aiohttp.TCPConnector(limit=limit, limit_per_host=limit)
    # Lines up to 2 MiB (aiohttp stops at twice read_bufsize): a long chunk is not an error.
    async with aiohttp.ClientSession(timeout=timeout, connector=connector, read_bufsize=2**20,
                                     headers=auth_headers(settings.api_key)
                                     ) as client, _closing(bar):
        async def one(i: int, body: dict[str, Any], endpoint: str) -> Measured:
            nonlocal errors
            out = await send(client, url + endpoint, body, measured[i], clock,
                             max_retries=settings.max_retries,
                             rng=retry_rng(settings.seed, i))
            errors += bool(out.error)
            bar.update(1)
            bar.set_postfix(errors=errors)
            return out

        async def run_session(session: list[int]) -> None:
            first = requests[session[0]]
            if first.conversation_id is None:
                await one(session[0], request_body(first, model), "/v1/completions")
                return
            messages: list[dict[str, str]] = []
            for k, i in enumerate(session):
                if k:
                    await sleep_until(clock() + requests[i].think_time_s * time_scale, clock)
                    measured[i].arrival_s = clock()
                messages.append({"role": "user", "content": texts[i]})
                measured[i].text = ""
                out = await one(i, chat_body(list(messages), requests[i], model),
                                "/v1/chat/completions")
                if out.error:  # the conversation cannot go on without its answer
                    for later in session[k + 1:]:
                        measured[later].error = f"an earlier turn failed: {out.error}"
                        measured[later].done = True
                        bar.update(1)
                    return
                messages.append({"role": "assistant", "content": out.text or ""})
                out.text = None  # the history holds it; the result keeps no text

        if max_concurrency is None:
            async def at_arrival(session: list[int]) -> None:
                await sleep_until(measured[session[0]].arrival_s, clock)
                await run_session(session)

            await asyncio.gather(*(at_arrival(s) for s in sessions))
        else:
            queue = iter(sessions)

            async def worker() -> None:
                for session in queue:
                    measured[session[0]].arrival_s = clock()
                    await run_session(session)

            await asyncio.gather(*(worker() for _ in range(min(max_concurrency,
                                                               len(sessions)))))


@contextlib.asynccontextmanager
async def _closing(bar: Any) -> Any:
    try:
        yield bar
    finally:
        bar.close()


def _run_workers(requests: list[Request], sessions: list[list[int]], texts: dict[int, str],
                 settings: ClientSettings, workers: int,
                 use_tqdm: bool) -> tuple[list[Measured], float]:
    """Sessions dealt round-robin to ``workers`` client processes, started together. The
    workers ignore SIGINT and SIGTERM: on either this process tells each to stop, and takes
    what it has."""
    context = multiprocessing.get_context("spawn")
    limit = settings.max_concurrency
    per_worker = replace(settings, max_concurrency=limit and max(1, limit // workers))
    procs, conns = [], []
    for w in range(workers):
        parent, child = context.Pipe()
        proc = context.Process(target=_worker_main, daemon=True, args=(
            child, requests, sessions[w::workers], texts, per_worker))
        proc.start()
        child.close()
        procs.append(proc)
        conns.append(parent)
    for conn in conns:
        if not conn.poll(WORKER_READY_TIMEOUT_S):
            raise ReplayLLMError("a loadgen worker process did not start")
        conn.recv()
    start = time.perf_counter()
    for conn in conns:
        conn.send(start)
    measured: list[Any] = [None] * len(requests)
    bar = tqdm(total=workers, desc="loadgen workers", disable=not use_tqdm)
    pending = dict(zip(conns, procs))
    with StopWorkersOnSigint(list(pending)) as stop:
        while pending:
            ready = wait(list(pending), timeout=WORKER_STOP_TIMEOUT_S if stop.sent else 0.2)
            if not ready and stop.sent:
                break  # a worker that does not answer its stop: what it measured is lost
            for conn in ready:
                proc = pending.pop(conn)  # type: ignore[call-overload]
                try:
                    part = conn.recv()  # type: ignore[union-attr]
                except EOFError:
                    if stop.sent:
                        continue
                    raise ReplayLLMError(f"a loadgen worker process died ({proc.exitcode})"
                                         ) from None
                for m in part:
                    if m is not None:
                        measured[m.index] = m
                bar.update(1)
                proc.join()
    bar.close()
    return measured, time.perf_counter() - start


def _worker_main(conn: Connection, requests: list[Request], sessions: list[list[int]],
                 texts: dict[int, str], settings: ClientSettings) -> None:
    for signum in STOP_SIGNALS:  # the parent says when to stop (a message)
        signal.signal(signum, signal.SIG_IGN)
    conn.send("ready")
    start = conn.recv()
    conn.send(run_loop(_run(requests, sessions, texts, settings, False, start,
                            stop_fd=conn.fileno())))


