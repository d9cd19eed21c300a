"""A ``replayllm serve`` subprocess on loopback for tests: started, waited for, stopped."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parents[3]
START_TIMEOUT_S = 120.0


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


class ServerProcess:
    """``python -m replay.cli.main serve`` recording to ``trace_dir`` (tiny model, no start-up
    calibration), on a free loopback port."""

    def __init__(self, trace_dir: Path | None, *extra: str, settings: tuple[str, ...] = ()) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.trace_dir = trace_dir
        args = [sys.executable, "-m", "replay.cli.main", "serve", "--port", str(self.port),
                "--set", "calibration_repeats=0", *extra]
        for setting in settings:
            args += ["--set", setting]
        if trace_dir is not None:
            args += ["--trace-dir", str(trace_dir)]
        self.log = open(Path(os.environ.get("TMPDIR", "/tmp")) / f"serve-{self.port}.log", "w+")
        self.proc = subprocess.Popen(args, cwd=ROOT, stdout=self.log, stderr=subprocess.STDOUT)
        self._wait_ready()

    def _wait_ready(self) -> None:
        deadline = time.monotonic() + START_TIMEOUT_S
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"the server exited ({self.proc.returncode}): {self.output()}")
            try:
                if httpx.get(self.url + "/health", timeout=1.0).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            time.sleep(0.2)
        self.kill()
        raise RuntimeError(f"the server did not start in {START_TIMEOUT_S} s: {self.output()}")

    def output(self) -> str:
        self.log.flush()
        self.log.seek(0)
        return self.log.read()[-4000:]

    def terminate(self, timeout: float = 60.0) -> int:
        """SIGTERM and wait; the exit status."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        return self.proc.wait(timeout)

    def kill(self) -> None:
        """SIGKILL (kill -9) and wait."""
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait(30)
