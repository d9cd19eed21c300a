"""``replayllm serve`` under load: a soak on CPU, and the server-overhead measurements on a GPU.

``soak`` (default; CPU, the tiny model): N requests (5,000) through a server recording a trace,
``--concurrency`` in flight; the server's RSS (its process and its engine process) is sampled as
requests complete, and its growth after the first thousand is reported against
``--rss-bound-mb``; afterwards every request must
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
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from benchmarks.serve_server import (
    ROOT,
    RawProbe,
    Server,
    frontend_ttft,
    probe_prompt,
    scaled_step_times,
)


# --- soak ---------------------------------------------------------------------------------------
def soak(requests: int, concurrency: int, rss_bound_mb: float, settings: list[str]) -> dict:
    import asyncio

    import aiohttp

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
    # (requests done, RSS of the server process and of its engine process, MiB)
    samples: list[tuple[int, dict[str, float]]] = [(0, server.rss_mb())]
    errors = 0
    began = time.perf_counter()

    async def run() -> None:
        nonlocal errors
        done = 0
        clock = monotonic_clock(time.perf_counter())
        queue = iter(range(requests))
        connector = aiohttp.TCPConnector(limit=concurrency)
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=600),
                                         connector=connector) as client:
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
                        rss = samples[-1][1]
                        print(f"  {done} requests, server RSS {sum(rss.values()):.1f} MiB "
                              f"(frontend {rss['frontend']:.1f}, engine "
                              f"{rss['children']:.1f})", flush=True)

            await asyncio.gather(*(worker() for _ in range(concurrency)))

    asyncio.run(run())
    wall = time.perf_counter() - began
    samples.append((requests, server.rss_mb()))
    status = server.stop()
    trace = read_trace(trace_dir)
    recorded = trace.table("request_added").num_rows
    finished = trace.table("request_finished").num_rows
    verified = verify(trace_dir)
    later = [rss for n, rss in samples if n >= 1000]
    after_first = [sum(rss.values()) for rss in later]
    growth = max(after_first) - after_first[0] if after_first else float("nan")
    parts_growth = {part: round(max(rss[part] for rss in later) - later[0][part], 1)
                    for part in later[0]} if later else {}
    return {
        "requests": requests, "concurrency": concurrency, "wall_s": round(wall, 1),
        "requests_per_s": round(requests / wall, 1), "errors": errors,
        "rss_mb_at_1000": round(after_first[0], 1) if after_first else None,
        "rss_mb_max_after_1000": round(max(after_first), 1) if after_first else None,
        "rss_growth_after_1000_mb": round(growth, 1), "rss_bound_mb": rss_bound_mb,
        "rss_growth_after_1000_by_process_mb": parts_growth,
        "rss_within_bound": bool(growth <= rss_bound_mb),
        "rss_samples": [(n, {k: round(v, 1) for k, v in r.items()}) for n, r in samples],
        "recorded_requests": recorded, "finished_requests": finished,
        "nothing_lost": recorded == requests == finished and errors == 0,
        "trace_complete": bool(trace.complete), "exit_status": status,
        "verify": verified.report(), "verified": bool(verified.identical),
        "trace_dir": str(trace_dir),
    }


# --- gpu and its CPU proxy --------------------------------------------------------------------
WARM_REQUESTS = 32
# A streamed request silent this long fails the run (and the server is asked for its state)
# instead of hanging it.
STALL_TIMEOUT_S = 60.0


def _load(server: Server, requests: list, label: str, **kwargs: Any) -> tuple[list, float]:
    """``run_load`` against ``server``; where requests failed, the server (and its engine
    process) log their view of the pipe and their stacks (SIGUSR1) before the run goes on."""
    from replay.loadgen.runner import run_load

    print(f"[{time.strftime('%H:%M:%S')}] {label}: {len(requests)} requests", flush=True)
    measured, wall = run_load(requests, server.url, use_tqdm=False,
                              stall_timeout_s=STALL_TIMEOUT_S, **kwargs)
    failed = [m for m in measured if m is not None and m.error]
    print(f"[{time.strftime('%H:%M:%S')}] {label}: {wall:.1f} s, {len(failed)} failed"
          + (f" (first: {failed[0].error})" if failed else ""), flush=True)
    if failed and server.proc.poll() is None:
        server.proc.send_signal(signal.SIGUSR1)
        time.sleep(3.0)
    return measured, wall


def poisson_workload(workload: list, rate: float, count: int) -> list:
    """``count`` requests of ``workload`` (cycled) at Poisson arrivals of ``rate`` per second."""
    import numpy as np

    from replay.workloads.request import Request

    rng = np.random.default_rng(0)
    gaps = rng.exponential(1.0 / rate, size=count)
    arrivals = np.cumsum(gaps) - gaps[0]
    cycled = (workload * (count // len(workload) + 1))[:count]
    return [Request(r.prompt, r.max_tokens, r.temperature, r.ignore_eos, float(t))
            for r, t in zip(cycled, arrivals)]


def server_runs(make_server: Any, workload: list, offline_tok_s: float, mean_tokens: float,
                load: float, poisson_requests: int, workers: int) -> dict[str, Any]:
    """The two server measurements against one engine kind (``make_server(trace_dir)``):
    ``all_at_once`` (the workload at t=0, streamed, after a warm-up run; client throughput
    over ``offline_tok_s``) and ``poisson`` (``load`` of the offline request rate: client p50
    TTFT against the trace's own p50 TTFT), with each server's CPU seconds per 1,000 tokens
    (frontend process, engine process)."""
    import numpy as np

    from replay.loadgen.result import requests_frame, summarize
    from replay.metrics import compute
    from replay.recorded import from_trace
    from tracing import read_trace

    workdir = Path(tempfile.mkdtemp(prefix="serve-bench-"))
    out: dict[str, Any] = {}
    server = make_server(workdir / "all-at-once")
    try:
        _load(server, workload, "all at once, warm-up", workers=workers)
        before = server.cpu_s()
        measured, wall = _load(server, workload, "all at once", workers=workers)
        after = server.cpu_s()
    finally:
        server.stop()
    summary = summarize(requests_frame(measured), wall)
    out["all_at_once"] = {
        "client_tok_s": round(summary["throughput_tok_s"], 1),
        "ratio_to_offline": round(summary["throughput_tok_s"] / offline_tok_s, 3),
        "target_ratio": 0.9, "errors": summary["errors"],
        "client_ttft_p50_ms": round(1e3 * summary["ttft_p50_s"], 2),
        **_cpu_per_ktok(before, after, summary["completion_tokens"]),
    }
    rate = load * offline_tok_s / mean_tokens  # requests per second
    trace_dir = workdir / "poisson"
    server = make_server(trace_dir)
    try:
        _load(server, workload[:WARM_REQUESTS], "poisson, warm-up (recorded)")
        before, ttft_before = server.cpu_s(), frontend_ttft(server)
        probe = RawProbe(server.url, probe_prompt(workload))
        measured, wall = _load(server, poisson_workload(workload, rate, poisson_requests),
                               f"poisson at {rate:.1f} req/s", workers=workers)
        raw = probe.stop()
        after, ttft_after = server.cpu_s(), frontend_ttft(server)
    finally:
        server.stop()
    frame = requests_frame(measured)
    client = summarize(frame, wall)
    recorded = compute(from_trace(read_trace(trace_dir))).requests
    probed = recorded["prompt_len"] == len(probe.prompt)
    raw.update(probe.added(recorded[probed].sort_values("arrival_s")["ttft_s"].to_numpy()))
    recorded = recorded[~probed]  # the load's
    # The Poisson run's requests, in arrival order; the client's in send order.
    server_ttft = recorded.sort_values("arrival_s")["ttft_s"].to_numpy(dtype=float)
    server_ttft = server_ttft[min(WARM_REQUESTS, len(workload)):]
    client_ttft = frame.sort_values("sent_s")["ttft_s"].to_numpy(dtype=float)
    server_p50 = float(np.nanpercentile(server_ttft, 50))
    frontend_count = ttft_after[1] - ttft_before[1]
    frontend_mean = (ttft_after[0] - ttft_before[0]) / frontend_count if frontend_count else None
    paired = (client_ttft - server_ttft) if len(client_ttft) == len(server_ttft) else None
    out["poisson"] = {
        "load": load, "rate_req_s": round(rate, 2), "requests": poisson_requests,
        "client_ttft_p50_ms": round(1e3 * client["ttft_p50_s"], 2),
        "trace_ttft_p50_ms": round(1e3 * server_p50, 2),
        "added_ms": round(1e3 * (client["ttft_p50_s"] - server_p50), 2), "target_ms": 5.0,
        "added_per_request_p50_ms": (round(1e3 * float(np.nanpercentile(paired, 50)), 2)
                                     if paired is not None else None),
        "added_per_request_p90_ms": (round(1e3 * float(np.nanpercentile(paired, 90)), 2)
                                     if paired is not None else None),
        "send_lag_p50_ms": round(1e3 * float(frame["send_lag_s"].median()), 2),
        # Where the added time goes, in means: the trace's TTFT, the frontend's (route entry
        # to its first token: + HTTP intake and the pipe back), the client's (+ the SSE path).
        "ttft_mean_ms": {"trace": round(1e3 * float(np.nanmean(server_ttft)), 2),
                         "frontend": (round(1e3 * frontend_mean, 2)
                                      if frontend_mean is not None else None),
                         "client": round(1e3 * client["ttft_mean_s"], 2)},
        "raw_socket_probe": raw,  # its requests are in the frontend's histogram too
        "client_tok_s": round(client["throughput_tok_s"], 1), "errors": client["errors"],
        **_cpu_per_ktok(before, after, client["completion_tokens"]),
    }
    return out


def _cpu_per_ktok(before: dict[str, float], after: dict[str, float],
                  tokens: float) -> dict[str, float]:
    k = max(tokens, 1.0) / 1000
    return {"frontend_cpu_s_per_ktok": round((after["frontend"] - before["frontend"]) / k, 4),
            "engine_proc_cpu_s_per_ktok": round((after["children"] - before["children"]) / k,
                                                4)}


def gpu(model: str | None, load: float, settings: list[str], poisson_requests: int,
        num_requests: int | None = None, engines: tuple[str, ...] = ("process", "thread"),
        workers: int = 4) -> dict:
    """The offline engine, then ``server_runs`` for each engine kind in ``engines``."""
    from benchmarks.engine import PRESET, ensure_model
    from engine import LLM
    from engine.config import parse_overrides
    from replay.workloads.builtin import reference_workload

    model_dir = str(ensure_model(Path(model or ROOT / "out" / "models" / PRESET)))
    workload = reference_workload()[:num_requests]  # all 256 unless a smoke run asks fewer
    prompts = [list(r.prompt) for r in workload]
    params = [r.sampling_params() for r in workload]
    # 1. the offline engine, warm (its start-up compiled everything; one untimed run first)
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
    out: dict[str, Any] = {"model": model_dir, "settings": dict(s.split("=", 1) for s in settings),
                           "offline_tok_s": round(offline_tok_s, 1), "offline_s": offline_s,
                           "client_workers": workers}
    for engine in engines:
        out[engine] = server_runs(lambda d, e=engine: Server(d, model_dir, settings, e),
                                  workload, offline_tok_s, tokens / len(workload), load,
                                  poisson_requests, workers)
    _ratios(out, engines)
    return out


def proxy(step_trace: str, load: float, settings: list[str], poisson_requests: int,
          num_requests: int | None, engines: tuple[str, ...], workers: int,
          slowdown: float) -> dict:
    """``gpu``'s measurements on a CPU: the real engine core, scheduler and recorder over an
    executor taking the step times fitted to ``step_trace`` (times ``slowdown``), offline and
    behind the server; see ``engine.server.proxy``."""
    from engine.config import parse_overrides
    from engine.server.proxy import ProxyEngine
    from replay.workloads.builtin import reference_workload

    times = scaled_step_times(step_trace, slowdown)
    workload = reference_workload()[:num_requests]
    engine = ProxyEngine(times, None, **parse_overrides(settings))
    core = engine.core
    cpu_began, began = time.process_time(), time.perf_counter()
    for r in workload:
        core.add_request(list(r.prompt), r.sampling_params(), arrival_s=0.0)
    core.run_until_idle()
    offline_s, offline_cpu = time.perf_counter() - began, time.process_time() - cpu_began
    tokens = core.num_completion_tokens
    engine.close()
    offline_tok_s = tokens / offline_s
    out: dict[str, Any] = {
        "proxy": {"step_trace": step_trace, "slowdown": slowdown, **times.__dict__},
        "offline_tok_s": round(offline_tok_s, 1), "offline_s": round(offline_s, 3),
        "offline_cpu_s_per_ktok": round(offline_cpu / (tokens / 1000), 4),
        "client_workers": workers}
    proxy_settings = [f"{k}={v}" for k, v in parse_overrides(settings).items()]
    for kind in engines:
        out[kind] = server_runs(
            lambda d, e=kind: Server(d, None, proxy_settings, e, step_trace, slowdown),
            workload, offline_tok_s, tokens / len(workload), load, poisson_requests, workers)
    _ratios(out, engines)
    return out


def _ratios(out: dict[str, Any], engines: tuple[str, ...]) -> None:
    if "process" in engines and "thread" in engines:
        out["process_over_thread_all_at_once"] = round(
            out["process"]["all_at_once"]["client_tok_s"]
            / max(out["thread"]["all_at_once"]["client_tok_s"], 1e-9), 3)


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
    argv = sys.argv[1:] if argv is None else argv
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("mode", nargs="?", choices=["soak", "gpu", "proxy"], default="soak")
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
    parser.add_argument("--engines", default="process,thread",
                        help="gpu/proxy: the server's engine kinds to measure (process, thread)")
    parser.add_argument("--client-workers", type=int, default=8,
                        help="gpu/proxy: loadgen client processes")
    parser.add_argument("--step-trace", default=str(ROOT / "traces" / "h200-reference-s4"),
                        help="proxy: the GPU trace whose step times the proxy takes")
    parser.add_argument("--slowdown", type=float, default=1.0,
                        help="proxy: multiply the fitted step times (a CPU too small to "
                        "keep up with the GPU's token rate)")
    parser.add_argument("--set", dest="settings", action="append", default=[],
                        metavar="KEY=VALUE", help="a Config field for the engine(s)")
    parser.add_argument("--json", default=None, help="also write the results here")
    args = parser.parse_args(argv)
    engines = tuple(e for e in args.engines.split(",") if e)
    if args.mode == "soak":
        result = soak(args.requests, args.concurrency, args.rss_bound_mb, args.settings)
    elif args.mode == "gpu":
        result = gpu(args.model, args.load, args.settings, args.poisson_requests,
                     args.num_requests, engines, args.client_workers)
    else:
        result = proxy(args.step_trace, args.load, args.settings, args.poisson_requests,
                       args.num_requests, engines, args.client_workers, args.slowdown)
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
