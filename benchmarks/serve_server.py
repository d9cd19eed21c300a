"""The server a ``benchmarks.serve`` run measures: a ``replayllm serve`` subprocess (its RSS and
CPU from /proc), its own TTFT histogram from ``/metrics``, and a bare-socket probe client that
times first chunks with no HTTP library of its own. Run as a script (``python -m
benchmarks.serve_server --step-trace TRACE --port P --trace-dir DIR``) it is ``replayllm serve``
over the proxy engine, which ``Server`` starts for the CPU proxy."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
START_TIMEOUT_S = 600.0


def free_port() -> int:
    """A loopback port no socket holds now."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


class Server:
    """A ``replayllm serve`` subprocess on a free loopback port, started and waited for (its
    ``/health``), recording to ``trace_dir`` (None: no trace). The benchmarks' server and the
    tests' (``tests/engine/server/server_process.py``).

    ``model``: its checkpoint (None: the tiny model); ``settings``: ``--set`` values;
    ``engine``: ``--engine`` (None: the server's default); ``proxy_trace``: run the proxy engine
    over that trace's step times, each times ``slowdown`` (this module as a script); ``extra``:
    more arguments; ``log``: a file taking its output (None: it writes to the caller's).
    """

    def __init__(self, trace_dir: Path | None, model: str | None = None,
                 settings: Sequence[str] = (), engine: str | None = "process",
                 proxy_trace: str | None = None, slowdown: float = 1.0,
                 extra: Sequence[str] = (), log: Path | None = None,
                 start_timeout_s: float = START_TIMEOUT_S) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.trace_dir = trace_dir
        if proxy_trace is not None:  # the CPU proxy: this module run as a script
            args = [sys.executable, "-m", "benchmarks.serve_server",
                    "--step-trace", proxy_trace, "--slowdown", str(slowdown)]
        else:
            args = [sys.executable, "-m", "replay.cli.main", "serve"]
        args += ["--port", str(self.port)]
        if trace_dir is not None:
            args += ["--trace-dir", str(trace_dir)]
        if engine is not None:
            args += ["--engine", engine]
        if model is not None:
            args += ["--model", model]
        for setting in settings:
            args += ["--set", setting]
        args += list(extra)
        self.log = open(log, "w+") if log is not None else None  # noqa: SIM115 - kept open
        self.proc = subprocess.Popen(args, cwd=ROOT, stdout=self.log,
                                     stderr=subprocess.STDOUT if self.log else None)
        self._wait_ready(start_timeout_s)

    def _wait_ready(self, timeout_s: float) -> None:
        import httpx

        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"the server exited ({self.proc.returncode}): "
                                   f"{self.output()}")
            try:
                if httpx.get(self.url + "/health", timeout=1.0).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            time.sleep(0.2)
        self.kill()
        raise RuntimeError(f"the server did not start in {timeout_s} s: {self.output()}")

    def output(self) -> str:
        """The end of what the server wrote ("" where it writes to the caller's output)."""
        if self.log is None:
            return ""
        self.log.flush()
        self.log.seek(0)
        return self.log.read()[-4000:]

    def terminate(self, timeout: float = 60.0) -> int:
        """SIGTERM and wait; the exit status."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        return self.proc.wait(timeout)

    def stop(self) -> int:
        """``terminate`` with the time a recording server may need to close its trace."""
        return self.terminate(120)

    def kill(self) -> None:
        """SIGKILL (kill -9) and wait."""
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait(30)

    def rss_mb(self) -> dict[str, float]:
        """Resident set sizes (Linux /proc), MiB: the server process (``frontend``) and its
        children (``children``: the engine process, where it has one)."""
        return {"frontend": _proc_rss_mb(self.proc.pid),
                "children": sum(_proc_rss_mb(c) for c in self._children())}

    def cpu_s(self) -> dict[str, float]:
        """CPU seconds (user + system) so far of the server process and of its children (the
        engine process), from /proc (Linux)."""
        return {"frontend": _proc_cpu_s(self.proc.pid),
                "children": sum(_proc_cpu_s(c) for c in self._children())}

    def _children(self) -> list[int]:
        try:
            with open(f"/proc/{self.proc.pid}/task/{self.proc.pid}/children") as f:
                return [int(c) for c in f.read().split()]
        except OSError:
            return []


def _proc_rss_mb(pid: int) -> float:
    try:
        with open(f"/proc/{pid}/status") as status:
            for line in status:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) / 1024
    except OSError:
        pass
    return 0.0


def _proc_cpu_s(pid: int) -> float:
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def frontend_ttft(server: Server) -> tuple[float, float]:
    """The server's own TTFT histogram so far (``vllm:time_to_first_token_seconds``: route entry
    to the first token in the frontend): its sum and count."""
    import httpx
    from prometheus_client.parser import text_string_to_metric_families

    text = httpx.get(server.url + "/metrics", timeout=30).text
    total = count = 0.0
    for family in text_string_to_metric_families(text):
        if family.name == "vllm:time_to_first_token_seconds":
            for sample in family.samples:
                if sample.name.endswith("_sum"):
                    total += sample.value
                elif sample.name.endswith("_count"):
                    count += sample.value
    return total, count


class RawProbe:
    """A thread sending one streamed request at a time (every ``gap_s``) over a bare socket and
    timing its first chunk with text: the TTFT a client with no HTTP library of its own sees,
    beside ``loadgen``'s under the same load."""

    def __init__(self, url: str, prompt: list[int], gap_s: float = 0.3) -> None:
        import threading

        self.prompt = prompt
        self.host, port = url.split("//", 1)[1].split(":")
        self.port = int(port)
        body = json.dumps({"prompt": prompt, "max_tokens": 8, "temperature": 0.0,
                           "stream": True, "ignore_eos": True}).encode()
        self.request = (f"POST /v1/completions HTTP/1.1\r\nHost: {self.host}\r\n"
                        f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n"
                        "Connection: close\r\n\r\n").encode() + body
        self.gap_s = gap_s
        self.ttfts: list[float] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _one(self) -> float | None:
        with socket.create_connection((self.host, self.port), timeout=30) as sock:
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            began = time.perf_counter()
            sock.sendall(self.request)
            seen, first = b"", None
            while True:
                chunk = sock.recv(65536)
                if not chunk:
                    return first
                seen += chunk
                if first is None and b'"text": "' in seen.replace(b'"text": ""', b""):
                    first = time.perf_counter() - began
                if b"[DONE]" in seen:
                    return first

    def _run(self) -> None:
        while not self._stop.wait(self.gap_s):
            ttft = self._one()
            self.ttfts.append(float("nan") if ttft is None else ttft)

    def stop(self) -> dict[str, Any]:
        import numpy as np

        self._stop.set()
        self._thread.join(60)
        values = np.asarray([t for t in self.ttfts if t == t])  # the ones that got text
        return {"requests": len(values),
                "ttft_mean_ms": round(1e3 * float(values.mean()), 2) if len(values) else None,
                "ttft_p50_ms": (round(1e3 * float(np.median(values)), 2) if len(values)
                                else None)}

    def added(self, recorded_ttft_s: Any) -> dict[str, Any]:
        """The probe's own TTFTs over the trace's for the same requests (``recorded_ttft_s``,
        in arrival order): what the server adds as a bare socket sees it, request by request.
        Empty where a probe request failed (the two lists no longer pair)."""
        import numpy as np

        if len(recorded_ttft_s) != len(self.ttfts) or not self.ttfts:
            return {}
        added = np.asarray(self.ttfts) - np.asarray(recorded_ttft_s, dtype=float)
        return {"added_p50_ms": round(1e3 * float(np.nanmedian(added)), 2),
                "added_mean_ms": round(1e3 * float(np.nanmean(added)), 2)}


def probe_prompt(workload: list) -> list[int]:
    """The raw probe's prompt: the first request's tokens, cut to a length no request of the
    workload has (so the trace tells the probe's requests from the load's)."""
    lengths = {len(r.prompt) for r in workload}
    length = next(n for n in range(16, 1 << 20) if n not in lengths)
    prompt = list(workload[0].prompt)
    return (prompt * (length // len(prompt) + 1))[:length]


def scaled_step_times(step_trace: str, slowdown: float) -> Any:
    """The proxy engine's step times fitted to ``step_trace``, each multiplied by ``slowdown``
    (a CPU too small to keep up with the GPU's token rate)."""
    from dataclasses import replace

    from engine.server.proxy import ProxyStepTimes

    times = ProxyStepTimes.fit(step_trace)
    return replace(times, base_s=times.base_s * slowdown,
                   prefill_token_s=times.prefill_token_s * slowdown,
                   decode_seq_s=times.decode_seq_s * slowdown)


def proxy_server(argv: list[str]) -> int:
    """``replayllm serve`` over the proxy engine (what ``Server`` starts for ``proxy_trace``)."""
    import argparse

    from engine.config import parse_overrides
    from engine.server.run import serve

    parser = argparse.ArgumentParser(prog="python -m benchmarks.serve_server")
    parser.add_argument("--step-trace", required=True)
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--trace-dir", required=True)
    parser.add_argument("--engine", default="process")
    parser.add_argument("--slowdown", type=float, default=1.0)
    parser.add_argument("--set", dest="settings", action="append", default=[])
    args = parser.parse_args(argv)
    serve(None, trace_dir=args.trace_dir, port=args.port,
          overrides=parse_overrides(args.settings), engine_mode=args.engine,
          proxy=scaled_step_times(args.step_trace, args.slowdown))
    return 0


if __name__ == "__main__":
    sys.exit(proxy_server(sys.argv[1:]))
