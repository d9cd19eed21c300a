"""``replayllm serve --engine process`` against ``--engine thread``: the engine's step time and
what streaming clients see, on the tiny model (CPU).

Each round starts a server in each mode (their order alternating round to round, so a machine
whose load drifts hurts neither mode more), records a trace, and sends ``--requests`` streamed
completions (a random 32-token prompt, ``--max-tokens`` tokens, ``ignore_eos``) from
``--clients`` concurrent clients (a closed loop). Per run:

- engine: the trace's ``model_step`` rows of the loaded part (every step with
  ``--clients``/2 sequences or more): ``duration_s`` (the step itself), the period between step
  ends (the step plus the driver's work between steps: feeding inputs, sending outputs),
  ``outside_s`` (that driver work alone) and ``host_s``;
- clients: TTFT p50/p99, output tokens per second over the run's wall time, failures;
- CPU seconds of the server's processes (frontend, and engine process where there is one).

The medians over the rounds are printed with their spread (min-max); ``--json`` keeps every run.

    .venv/bin/python -m benchmarks.serve_modes [--rounds 3] [--clients 16] [--requests 64]
        [--max-tokens 16] [--modes process,thread] [--set KEY=VALUE] [--json out.json]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

from benchmarks.serve_server import Server

PROMPT_LEN = 32
WARM_REQUESTS = 4
REQUEST_TIMEOUT_S = 600.0


def _workload(count: int, max_tokens: int, seed: int) -> list[Any]:
    from replay.workloads.request import Request

    rng = random.Random(seed)
    return [Request([rng.randrange(10000) for _ in range(PROMPT_LEN)], max_tokens=max_tokens,
                    temperature=0.0, ignore_eos=True) for _ in range(count)]


def _send_all(url: str, workload: list[Any], clients: int) -> tuple[list[Any], float]:
    """Every request of ``workload`` streamed from ``clients`` concurrent clients; the
    measurements and the wall time."""
    import aiohttp

    from replay.loadgen.client import Measured, monotonic_clock, request_body, send

    async def run() -> list[Any]:
        clock = monotonic_clock(time.perf_counter())
        pending = iter(range(len(workload)))
        out: list[Any] = [None] * len(workload)
        timeout = aiohttp.ClientTimeout(total=REQUEST_TIMEOUT_S)
        async with aiohttp.ClientSession(timeout=timeout,
                                         connector=aiohttp.TCPConnector(limit=clients)) as s:
            async def client() -> None:
                for i in pending:
                    request = workload[i]
                    out[i] = await send(s, url + "/v1/completions", request_body(request, None),
                                        Measured(i, PROMPT_LEN, request.max_tokens, 0.0), clock)

            await asyncio.gather(*(client() for _ in range(clients)))
        return out

    began = time.perf_counter()
    measured = asyncio.run(run())
    return measured, time.perf_counter() - began


def _quantile(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def _step_figures(trace_dir: Path, clients: int) -> dict[str, float]:
    """The loaded steps' times from the trace, in milliseconds."""
    from tracing import read_trace

    steps = read_trace(trace_dir).table("model_step").to_pandas()
    loaded = steps[steps["num_seqs"] >= max(1, clients // 2)]
    ends = steps["wall_time_s"].to_numpy()
    period = [float(b - a) * 1e3 for a, b, n in zip(ends, ends[1:], steps["num_seqs"][1:])
              if n >= max(1, clients // 2)]
    return {"steps": int(len(steps)), "loaded_steps": int(len(loaded)),
            "step_ms_p50": float(loaded["duration_s"].median() * 1e3),
            "step_ms_p90": float(loaded["duration_s"].quantile(0.9) * 1e3),
            "period_ms_p50": _quantile(period, 0.5),
            "outside_ms_p50": float(loaded["outside_s"].median() * 1e3),
            "host_ms_p50": float(loaded["host_s"].median() * 1e3)}


def run_once(mode: str, clients: int, requests: int, max_tokens: int, settings: list[str],
             seed: int) -> dict[str, Any]:
    """One server in ``mode`` under the load; its figures."""
    trace_dir = Path(tempfile.mkdtemp(prefix=f"serve-modes-{mode}-")) / "trace"
    log = trace_dir.parent / "server.log"
    server = Server(trace_dir, None, ["calibration_repeats=0", *settings], engine=mode, log=log)
    try:
        _send_all(server.url, _workload(WARM_REQUESTS, 4, seed + 1), WARM_REQUESTS)
        cpu_before = server.cpu_s()
        measured, wall = _send_all(server.url, _workload(requests, max_tokens, seed), clients)
        cpu_after = server.cpu_s()
    finally:
        status = server.stop()
    ok = [m for m in measured if m is not None and not m.error]
    ttft = [(m.first_token_s - m.sent_s) * 1e3 for m in ok]
    tokens = sum(m.completion_tokens for m in ok)
    return {"mode": mode, "exit_status": status, "wall_s": round(wall, 2),
            "failed": len(measured) - len(ok), "ttft_ms_p50": _quantile(ttft, 0.5),
            "ttft_ms_p99": _quantile(ttft, 0.99), "output_tok_s": tokens / wall,
            "cpu_s": {k: round(cpu_after[k] - cpu_before[k], 2) for k in cpu_after},
            **_step_figures(trace_dir, clients)}


SUMMARY_KEYS = ("step_ms_p50", "step_ms_p90", "period_ms_p50", "outside_ms_p50", "host_ms_p50",
                "ttft_ms_p50", "ttft_ms_p99", "output_tok_s", "wall_s", "failed")


def summarize(runs: list[dict[str, Any]]) -> dict[str, dict[str, tuple[float, float, float]]]:
    """Per mode, per figure: (median, min, max) over the rounds."""
    out: dict[str, dict[str, tuple[float, float, float]]] = {}
    for mode in dict.fromkeys(r["mode"] for r in runs):
        mine = [r for r in runs if r["mode"] == mode]
        out[mode] = {key: (statistics.median(r[key] for r in mine),
                           min(r[key] for r in mine), max(r[key] for r in mine))
                     for key in SUMMARY_KEYS}
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--clients", type=int, default=16, help="concurrent streaming clients")
    parser.add_argument("--requests", type=int, default=64, help="requests per run")
    parser.add_argument("--max-tokens", type=int, default=16)
    parser.add_argument("--modes", default="process,thread")
    parser.add_argument("--set", dest="settings", action="append", default=[],
                        metavar="KEY=VALUE", help="a server Config field (repeatable)")
    parser.add_argument("--json", default=None, help="also write every run here")
    args = parser.parse_args(argv)
    modes = args.modes.split(",")
    runs = []
    for round_ in range(args.rounds):
        for mode in modes if round_ % 2 == 0 else modes[::-1]:  # alternate: drift hits both
            run = run_once(mode, args.clients, args.requests, args.max_tokens, args.settings,
                           seed=round_)
            runs.append(run)
            print(json.dumps(run), flush=True)
    print(f"\n{args.clients} clients, {args.requests} requests of {PROMPT_LEN}+{args.max_tokens} "
          f"tokens, {args.rounds} rounds: median [min-max]")
    for mode, figures in summarize(runs).items():
        print(f"{mode}:")
        for key, (median, low, high) in figures.items():
            print(f"  {key:15s} {median:9.2f}  [{low:.2f}-{high:.2f}]")
    if args.json:
        Path(args.json).write_text(json.dumps(runs, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
