"""``replayllm serve``'s start-up against what is already there: a port another process holds,
and a complete trace in ``--trace-dir``.

Before: a taken port was found by uvicorn only after the model had loaded and ``serve`` had
printed that it was serving there; it exited 3 with uvicorn's log line and left an empty
complete trace behind, which the next ``serve`` of that directory refused with "pass --force",
an option ``serve`` did not have (argparse: unrecognized arguments)."""

from __future__ import annotations

import socket
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("fastapi")

from server_process import ServerProcess, free_port  # noqa: E402

from tracing import read_trace  # noqa: E402

ROOT = Path(__file__).resolve().parents[3]


def _serve(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "replay.cli.main", "serve",
                           "--set", "calibration_repeats=0", *args], cwd=ROOT,
                          capture_output=True, text=True, timeout=180)


def test_a_taken_port_is_one_line_before_the_model_loads(tmp_path: Path) -> None:
    """Another socket listens on the port: exit 2, one line naming the address and why, no
    "serving on" line, no model loaded (no start-up progress) and no trace directory made."""
    port = free_port()
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", port))
        holder.listen()
        done = _serve("--port", str(port), "--trace-dir", str(tmp_path / "t"))
    assert done.returncode == 2, done.stderr
    assert done.stderr.strip() == (f"replayllm serve: error: cannot listen on 127.0.0.1:{port}: "
                                   "Address already in use (--host, --port)")
    assert "start-up" not in done.stdout + done.stderr and " on http://" not in done.stdout
    assert not (tmp_path / "t").exists()


def test_force_replaces_a_trace_an_earlier_serve_recorded(tmp_path: Path) -> None:
    """A served trace is complete once the server stops; serving into it again is refused with
    one line asking for ``--force``, and ``serve --force`` takes it (the new run's trace, 0
    requests after one had been served)."""
    import httpx

    trace = tmp_path / "t"
    server = ServerProcess(trace)
    try:
        answer = httpx.post(server.url + "/v1/completions", timeout=60,
                            json={"prompt": "hi", "max_tokens": 2})
        assert answer.status_code == 200
    finally:
        assert server.stop() == 0
    assert len(read_trace(trace).df("request_added")) == 1

    refused = _serve("--port", str(free_port()), "--trace-dir", str(trace))
    assert refused.returncode == 2 and "--force" in refused.stderr
    assert len(refused.stderr.strip().splitlines()) == 1

    again = ServerProcess(trace, "--force")
    assert again.stop() == 0
    assert len(read_trace(trace).df("request_added")) == 0
