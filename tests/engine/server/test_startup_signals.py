"""A stop signal while ``replayllm serve`` is still starting (session 32): the server starts,
then stops at once as after a signal while serving (exit 0, the summary line, a complete trace
that verifies). Before, the frontend's handlers went in only once the engine was ready: SIGTERM
during the start-up killed the server (exit 143, no summary; the engine process killed with
it), SIGINT raised ``KeyboardInterrupt`` (exit 130, an incomplete trace, a BrokenPipeError
traceback from the engine process)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

pytest.importorskip("fastapi")

from server_process import free_port  # noqa: E402

from engine.server.run import StopRequest  # noqa: E402
from replay.verify import verify  # noqa: E402
from tracing import read_trace  # noqa: E402

ROOT = Path(__file__).resolve().parents[3]
WAIT_S = 120.0


class _Server:
    should_exit = False


def test_a_signal_before_the_server_exists_stops_it_once_attached() -> None:
    stop = StopRequest()
    stop(signal.SIGTERM, None)
    assert stop.requested
    server = _Server()
    stop.attach(server)
    assert server.should_exit
    later = _Server()
    StopRequest().attach(later)
    assert not later.should_exit


def test_a_second_sigint_while_starting_interrupts_and_one_while_serving_does_not() -> None:
    stop = StopRequest()
    stop(signal.SIGINT, None)
    with pytest.raises(KeyboardInterrupt):
        stop(signal.SIGINT, None)
    serving = StopRequest()
    server = _Server()
    serving.attach(server)
    serving(signal.SIGINT, None)
    serving(signal.SIGINT, None)  # uvicorn's own handler decides about forcing
    assert server.should_exit


def _children(pid: int) -> list[int]:
    try:
        with open(f"/proc/{pid}/task/{pid}/children") as f:
            return [int(c) for c in f.read().split()]
    except OSError:
        return []


def _engine_started(pid: int) -> bool:
    """The engine process exists (multiprocessing's spawned child)."""
    for child in _children(pid):
        try:
            with open(f"/proc/{child}/cmdline", "rb") as f:
                if b"spawn_main" in f.read():
                    return True
        except OSError:
            pass
    return False


def _serve(tmp_path: Path) -> tuple[subprocess.Popen, Path]:
    log = tmp_path / "serve.log"
    args = [sys.executable, "-m", "replay.cli.main", "serve", "--port", str(free_port()),
            "--trace-dir", str(tmp_path / "t"), "--set", "calibration_repeats=0"]
    with open(log, "w") as out:  # the child keeps its own descriptor
        proc = subprocess.Popen(args, cwd=ROOT, stdout=out, stderr=subprocess.STDOUT,
                                start_new_session=True)
    return proc, log


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")
@pytest.mark.parametrize("how", ["SIGTERM", "SIGINT"])
def test_a_stop_signal_while_the_engine_starts_exits_0_with_a_complete_trace(
        tmp_path: Path, how: str) -> None:
    proc, log = _serve(tmp_path)
    try:
        deadline = time.monotonic() + WAIT_S
        while not _engine_started(proc.pid):  # the frontend's part of the start-up is over
            assert proc.poll() is None and time.monotonic() < deadline, log.read_text()
            time.sleep(0.01)
        proc.send_signal(signal.SIGTERM if how == "SIGTERM" else signal.SIGINT)
        status = proc.wait(WAIT_S)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(30)
    output = log.read_text()
    assert status == 0, output
    assert "replayllm serve: a stop signal came while starting: stopping" in output
    assert "replayllm serve: stopped after 0 requests" in output, output
    assert "Traceback" not in output, output
    trace = read_trace(tmp_path / "t")
    assert trace.complete
    assert trace.table("request_added").num_rows == 0
    assert verify(tmp_path / "t").identical
