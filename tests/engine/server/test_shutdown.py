"""Stopping a server under load: SIGTERM finishes (or aborts) what runs within the grace period
and closes a trace that verifies; kill -9 leaves committed segments that verify."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import httpx
import pytest

pytest.importorskip("fastapi")

from server_process import ServerProcess  # noqa: E402

from replay.verify import verify  # noqa: E402
from tracing import read_trace  # noqa: E402


def _load(url: str, stop: threading.Event, done: list[int]) -> None:
    """Streams of ~40 tokens, one after another, until ``stop``; counts completed ones."""
    while not stop.is_set():
        try:
            with httpx.stream("POST", url + "/v1/completions", timeout=60,
                              json={"prompt": "load", "max_tokens": 40, "stream": True,
                                    "ignore_eos": True}) as response:
                lines = [line for line in response.iter_lines() if line]
            if lines and lines[-1] == "data: [DONE]":
                done.append(1)
        except httpx.HTTPError:
            return  # the server went away


def _start_load(server: ServerProcess, clients: int) -> tuple[threading.Event, list, list[int]]:
    stop, done = threading.Event(), []
    threads = [threading.Thread(target=_load, args=(server.url, stop, done), daemon=True)
               for _ in range(clients)]
    for t in threads:
        t.start()
    deadline = time.monotonic() + 60
    while len(done) < clients and time.monotonic() < deadline:
        time.sleep(0.1)
    assert done, "no request completed under load"
    return stop, threads, done


def test_sigterm_under_load_closes_a_trace_that_verifies(tmp_path: Path) -> None:
    server = ServerProcess(tmp_path / "t", "--grace", "1")
    try:
        stop, threads, _ = _start_load(server, clients=8)
        status = server.terminate()
        stop.set()
        for t in threads:
            t.join(30)
    finally:
        server.kill()
    assert status in (0, -15), server.output()
    trace = read_trace(tmp_path / "t")
    assert trace.complete
    finished = trace.table("request_finished").to_pandas()
    assert len(finished) == trace.table("request_added").num_rows  # none left unfinished
    assert verify(tmp_path / "t").identical


def test_kill_9_under_load_leaves_segments_that_verify(tmp_path: Path) -> None:
    server = ServerProcess(tmp_path / "t", settings=("trace_flush_steps=8",))
    try:
        stop, threads, _ = _start_load(server, clients=4)
        time.sleep(1.0)
        server.kill()
        stop.set()
        for t in threads:
            t.join(30)
    finally:
        server.kill()
    trace = read_trace(tmp_path / "t")
    assert not trace.complete
    assert trace.last_step > 0
    result = verify(tmp_path / "t")
    assert result.identical, result.report()
