"""Benchmark the simulator at scale: a Poisson workload of N requests, simulated end to end.

Run: ``python -m benchmarks.simulate_scale --sizes 4096,10000 --mode list``. The workload:
Poisson arrivals at ``RATE`` requests per second, prompts of 128-2,048 random token ids, outputs
of 32-512 tokens (``ignore_eos``), step times fitted on ``traces/h200-reference``, the trace's
Config. Each size runs in a fresh process (peak RSS is that process's own); the figures (wall
seconds, requests per wall-second, peak RSS, the metrics) are printed as JSON lines.

Modes: ``list`` builds the whole workload as ``Request`` objects with Python token lists and
simulates it as ``replayllm whatif --workload FILE`` does (the path before streaming).
"""

from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys
import time
from typing import Any

import numpy as np

TIMING_TRACE = "traces/h200-reference"
RATE = 50.0  # requests per second
SEED = 0
PROMPT_LEN = (128, 2048)
OUTPUT_LEN = (32, 512)
TOKEN_RANGE = 10000
CHUNK = 8192  # requests generated per chunk (the draws do not depend on it)


def poisson_chunks(num_requests: int, rate: float = RATE, seed: int = SEED):
    """The workload in chunks of arrays: (arrival_s, prompt_len, max_tokens, token ids flat).

    Drawn chunk by chunk from one generator, so the first k requests of a larger workload are
    the k requests of a smaller one."""
    rng = np.random.default_rng(seed)
    clock = 0.0
    for start in range(0, num_requests, CHUNK):
        n = min(CHUNK, num_requests - start)
        gaps = rng.exponential(1.0 / rate, n)
        arrival = clock + np.cumsum(gaps)
        clock = float(arrival[-1])
        prompt_len = rng.integers(PROMPT_LEN[0], PROMPT_LEN[1] + 1, n)
        max_tokens = rng.integers(OUTPUT_LEN[0], OUTPUT_LEN[1] + 1, n)
        tokens = rng.integers(0, TOKEN_RANGE, int(prompt_len.sum()), dtype=np.int32)
        yield arrival, prompt_len, max_tokens, tokens


def _requests_as_list(num_requests: int) -> list:
    from replay.workloads.request import Request

    out = []
    for arrival, prompt_len, max_tokens, tokens in poisson_chunks(num_requests):
        bounds = np.concatenate([[0], np.cumsum(prompt_len)])
        for i in range(len(arrival)):
            out.append(Request(tokens[bounds[i]:bounds[i + 1]].tolist(), int(max_tokens[i]),
                               temperature=0.0, ignore_eos=True, arrival_s=float(arrival[i])))
    return out


def _timing() -> tuple[Any, Any]:
    from replay.recorded import from_trace
    from replay.replayer import config_from_header
    from replay.whatif.cost.model import CostModel
    from tracing.reader import read_trace

    events = from_trace(read_trace(TIMING_TRACE))
    return CostModel.fit(events, source=TIMING_TRACE), config_from_header(events.header)


def run_list(num_requests: int, digest_out: str | None = None) -> dict[str, Any]:
    """Today's path: the whole workload as a list, simulated with its event stream held."""
    from replay.whatif.simulate import run_variant, workload_from_requests

    began = time.perf_counter()
    cost, config = _timing()
    workload = workload_from_requests(_requests_as_list(num_requests), config, name="poisson")
    result = run_variant(workload, {}, cost, "poisson", keep_events=digest_out is not None)
    wall = time.perf_counter() - began
    if digest_out is not None:
        _save_digest(result, digest_out)
    return _figures("list", num_requests, wall, result.metrics)


def _save_digest(result: Any, path: str) -> None:
    """The printed metrics and the decision stream (token columns blanked), for before/after."""
    import pickle

    from replay.verify import blank_columns, ignored_columns

    events = blank_columns(result.events, ignored_columns())
    with open(path, "wb") as handle:
        pickle.dump({"metrics": result.metrics, "tables": {
            k: {c: list(v) for c, v in cols.items()} for k, cols in events.tables.items()
        }}, handle)


def _figures(mode: str, n: int, wall: float, metrics: dict[str, float]) -> dict[str, Any]:
    rss_gb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024**2
    return {"mode": mode, "requests": n, "wall_s": round(wall, 3),
            "requests_per_s": round(n / wall, 1), "us_per_request": round(wall / n * 1e6, 1),
            "peak_rss_gb": round(rss_gb, 3), "metrics": metrics}


MODES = {"list": run_list}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="4096,10000")
    parser.add_argument("--mode", default="list", choices=sorted(MODES))
    parser.add_argument("--one", type=int, help="run one size in this process (internal)")
    parser.add_argument("--digest", help="with --one: save metrics and decisions here")
    parser.add_argument("--json", help="append the figures here as JSON lines")
    args = parser.parse_args(argv)
    if args.one is not None:
        print(json.dumps(MODES[args.mode](args.one, args.digest)))
        return 0
    for size in [int(s) for s in args.sizes.split(",")]:
        command = [sys.executable, "-m", "benchmarks.simulate_scale", "--mode", args.mode,
                   "--one", str(size)]
        done = subprocess.run(command, capture_output=True, text=True, check=True)
        line = done.stdout.strip().splitlines()[-1]
        print(line, flush=True)
        if args.json:
            with open(args.json, "a") as handle:
                handle.write(line + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
