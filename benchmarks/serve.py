"""``replayllm serve`` under load: a soak on CPU, and the server-overhead measurements on a GPU.

``soak`` (default; CPU, the tiny model): N requests (5,000) through a server recording a trace,
``--concurrency`` in flight; the server's RSS is sampled as requests complete, and its growth
after the first thousand is reported against ``--rss-bound-mb``; afterwards every request must
be in the trace (none lost) and the trace must verify.

``gpu`` (the ``qwen3-0.6b`` preset on one GPU; the issue's two targets, in one call):
1. the offline engine on the reference workload (after a warm-up), then a server on the same
   model: ``loadgen`` sends the whole reference workload at once, streaming; its throughput
   (client-measured) over the offline one (target >= 0.9);
2. a Poisson arrival rate loading the engine to ``--load`` (0.7) of the offline throughput:
   client-measured p50 TTFT against the server trace's own p50 TTFT (target: < 5 ms added).

    .venv/bin/python -m benchmarks.serve soak [--requests 5000] [--json out.json]
    .venv/bin/python -m benchmarks.serve gpu [--model DIR] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import os
import random
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
START_TIMEOUT_S = 600.0


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


class Server:
    """A ``replayllm serve`` subprocess recording to ``trace_dir``."""

    def __init__(self, trace_dir: Path, model: str | None, settings: list[str]) -> None:
        import httpx

        self.port = _free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        args = [sys.executable, "-m", "replay.cli.main", "serve", "--port", str(self.port),
                "--trace-dir", str(trace_dir)]
        if model is not None:
            args += ["--model", model]
        for setting in settings:
            args += ["--set", setting]
        self.proc = subprocess.Popen(args, cwd=ROOT)
        deadline = time.monotonic() + START_TIMEOUT_S
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"the server exited with {self.proc.returncode}")
            try:
                if httpx.get(self.url + "/health", timeout=1).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            time.sleep(0.5)
        self.stop()
        raise RuntimeError("the server did not start")

    def rss_mb(self) -> float:
        """Resident set size of the server process (Linux /proc), MiB."""
        with open(f"/proc/{self.proc.pid}/status") as status:
            for line in status:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) / 1024
        return float("nan")

    def stop(self) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        return self.proc.wait(120)


# --- soak ---------------------------------------------------------------------------------------
def soak(requests: int, concurrency: int, rss_bound_mb: float, settings: list[str]) -> dict:
    import asyncio

    import httpx

    from replay.loadgen.client import Measured, monotonic_clock, request_body, send
    from replay.verify import verify
    from replay.workloads.request import Request
    from tracing import read_trace

    rng = random.Random(0)
    workload = [Request([rng.randrange(10000) for _ in range(rng.randint(16, 64))],
                        max_tokens=rng.randint(4, 12), temperature=0.0, ignore_eos=True)
                for _ in range(requests)]
    trace_dir = Path(tempfile.mkdtemp(prefix="soak-")) / "trace"
    server = Server(trace_dir, None, ["calibration_repeats=0", *settings])
    samples: list[tuple[int, float]] = [(0, server.rss_mb())]
    errors = 0
    began = time.perf_counter()

    async def run() -> None:
        nonlocal errors
        done = 0
        clock = monotonic_clock(time.perf_counter())
        queue = iter(range(requests))
        limits = httpx.Limits(max_connections=concurrency)
        async with httpx.AsyncClient(timeout=600, limits=limits) as client:
            async def worker() -> None:
                nonlocal done, errors
                for i in queue:
                    out = await send(client, server.url + "/v1/completions",
                                     request_body(workload[i], None),
                                     Measured(i, 0, workload[i].max_tokens, 0.0), clock)
                    errors += bool(out.error)
                    done += 1
                    if done % 250 == 0:
                        samples.append((done, server.rss_mb()))
                        print(f"  {done} requests, server RSS {samples[-1][1]:.1f} MiB",
                              flush=True)

            await asyncio.gather(*(worker() for _ in range(concurrency)))

    asyncio.run(run())
    wall = time.perf_counter() - began
    samples.append((requests, server.rss_mb()))
    status = server.stop()
    trace = read_trace(trace_dir)
    recorded = trace.table("request_added").num_rows
    finished = trace.table("request_finished").num_rows
    verified = verify(trace_dir)
    after_first = [rss for n, rss in samples if n >= 1000]
    growth = max(after_first) - after_first[0] if after_first else float("nan")
    return {
        "requests": requests, "concurrency": concurrency, "wall_s": round(wall, 1),
        "requests_per_s": round(requests / wall, 1), "errors": errors,
        "rss_mb_at_1000": round(after_first[0], 1) if after_first else None,
        "rss_mb_max_after_1000": round(max(after_first), 1) if after_first else None,
        "rss_growth_after_1000_mb": round(growth, 1), "rss_bound_mb": rss_bound_mb,
        "rss_within_bound": bool(growth <= rss_bound_mb),
        "rss_samples": [(n, round(r, 1)) for n, r in samples],
        "recorded_requests": recorded, "finished_requests": finished,
        "nothing_lost": recorded == requests == finished and errors == 0,
        "trace_complete": bool(trace.complete), "exit_status": status,
        "verify": verified.report(), "verified": bool(verified.identical),
        "trace_dir": str(trace_dir),
    }


# --- gpu ----------------------------------------------------------------------------------------
def gpu(model: str | None, load: float, settings: list[str], poisson_requests: int,
        num_requests: int | None = None) -> dict:
    import numpy as np

    from benchmarks.engine import PRESET, ensure_model
    from engine import LLM
    from replay.loadgen.result import requests_frame, summarize
    from replay.loadgen.runner import run_load
    from replay.metrics import compute
    from replay.recorded import from_trace
    from replay.workloads.builtin import reference_workload
    from replay.workloads.request import Request
    from tracing import read_trace

    model_dir = str(ensure_model(Path(model or ROOT / "out" / "models" / PRESET)))
    overrides = dict(s.split("=", 1) for s in settings)
    workload = reference_workload()[:num_requests]  # all 256 unless a smoke run asks fewer
    prompts = [list(r.prompt) for r in workload]
    params = [r.sampling_params() for r in workload]
    # 1. the offline engine, warm (its start-up compiled everything; one untimed run first)
    from engine.config import parse_overrides

    llm = LLM(model_dir, record_events=False, **parse_overrides(settings))
    llm.generate(prompts, params, use_tqdm=False)
    began = time.perf_counter()
    outputs = llm.generate(prompts, params, use_tqdm=False)
    offline_s = time.perf_counter() - began
    llm.close()
    del llm
    _free_gpu()
    tokens = sum(len(o["token_ids"]) for o in outputs)
    offline_tok_s = tokens / offline_s
    out: dict[str, Any] = {"model": model_dir, "settings": overrides,
                           "offline_tok_s": round(offline_tok_s, 1), "offline_s": offline_s}

    workdir = Path(tempfile.mkdtemp(prefix="serve-gpu-"))
    server = Server(workdir / "all-at-once", model_dir, settings)
    try:
        run_load(workload, server.url, use_tqdm=False)  # warm-up: the server's first steps
        measured, wall = run_load(workload, server.url, use_tqdm=False)
    finally:
        server.stop()
    summary = summarize(requests_frame(measured), wall)
    out["all_at_once"] = {"client_tok_s": round(summary["throughput_tok_s"], 1),
                          "ratio_to_offline": round(summary["throughput_tok_s"]
                                                    / offline_tok_s, 3),
                          "errors": summary["errors"], "target_ratio": 0.9}

    # 2. Poisson arrivals at ``load`` of the offline request rate
    mean_tokens = tokens / len(workload)
    rate = load * offline_tok_s / mean_tokens  # requests per second
    rng = np.random.default_rng(0)
    gaps = rng.exponential(1.0 / rate, size=poisson_requests)
    arrivals = np.cumsum(gaps) - gaps[0]
    poisson = [Request(r.prompt, r.max_tokens, r.temperature, r.ignore_eos, float(t))
               for r, t in zip((workload * (poisson_requests // len(workload) + 1))
                               [:poisson_requests], arrivals)]
    trace_dir = workdir / "poisson"
    server = Server(trace_dir, model_dir, settings)
    try:
        run_load(workload[:32], server.url, use_tqdm=False)  # warm-up, recorded too
        measured, wall = run_load(poisson, server.url, use_tqdm=False)
    finally:
        server.stop()
    frame = requests_frame(measured)
    client = summarize(frame, wall)
    recorded = compute(from_trace(read_trace(trace_dir)))
    warm = min(32, len(workload))
    per_request = recorded.requests.iloc[warm:]  # the Poisson run's requests, in order
    server_p50 = float(np.nanpercentile(per_request["ttft_s"].to_numpy(dtype=float), 50))
    out["poisson"] = {
        "load": load, "rate_req_s": round(rate, 2), "requests": poisson_requests,
        "client_ttft_p50_ms": round(1e3 * client["ttft_p50_s"], 2),
        "trace_ttft_p50_ms": round(1e3 * server_p50, 2),
        "added_ms": round(1e3 * (client["ttft_p50_s"] - server_p50), 2), "target_ms": 5.0,
        "client_tok_s": round(client["throughput_tok_s"], 1), "errors": client["errors"],
    }
    return out


def _free_gpu() -> None:
    import gc

    gc.collect()
    try:
        import torch

        if torch.cuda.is_available():
            torch.cuda.empty_cache()
    except ImportError:
        pass


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("mode", nargs="?", choices=["soak", "gpu"], default="soak")
    parser.add_argument("--requests", type=int, default=5000, help="soak: requests to send")
    parser.add_argument("--concurrency", type=int, default=64, help="soak: in flight")
    parser.add_argument("--rss-bound-mb", type=float, default=64.0,
                        help="soak: allowed RSS growth after the first thousand requests")
    parser.add_argument("--model", default=None, help="gpu: checkpoint (default: make the "
                        "qwen3-0.6b preset under out/models)")
    parser.add_argument("--load", type=float, default=0.7, help="gpu: Poisson load fraction")
    parser.add_argument("--poisson-requests", type=int, default=512)
    parser.add_argument("--num-requests", type=int, default=None,
                        help="gpu: only the first N reference requests (a smoke run)")
    parser.add_argument("--set", dest="settings", action="append", default=[],
                        metavar="KEY=VALUE", help="a Config field for the engine(s)")
    parser.add_argument("--json", default=None, help="also write the results here")
    args = parser.parse_args(argv)
    if args.mode == "soak":
        result = soak(args.requests, args.concurrency, args.rss_bound_mb, args.settings)
    else:
        result = gpu(args.model, args.load, args.settings, args.poisson_requests,
                     args.num_requests)
    result["machine"] = {"cpus": os.cpu_count(), "platform": sys.platform}
    text = json.dumps(result, indent=2, default=str)
    print(text)
    if args.json:
        Path(args.json).write_text(text)
    ok = result.get("nothing_lost", True) and result.get("verified", True) and result.get(
        "rss_within_bound", True)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
