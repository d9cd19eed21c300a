"""The client's metrics against a server of known timings, and Ctrl-C (SIGINT) mid-run: what
completed is written as a partial result, not lost."""

from __future__ import annotations

import os
import signal
from pathlib import Path

import numpy as np
import pytest
from _fake_server import FakeServer, stream, tokens, workload
from aiohttp import web

from replay.cli.main import main
from replay.loadgen.result import read_result


def test_ttft_itl_and_tpot_match_a_server_of_known_timings(tmp_path: Path) -> None:
    """First token 50 ms after the request, one every 10 ms after it: TTFT ~ 50 ms, every
    inter-token gap and TPOT ~ 10 ms, e2e ~ 50 + 7 * 10 ms (tolerances for a busy 2-core box)."""
    async def answer(request: web.Request, body: dict, n: int) -> web.StreamResponse:
        return await stream(request, tokens(8), first_delay=0.05, gap=0.01)

    out = tmp_path / "r.parquet"
    with FakeServer(answer) as server:
        assert main(["loadgen", str(workload(tmp_path / "w.jsonl", 3, max_tokens=8)),
                     "--url", server.url, "--max-concurrency", "1", "--out", str(out)]) == 0
    frame, summary, _ = read_result(out)
    assert frame["ttft_s"].between(0.048, 0.075).all(), frame["ttft_s"].tolist()
    gaps = np.concatenate([np.asarray(g) for g in frame["itl_s"]])
    assert len(gaps) == 3 * 7
    assert 0.009 <= float(np.median(gaps)) <= 0.015, gaps
    assert frame["tpot_s"].between(0.009, 0.016).all(), frame["tpot_s"].tolist()
    assert frame["e2e_s"].between(0.118, 0.16).all(), frame["e2e_s"].tolist()
    assert summary["ttft_mean_s"] == pytest.approx(frame["ttft_s"].mean())


def test_ctrl_c_writes_what_completed_as_a_partial_result(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """SIGINT while the third of five requests streams (one in flight at a time): the two
    completed are written, the run marked partial with how many were planned, exit 130 and a
    line saying so (was: KeyboardInterrupt, "interrupted", nothing written)."""
    async def answer(request: web.Request, body: dict, n: int) -> web.StreamResponse:
        if n == 2:
            os.kill(os.getpid(), signal.SIGINT)
            return await stream(request, tokens(50), gap=0.05)
        return await stream(request, tokens(3))

    out = tmp_path / "r.parquet"
    with FakeServer(answer) as server:
        status = main(["loadgen", str(workload(tmp_path / "w.jsonl", 5)), "--url", server.url,
                       "--max-concurrency", "1", "--out", str(out)])
        assert server.count == 3
    assert status == 130
    frame, summary, run = read_result(out)
    assert frame["index"].tolist() == [0, 1] and (frame["error"] == "").all()
    assert run["partial"] is True and run["requests_planned"] == 5
    assert summary["requests"] == 2
    captured = capsys.readouterr()
    assert "interrupted" in captured.err and "partial" in captured.err
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler


def test_ctrl_c_with_client_processes_keeps_what_each_measured(tmp_path: Path) -> None:
    """The same over two client processes (``--workers 2``, which ignore SIGINT): the parent
    tells each to stop and writes what they completed, marked partial (was: the parent's
    KeyboardInterrupt, every worker's measurements lost)."""
    async def answer(request: web.Request, body: dict, n: int) -> web.StreamResponse:
        if n == 4:
            os.kill(os.getpid(), signal.SIGINT)
        if n >= 4:
            return await stream(request, tokens(50), gap=0.05)
        return await stream(request, tokens(3))

    out = tmp_path / "r.parquet"
    with FakeServer(answer) as server:
        status = main(["loadgen", str(workload(tmp_path / "w.jsonl", 12)), "--url", server.url,
                       "--max-concurrency", "2", "--workers", "2", "--out", str(out)])
    assert status == 130
    frame, _, run = read_result(out)
    # Five started, one in flight per worker when the fifth came: three or four completed.
    assert 3 <= len(frame) <= 4 and (frame["error"] == "").all()
    assert run["partial"] is True and run["requests_planned"] == 12
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler
