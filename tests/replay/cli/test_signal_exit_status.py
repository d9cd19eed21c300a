"""Every long-running command a signal stops ends, after its cleanup, with that signal's exit
status (``replay.cli.interrupt.exit_status``: 130 for Ctrl-C, 143 for SIGTERM), as ``run`` and
``workload`` did. ``replayllm loadgen`` exited 130 on SIGTERM too, so a job scheduler's stop
read as a Ctrl-C. (``serve``'s graceful stop exits 0: tests/engine/server/test_lifecycle.py.)"""

from __future__ import annotations

import os
import signal
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "loadgen"))

from _fake_server import FakeServer, stream, tokens, workload  # noqa: E402
from aiohttp import web  # noqa: E402

from replay.cli.interrupt import RunInterrupted, exit_status  # noqa: E402
from replay.cli.main import main  # noqa: E402
from replay.loadgen.result import read_result  # noqa: E402


def test_the_rule_is_128_plus_the_signal() -> None:
    """One rule: Ctrl-C 130, SIGTERM 143; ``run`` and ``profile`` take theirs from it."""
    assert exit_status(signal.SIGINT) == 130 and exit_status(signal.SIGTERM) == 143
    assert RunInterrupted(signal.SIGTERM).exit_status == 143


@pytest.mark.parametrize("workers", ["1", "2"])
@pytest.mark.parametrize("signum, status", [(signal.SIGTERM, 143), (signal.SIGINT, 130)],
                         ids=["SIGTERM", "SIGINT"])
def test_loadgen_exits_with_the_status_of_the_signal_that_stopped_it(
        workers: str, signum: int, status: int, tmp_path: Path,
        capsys: pytest.CaptureFixture[str]) -> None:
    """SIGTERM while the fifth of twelve requests streams: the partial result written as on
    Ctrl-C, exit 143 (was 130, Ctrl-C's); Ctrl-C still 130. One client process and two (whose
    parent takes the signal and tells them to stop)."""
    async def answer(request: web.Request, body: dict, n: int) -> web.StreamResponse:
        if n == 4:
            os.kill(os.getpid(), signum)
        if n >= 4:
            return await stream(request, tokens(50), gap=0.05)
        return await stream(request, tokens(3))

    out = tmp_path / "r.parquet"
    with FakeServer(answer) as server:
        code = main(["loadgen", str(workload(tmp_path / "w.jsonl", 12)), "--url", server.url,
                     "--max-concurrency", "2", "--workers", workers, "--out", str(out)])
    assert code == status, capsys.readouterr().err
    _, _, run = read_result(out)
    assert run["partial"] is True
    assert "partial" in capsys.readouterr().err


def test_loadgen_stopped_before_any_answer_exits_with_the_signals_status(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """SIGTERM before any request completed: nothing written, exit 143 (was 130)."""
    async def answer(request: web.Request, body: dict, n: int) -> web.StreamResponse:
        if n == 0:
            os.kill(os.getpid(), signal.SIGTERM)
        return await stream(request, tokens(50), gap=0.05)

    out = tmp_path / "r.parquet"
    with FakeServer(answer) as server:
        code = main(["loadgen", str(workload(tmp_path / "w.jsonl", 3)), "--url", server.url,
                     "--max-concurrency", "1", "--out", str(out)])
    assert code == 143
    assert not out.exists()
    assert "nothing written" in capsys.readouterr().err
