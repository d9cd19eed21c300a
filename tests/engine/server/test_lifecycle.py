"""The server's lifecycle with streams in flight (session 31): SIGTERM or SIGINT ends every open
stream cleanly (``finish_reason`` ``abort`` and ``[DONE]`` at the end of the grace period, each
recorded ``aborted``), exits 0 with the summary line and leaves a complete trace that verifies;
the engine process killed (kill -9) fails open and new requests at once, ``/health`` says so
and the server stops with one line, exit 2, its trace incomplete and verifiable; a request
refused because intake stopped is a 503 with ``Retry-After``."""

from __future__ import annotations

import json
import os
import signal
import threading
import time
from pathlib import Path
from typing import Any

import httpx
import pytest

pytest.importorskip("fastapi")

from fake_engine import FakeEngine, app_client  # noqa: E402
from server_process import ServerProcess  # noqa: E402

from engine.server.engine_loop import EngineStopped  # noqa: E402
from replay.verify import verify  # noqa: E402
from tracing import read_trace  # noqa: E402

STREAMS = 4
WAIT_S = 30.0  # every wait below ends on an event long before this on a working server


class _Stream(threading.Thread):
    """One long streamed completion; ``first`` is set at its first chunk, ``lines`` holds every
    non-empty line, ``error`` what ended it otherwise than by the server closing the body."""

    def __init__(self, url: str) -> None:
        super().__init__(daemon=True)
        self.url = url
        self.first = threading.Event()
        self.lines: list[str] = []
        self.error: BaseException | None = None

    def run(self) -> None:
        body = {"prompt": "hello", "max_tokens": 3000, "stream": True, "ignore_eos": True}
        try:
            with httpx.stream("POST", self.url + "/v1/completions", json=body,
                              timeout=WAIT_S) as response:
                for line in response.iter_lines():
                    if line:
                        self.lines.append(line)
                        self.first.set()
        except httpx.HTTPError as exc:
            self.error = exc
        finally:
            self.first.set()

    def events(self) -> list[dict[str, Any]]:
        return [json.loads(line[6:]) for line in self.lines[:-1]]


def _open_streams(server: ServerProcess) -> list[_Stream]:
    streams = [_Stream(server.url) for _ in range(STREAMS)]
    for stream in streams:
        stream.start()
    for stream in streams:
        assert stream.first.wait(WAIT_S) and stream.error is None, stream.error
    return streams


def _committed(trace_dir: Path) -> None:
    """Wait until the trace's writer has committed a step: the streams' first tokens come
    before the background writer's first segment, and a kill before it leaves nothing to
    verify (a busy machine made that window seconds long)."""
    from tracing.errors import TraceError

    deadline = time.monotonic() + WAIT_S
    while True:
        try:
            if read_trace(trace_dir).last_step >= 0:
                return
        except (TraceError, OSError):
            pass
        assert time.monotonic() < deadline, "no step committed"
        time.sleep(0.02)


def _join(streams: list[_Stream], within_s: float) -> None:
    deadline = time.monotonic() + within_s
    for stream in streams:
        stream.join(max(0.0, deadline - time.monotonic()))
    assert not any(s.is_alive() for s in streams), "a stream hung"


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT], ids=["SIGTERM", "SIGINT"])
def test_a_signal_ends_open_streams_with_abort_and_exits_0(tmp_path: Path, sig: int) -> None:
    """Before: at the grace period's end uvicorn cancelled the streams' tasks, so each client
    saw its body cut (an incomplete chunked read: no error, no ``[DONE]``) and the log a
    traceback per stream; SIGINT then exited 130 (``interrupted``, no summary line)."""
    server = ServerProcess(tmp_path / "t", "--grace", "0.5")
    try:
        streams = _open_streams(server)
        server.proc.send_signal(sig)
        _join(streams, 10.0)
        status = server.proc.wait(WAIT_S)
    finally:
        server.kill()
    output = server.output()
    for stream in streams:
        assert stream.error is None, f"{stream.error!r}\n{output}"
        assert stream.lines[-1] == "data: [DONE]"
        assert stream.events()[-1]["choices"][0]["finish_reason"] == "abort"
    assert status == 0, output
    assert f"replayllm serve: stopped after {STREAMS} requests" in output
    assert "Traceback" not in output, output
    trace = read_trace(tmp_path / "t")
    assert trace.complete
    finished = trace.table("request_finished").to_pandas()
    assert finished.reason.tolist() == ["aborted"] * STREAMS
    assert verify(tmp_path / "t").identical


def test_a_killed_engine_process_fails_requests_at_once_and_the_server_stops(
        tmp_path: Path) -> None:
    """kill -9 of the engine process (checked, not changed: it already held)."""
    server = ServerProcess(tmp_path / "t", "--grace", "1", settings=("trace_flush_steps=1",))
    try:
        streams = _open_streams(server)
        engine_pid = server.proc.pid
        for child in server._children():  # the engine, beside multiprocessing's tracker
            with open(f"/proc/{child}/cmdline", "rb") as f:
                if b"spawn_main" in f.read():
                    engine_pid = child
        assert engine_pid != server.proc.pid
        _committed(tmp_path / "t")  # a step the killed trace must keep, written before the kill
        os.kill(engine_pid, signal.SIGKILL)
        _join(streams, 10.0)
        for stream in streams:
            assert stream.lines[-1] == "data: [DONE]"
            assert stream.events()[-1]["error"]["message"] == "the engine process died"
        assert httpx.get(server.url + "/health", timeout=WAIT_S).status_code == 503
        late = httpx.post(server.url + "/v1/completions", timeout=WAIT_S,
                          json={"prompt": "x", "max_tokens": 3})
        assert late.status_code == 503
        assert late.json()["error"]["type"] == "service_unavailable"
        server.proc.send_signal(signal.SIGTERM)
        status = server.proc.wait(WAIT_S)
    finally:
        server.kill()
    output = server.output()
    assert status == 2, output
    assert "replayllm serve: error: the engine failed: the engine process died" in output
    trace = read_trace(tmp_path / "t")
    assert not trace.complete
    assert verify(tmp_path / "t").identical


class _StoppedEngine(FakeEngine):
    """An engine whose intake has stopped (the server is shutting down)."""

    def submit(self, stream: Any) -> None:
        raise EngineStopped("the server is shutting down")


def test_a_request_after_intake_stopped_is_a_503_with_retry_after() -> None:
    """A request whose prompt was ready only after the engine stopped taking requests (the
    grace period over) was a 503 with no ``Retry-After``: a client could not tell when to come
    back, and ``loadgen`` backed off blindly."""
    with app_client(_StoppedEngine()) as client:
        response = client.post("/v1/completions", json={"prompt": "hi", "max_tokens": 3})
    assert response.status_code == 503
    assert response.json()["error"]["message"] == "the server is shutting down"
    assert int(response.headers["Retry-After"]) >= 1
