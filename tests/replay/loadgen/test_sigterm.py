"""SIGTERM (what ``timeout``, ``kill`` and job schedulers send) stops a load run as Ctrl-C does:
the requests completed so far are written as a partial result, exit 143 (128 + SIGTERM; Ctrl-C
130). Before, SIGTERM killed loadgen at once: no result file, every measurement lost. One
client process, and several (which ignore the signal and are told to stop by their parent)."""

from __future__ import annotations

import os
import signal
from pathlib import Path

import pytest
from _fake_server import FakeServer, stream, tokens, workload
from aiohttp import web

from replay.cli.main import main
from replay.loadgen.result import read_result


@pytest.mark.parametrize("workers", ["1", "2"])
def test_sigterm_writes_what_completed_as_a_partial_result(
        workers: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """SIGTERM while the fifth of twelve requests streams (closed loop, two in flight): what
    completed is written, marked partial with the twelve planned, exit 143, a line saying so;
    the process's SIGTERM handler is the default again after the run."""
    async def answer(request: web.Request, body: dict, n: int) -> web.StreamResponse:
        if n == 4:
            os.kill(os.getpid(), signal.SIGTERM)
        if n >= 4:
            return await stream(request, tokens(50), gap=0.05)
        return await stream(request, tokens(3))

    before = signal.getsignal(signal.SIGTERM)
    out = tmp_path / "r.parquet"
    with FakeServer(answer) as server:
        status = main(["loadgen", str(workload(tmp_path / "w.jsonl", 12)), "--url", server.url,
                       "--max-concurrency", "2", "--workers", workers, "--out", str(out)])
    assert status == 143
    frame, _, run = read_result(out)
    assert 3 <= len(frame) <= 4 and (frame["error"] == "").all()
    assert run["partial"] is True and run["requests_planned"] == 12
    assert "partial" in capsys.readouterr().err
    assert signal.getsignal(signal.SIGTERM) is before
