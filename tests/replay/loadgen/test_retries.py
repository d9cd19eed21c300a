"""A server that refuses requests with HTTP 429 or 503: loadgen sends them again
(``--max-retries``) after the server's ``Retry-After`` or a backoff, times them from their first
send, keeps within ``--request-timeout`` and stops at Ctrl-C; the ``Retry-After`` reading and the
backoff on their own. Each server is ``_fake_server.FakeServer`` on loopback, in this process."""

from __future__ import annotations

import asyncio
import calendar
import os
import signal
import time
from collections import Counter
from pathlib import Path
from types import SimpleNamespace

import aiohttp
import pytest
from _fake_server import FakeServer, Handler, stream, tokens, workload
from aiohttp import web

from replay.cli.main import main
from replay.loadgen import client, retry
from replay.loadgen.client import Measured, send
from replay.loadgen.result import read_result
from replay.loadgen.runner import run_load
from replay.workloads.request import Request


def _refusing(refusals: dict[str, int], status: int = 429, retry_after: str | None = None,
              then: list[bytes] | None = None) -> tuple[Counter, Handler]:
    """A handler refusing prompt p the first ``refusals[p]`` times it comes (each with
    ``retry_after``), then streaming ``then`` (three tokens); and the count of each prompt."""
    seen: Counter = Counter()

    async def answer(request: web.Request, body: dict, n: int) -> web.StreamResponse:
        prompt = body["prompt"]
        seen[prompt] += 1
        if seen[prompt] <= refusals.get(prompt, 0):
            headers = {} if retry_after is None else {"Retry-After": retry_after}
            return web.json_response({"error": {"message": "slow down"}}, status=status,
                                     headers=headers)
        return await stream(request, then or tokens(3))

    return seen, answer


def test_a_refused_request_is_retried_after_its_retry_after(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """p1 refused twice with 429 and ``Retry-After: 0.3``: answered at its third attempt, its
    retries (2) and its wait (>= 0.6 s) in the result, its TTFT counted from the first send (so
    >= 0.6 s); the others not retried; exit 0 with a line saying so (was: p1 failed, "HTTP
    429", exit 1)."""
    seen, answer = _refusing({"p1": 2}, retry_after="0.3")
    out = tmp_path / "r.parquet"
    with FakeServer(answer) as server:
        status = main(["loadgen", str(workload(tmp_path / "w.jsonl", 3)), "--url", server.url,
                       "--out", str(out)])
    assert status == 0 and seen == {"p0": 1, "p1": 3, "p2": 1}
    frame, summary, run = read_result(out)
    assert (frame["error"] == "").all() and frame["completion_tokens"].tolist() == [3, 3, 3]
    assert frame["retries"].tolist() == [0, 2, 0] and summary["retries"] == 2
    assert 0.6 <= frame["retry_wait_s"][1] < 1.5 and frame["retry_wait_s"][0] == 0
    assert frame["ttft_s"][1] > frame["retry_wait_s"][1] >= 0.6
    assert frame["ttft_s"][0] < 0.5 and run["max_retries"] == 3
    assert "1 requests were retried (refused with HTTP 429/502/503/504" in capsys.readouterr().out


def test_backoff_without_retry_after_then_a_failure_with_the_status(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """503 with no ``Retry-After``, every time, for p0; 429 once for p1: with ``--max-retries
    2`` p0 is sent three times, waiting the (jittered, doubling) backoff, then fails with its
    status, message and retry count; p1 is answered at its second attempt."""
    monkeypatch.setattr(retry, "BACKOFF_BASE_S", 0.1)
    seen, answer = _refusing({"p0": 99, "p1": 1}, status=503)
    out = tmp_path / "r.parquet"
    with FakeServer(answer) as server:
        status = main(["loadgen", str(workload(tmp_path / "w.jsonl", 2)), "--url", server.url,
                       "--max-retries", "2", "--out", str(out)])
    assert status == 1 and seen == {"p0": 3, "p1": 2}
    frame, summary, _ = read_result(out)
    assert frame["error"].tolist() == ["HTTP 503: slow down (after 2 retries)", ""]
    assert frame["retries"].tolist() == [2, 1]
    assert 0.05 + 0.1 <= frame["retry_wait_s"][0] < 1.0  # half to all of 0.1 + 0.2 s
    assert summary["errors"] == 1 and summary["retries"] == 3


def test_retries_keep_within_the_request_timeout() -> None:
    """The request timeout spans every attempt. A ``Retry-After`` past it is not waited (p0
    fails at once naming both); waits that fit are (p1: 0.4 s apart until the next would
    pass 1 s); and an attempt after a retry gets only what is left (p2: refused, then a
    stream that never ends, times out 1 s after its first send, not 1 s after the retry)."""
    seen: Counter = Counter()

    async def answer(request: web.Request, body: dict, n: int) -> web.StreamResponse:
        prompt = body["prompt"]
        seen[prompt] += 1
        if prompt == "p2" and seen[prompt] > 1:
            return await stream(request, [b": ping\n\n"] * 1000, gap=0.05)
        wait = {"p0": "60", "p1": "0.4", "p2": "0.5"}[prompt]
        return web.json_response({"error": {"message": "busy"}}, status=429,
                                 headers={"Retry-After": wait})

    requests = [Request(f"p{i}", max_tokens=2, arrival_s=0.0) for i in range(3)]
    with FakeServer(answer) as server:
        measured, wall_s = run_load(requests, server.url, use_tqdm=False,
                                    request_timeout_s=1.0, max_retries=10)
    p0, p1, p2 = (m.error for m in measured)
    assert p0 == ("HTTP 429: busy (waiting 60 s to retry would pass --request-timeout)")
    assert measured[0].retries == 0
    assert p1.startswith("HTTP 429: busy (after 2 retries; waiting 0.4 s to retry would ")
    assert seen["p1"] == 3 and measured[1].retries == 2
    assert p2.startswith("timed out: no complete answer in 1 s") and p2.endswith("(after 1 retry)")
    assert wall_s < 1.4, wall_s  # p2 ends ~1 s after it was sent (1.5 s: a fresh full limit)


def test_ctrl_c_during_a_retry_wait_stops_the_run(tmp_path: Path) -> None:
    """SIGINT while p1 waits out a ``Retry-After: 30``: the run ends at once (exit 130), p0
    written, p1 not (it never completed), the result partial (was: p1 failed on its 429)."""
    seen: Counter = Counter()

    async def answer(request: web.Request, body: dict, n: int) -> web.StreamResponse:
        seen[body["prompt"]] += 1
        if body["prompt"] != "p1":
            return await stream(request, tokens(3))
        # Once the client has its 429 and is waiting (the server's loop is in its thread).
        asyncio.get_running_loop().call_later(0.3, os.kill, os.getpid(), signal.SIGINT)
        return web.json_response({"error": {"message": "later"}}, status=429,
                                 headers={"Retry-After": "30"})

    out = tmp_path / "r.parquet"
    began = time.monotonic()
    with FakeServer(answer) as server:
        status = main(["loadgen", str(workload(tmp_path / "w.jsonl", 3)), "--url", server.url,
                       "--max-concurrency", "1", "--out", str(out)])
    assert status == 130 and time.monotonic() - began < 10
    assert seen == {"p0": 1, "p1": 1}
    frame, _, run = read_result(out)
    assert frame["index"].tolist() == [0] and run["partial"] is True


def test_a_result_from_before_the_retry_columns_reads_as_never_retried(tmp_path: Path) -> None:
    """A result file written without ``retries`` / ``retry_wait_s`` (older loadgen) reads,
    those columns filled with 0."""
    seen, answer = _refusing({})
    out = tmp_path / "r.parquet"
    with FakeServer(answer) as server:
        assert main(["loadgen", str(workload(tmp_path / "w.jsonl", 2)), "--url", server.url,
                     "--out", str(out)]) == 0
    import pyarrow.parquet as pq

    table = pq.read_table(out)
    pq.write_table(table.drop_columns(["retries", "retry_wait_s"]), out)
    frame, summary, _ = read_result(out)
    assert frame["retries"].tolist() == [0, 0] and frame["retry_wait_s"].tolist() == [0.0, 0.0]
    assert summary["requests"] == 2


@pytest.mark.parametrize(("header", "expected"), [
    ("2", 2.0), (" 0 ", 0.0), ("1.5", 1.5), ("-1", None), ("soon", None), ("", None),
    (None, None), ("nan", None), ("inf", None),
    ("Sun, 06 Nov 1994 08:49:47 GMT", 10.0),  # IMF-fixdate, the preferred form
    ("Sunday, 06-Nov-94 08:49:47 GMT", 10.0),  # RFC 850, obsolete but allowed
    ("Sun Nov  6 08:49:47 1994", 10.0),  # asctime
    ("Sun, 06 Nov 1994 08:49:27 GMT", 0.0),  # already past: at once
])
def test_retry_after_seconds_or_http_date(header: str | None, expected: float | None) -> None:
    """``Retry-After`` as seconds or as each HTTP-date form (measured from ``now``); anything
    else is no answer, and the backoff is used."""
    now = calendar.timegm((1994, 11, 6, 8, 49, 37))
    assert retry.retry_after_s(header, now=now) == expected


def test_the_backoff_doubles_with_jitter_up_to_its_cap() -> None:
    """Retry k+1 waits between half and all of BASE * 2**k, never over the cap."""
    for k in range(12):
        full = min(retry.BACKOFF_CAP_S, retry.BACKOFF_BASE_S * 2**k)
        for _ in range(20):
            assert full / 2 <= retry.retry_delay(None, k) <= full
    assert retry.retry_delay("3", 5) == 3.0  # the server's answer before the backoff


def test_gateway_errors_are_retried_a_connection_lost_once_sent_is_not(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """502 once for p0, 504 twice for p1: each answered at its next attempts (a backoff apart).
    p2's connection is closed by the server once it has read the whole request, before any
    status line: the server may be running it, so it is not sent again (was: retried, the
    server's work done twice and counted twice) and fails with its error and why. p3's
    connection drops after two chunks of its answer: never sent again either."""
    monkeypatch.setattr(retry, "BACKOFF_BASE_S", 0.01)
    seen: Counter = Counter()

    async def answer(request: web.Request, body: dict, n: int) -> web.StreamResponse:
        prompt = body["prompt"]
        seen[prompt] += 1
        status = {"p0": (502, 1), "p1": (504, 2)}.get(prompt)
        if status is not None and seen[prompt] <= status[1]:
            return web.json_response({"error": {"message": "bad gateway"}}, status=status[0])
        if prompt == "p2":
            return await stream(request, tokens(3), close_after=0)
        return await stream(request, tokens(3), close_after=2 if prompt == "p3" else None)

    out = tmp_path / "r.parquet"
    with FakeServer(answer) as server:
        status = main(["loadgen", str(workload(tmp_path / "w.jsonl", 4)), "--url", server.url,
                       "--out", str(out)])
    assert status == 1 and seen == {"p0": 2, "p1": 3, "p2": 1, "p3": 1}
    frame, summary, _ = read_result(out)
    assert frame["error"].tolist() == [
        "", "", f"ServerDisconnectedError: Server disconnected ({retry.SENT_WHOLE})",
        "the server closed the connection mid-stream"]
    assert frame["retries"].tolist() == [1, 2, 0, 0] and summary["retries"] == 3
    assert frame["completion_tokens"].tolist()[:2] == [3, 3]


_KEY = SimpleNamespace(host="h", port=80, ssl=True)  # what a connector error names


@pytest.mark.parametrize(("exc", "reached"), [
    (aiohttp.ClientConnectorError(_KEY, OSError(111, "Connection refused")), False),
    (aiohttp.ClientConnectorDNSError(_KEY, OSError(-2, "Name not known")), False),
    (aiohttp.ClientOSError(32, "Can not write request body for http://h/v1/completions"), False),
    (aiohttp.ClientConnectionResetError("Cannot write to closing transport"), False),
    (aiohttp.ServerDisconnectedError(), True),
    (aiohttp.ClientOSError(104, "Connection reset by peer"), True),
])
def test_only_a_request_that_never_reached_the_server_is_retried(
        exc: Exception, reached: bool, monkeypatch: pytest.MonkeyPatch) -> None:
    """A POST failing before any answer is sent again only where the request provably never
    reached the server: no connection, or a write that failed before the request was whole.
    A disconnect or reset once it was written may be a server already generating: one attempt,
    failing with its error and why it was not retried (was: every one retried)."""
    assert retry.never_reached(exc) is not reached

    class Session:
        timeout = aiohttp.ClientTimeout(total=60)
        posts = 0

        async def post(self, *args: object, **kwargs: object) -> None:
            Session.posts += 1
            raise exc

    async def go() -> Measured:
        return await send(Session(), "http://h/v1/completions", {},  # type: ignore[arg-type]
                          Measured(0, 1, 1, 0.0), time.perf_counter, max_retries=1,
                          rng=retry.retry_rng(0, 0))

    monkeypatch.setattr(retry, "BACKOFF_BASE_S", 0.001)
    out = asyncio.run(go())
    assert out.done and Session.posts == (1 if reached else 2)
    assert out.retries == (0 if reached else 1)
    assert out.error.startswith(type(exc).__name__)
    assert out.error.endswith(f"({retry.SENT_WHOLE})" if reached else "(after 1 retry)")


def test_a_refused_connection_is_retried_then_fails_with_its_error(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """A port nobody listens on (connection refused, no byte of an answer): sent again up to
    ``max_retries`` times, then failing with the connection error and the retry count."""
    import socket

    monkeypatch.setattr(retry, "BACKOFF_BASE_S", 0.01)
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]

    async def go() -> Measured:
        async with aiohttp.ClientSession() as session:
            return await send(session, f"http://127.0.0.1:{port}/v1/completions", {},
                              Measured(0, 1, 1, 0.0), time.perf_counter, max_retries=2)

    out = asyncio.run(go())
    assert out.retries == 2 and out.done
    assert out.error.startswith("ClientConnectorError") and out.error.endswith("(after 2 retries)")


def test_the_backoff_jitter_is_reproducible_from_the_seed(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Two runs with ``--seed 5`` wait the same backoffs (p0 refused three times with 503 and
    no Retry-After); ``--seed 6`` waits others; the seed is in the result's settings, and a run
    without ``--seed`` records the one it drew (was: unseeded jitter, no ``--seed``)."""
    monkeypatch.setattr(retry, "BACKOFF_BASE_S", 0.001)
    waits: list[float] = []

    def recorded(*args: object, **kwargs: object) -> float:
        waits.append(retry.retry_delay(*args, **kwargs))  # type: ignore[arg-type]
        return waits[-1]

    monkeypatch.setattr(client, "retry_delay", recorded)

    def run(*seed: str) -> tuple[list[float], dict]:
        waits.clear()
        _, answer = _refusing({"p0": 3}, status=503)
        out = tmp_path / "r.parquet"
        with FakeServer(answer) as server:
            assert main(["loadgen", str(workload(tmp_path / "w.jsonl", 2)), "--url",
                         server.url, *seed, "--out", str(out)]) == 0
        return list(waits), read_result(out)[2]

    first, settings = run("--seed", "5")
    assert len(first) == 3 and settings["seed"] == 5
    assert run("--seed", "5")[0] == first
    assert run("--seed", "6")[0] != first
    assert isinstance(run()[1]["seed"], int)
    rng = retry.retry_rng(5, 0)
    assert [retry.retry_delay(None, k, rng=rng) for k in range(3)] == first
