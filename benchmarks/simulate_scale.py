"""Benchmark the simulator at scale: a Poisson workload of N requests, simulated end to end.

Run: ``python -m benchmarks.simulate_scale --sizes 4096,10000 --mode list``. The workload:
Poisson arrivals at ``RATE`` requests per second, prompts of 128-2,048 random token ids, outputs
of 32-512 tokens (``ignore_eos``), step times fitted on ``traces/h200-reference-s4``, the trace's
Config. Each size runs in a fresh process (peak RSS is that process's own); the figures (wall
seconds, requests per wall-second, peak RSS, the metrics) are printed as JSON lines.

Modes: ``list`` builds the whole workload as ``Request`` objects with Python token lists and
simulates it as ``replayllm whatif --workload FILE`` does (the path before streaming).
``stream`` writes the same draws (arrivals, prompt and output lengths) to a Parquet workload of
recipe prompts first (untimed), then reads it back request by request as the streaming
simulator runs (``replay.whatif.stream``): reading is timed with the simulation. ``check``
streams the 4,096 requests of ``list`` (the same random prompts, from the arrays) and compares
the metrics and the decision stream with a digest saved by ``list --digest``.
``--plot PNG`` draws the cost per request against the number of requests, for each mode run.
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

TIMING_TRACE = "traces/h200-reference-s4"
RATE = 50.0  # requests per second
SEED = 0
PROMPT_LEN = (128, 2048)
OUTPUT_LEN = (32, 512)
TOKEN_RANGE = 10000
CHUNK = 8192  # requests generated per chunk (the draws do not depend on it)
PROGRESS_EVERY = 50_000  # stream mode: figures so far to stderr every this many requests


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


def _cpu_s() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def _figures(mode: str, n: int, wall: float, metrics: dict[str, float]) -> dict[str, Any]:
    """The run's figures; CPU time is the whole process's (imports included)."""
    rss_gb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024**2
    cpu = _cpu_s()
    return {"mode": mode, "requests": n, "wall_s": round(wall, 3), "cpu_s": round(cpu, 3),
            "requests_per_s": round(n / wall, 1), "requests_per_cpu_s": round(n / cpu, 1),
            "us_per_request": round(wall / n * 1e6, 1),
            "cpu_us_per_request": round(cpu / n * 1e6, 1),
            "peak_rss_gb": round(rss_gb, 3), "metrics": metrics}


class PoissonSource:
    """The workload of ``poisson_chunks`` as a streaming request source (random prompts as
    int32 arrays, generated chunk by chunk as the simulation pulls them)."""

    def __init__(self, num_requests: int, config: Any) -> None:
        self.num_requests, self.config = num_requests, config
        self.name, self.start_s = "poisson", 0.0
        self.header = {"config": config.to_dict(), "workload": self.name}

    def __iter__(self):
        from engine.sampling_params import SamplingParams
        from replay.whatif.simulate import SimRequest

        for arrival, prompt_len, max_tokens, tokens in poisson_chunks(self.num_requests):
            bounds = np.concatenate([[0], np.cumsum(prompt_len)])
            for i in range(len(arrival)):
                params = SamplingParams(temperature=0.0, max_tokens=int(max_tokens[i]),
                                        ignore_eos=True)
                yield SimRequest(tokens[bounds[i]:bounds[i + 1]], params, float(arrival[i]), 0)


def workload_path(num_requests: int) -> str:
    return f"/tmp/simulate_scale_{num_requests}.parquet"


def write_workload(num_requests: int, path: str) -> None:
    """The draws of ``poisson_chunks`` as a workload file of recipe prompts (unique tokens per
    request: no prefix is shared, as with the random prompts of ``list``)."""
    from replay.workloads.recipe import PromptRecipe
    from replay.workloads.request import Request
    from replay.workloads.store import WorkloadWriter

    writer = WorkloadWriter(path)
    index = 0
    rng = np.random.default_rng(SEED)
    for arrival, prompt_len, max_tokens, _ in _chunks_without_tokens(num_requests, rng):
        for i in range(len(arrival)):
            writer.write(Request(PromptRecipe((), 16, int(prompt_len[i]), salt=index),
                                 int(max_tokens[i]), temperature=0.0, ignore_eos=True,
                                 arrival_s=float(arrival[i])))
            index += 1
    writer.close()


def _chunks_without_tokens(num_requests: int, rng: np.random.Generator):
    """``poisson_chunks``' draws in the same order, the token draws skipped (each chunk's token
    ids come after its lengths, so the arrivals and lengths are the same)."""
    clock = 0.0
    for start in range(0, num_requests, CHUNK):
        n = min(CHUNK, num_requests - start)
        arrival = clock + np.cumsum(rng.exponential(1.0 / RATE, n))
        clock = float(arrival[-1])
        prompt_len = rng.integers(PROMPT_LEN[0], PROMPT_LEN[1] + 1, n)
        max_tokens = rng.integers(OUTPUT_LEN[0], OUTPUT_LEN[1] + 1, n)
        rng.integers(0, TOKEN_RANGE, int(prompt_len.sum()), dtype=np.int32)
        yield arrival, prompt_len, max_tokens, None


class Progress:
    """A request source that logs the figures so far to stderr every ``every`` requests read
    (a long run shows its cost per request and its memory as it goes)."""

    def __init__(self, source: Any, every: int, began: float) -> None:
        self.source, self.every, self.began = source, every, began
        self.name, self.config = source.name, source.config
        self.header, self.start_s = source.header, source.start_s

    def __iter__(self):
        for number, request in enumerate(self.source, 1):
            if number % self.every == 0:
                wall = time.perf_counter() - self.began
                print(json.dumps(_figures("progress", number, wall, {})), file=sys.stderr,
                      flush=True)
            yield request


def run_stream(num_requests: int, digest_out: str | None = None) -> dict[str, Any]:
    """The streaming path: a workload file read request by request as the simulation runs."""
    from replay.whatif.stream import simulate_stream, workload_file_source

    path = workload_path(num_requests)
    began = time.perf_counter()
    cost, config = _timing()
    source = Progress(workload_file_source(path, config), PROGRESS_EVERY, began)
    result = simulate_stream(source, {}, cost, "poisson")
    wall = time.perf_counter() - began
    if not result.ok:
        raise SystemExit(result.status)
    return _figures("stream", num_requests, wall, result.metrics)


def run_check(num_requests: int, digest: str | None = None) -> dict[str, Any]:
    """Stream the ``list`` workload (same prompts) and compare with ``list``'s saved digest."""
    import pickle

    from replay.recorded import from_columns
    from replay.verify import blank_columns, ignored_columns
    from replay.whatif.stream import simulate_stream
    from tracing.sink import MemorySink

    began = time.perf_counter()
    cost, config = _timing()
    collected = MemorySink()
    result = simulate_stream(PoissonSource(num_requests, config), {}, cost, "poisson",
                             downstream=collected)
    wall = time.perf_counter() - began
    figures = _figures("check", num_requests, wall, result.metrics)
    if digest is None:
        return figures
    with open(digest, "rb") as handle:
        before = pickle.load(handle)
    events = blank_columns(from_columns(collected.header, collected.tables), ignored_columns())
    after = {k: {c: list(v) for c, v in cols.items()} for k, cols in events.tables.items()}
    figures["metrics_identical"] = before["metrics"] == result.metrics and all(
        repr(before["metrics"][k]) == repr(result.metrics[k]) for k in before["metrics"])
    differing = [f"{kind}.{column}" for kind, cols in before["tables"].items()
                 for column, values in cols.items() if after[kind][column] != values]
    figures["decisions_identical"] = not differing and set(after) == set(before["tables"])
    figures["differing_columns"] = differing
    return figures


MODES = {"list": run_list, "stream": run_stream, "check": run_check}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="4096,10000", help="'' with --plot: only plot")
    parser.add_argument("--mode", default="list", choices=sorted(MODES))
    parser.add_argument("--one", type=int, help="run one size in this process (internal)")
    parser.add_argument("--digest", help="with --one: save metrics and decisions here")
    parser.add_argument("--json", help="append the figures here as JSON lines")
    parser.add_argument("--plot", help="draw the cost per request from the --json figures here")
    args = parser.parse_args(argv)
    if args.one is not None:
        print(json.dumps(MODES[args.mode](args.one, args.digest)))
        return 0
    if args.plot and not args.sizes:
        return plot(args.json, args.plot)
    for size in [int(s) for s in args.sizes.split(",")]:
        if args.mode == "stream":
            write_workload(size, workload_path(size))
        command = [sys.executable, "-m", "benchmarks.simulate_scale", "--mode", args.mode,
                   "--one", str(size)]
        if args.digest:
            command += ["--digest", args.digest]
        done = subprocess.run(command, capture_output=True, text=True, check=True)
        line = done.stdout.strip().splitlines()[-1]
        print(line, flush=True)
        if args.json:
            with open(args.json, "a") as handle:
                handle.write(line + "\n")
    if args.plot and args.json:
        plot(args.json, args.plot)
    return 0


def plot(figures_path: str, png: str) -> int:
    """Cost per request (wall and CPU microseconds) against requests, one line per mode."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = [json.loads(line) for line in open(figures_path) if line.strip()]
    fig, (ax, mem) = plt.subplots(1, 2, figsize=(11, 4.2))
    progress = sorted((r for r in rows if r["mode"] == "progress"), key=lambda r: r["requests"])
    if len(progress) > 1:  # the cost of each stretch of one long run, not its running mean
        pairs = list(zip(progress, progress[1:]))
        ax.plot([b["requests"] for _, b in pairs],
                [(b["cpu_s"] - a["cpu_s"]) / (b["requests"] - a["requests"]) * 1e6
                 for a, b in pairs], ".", color="grey",
                label="stream, one run: CPU of each stretch")
        mem.plot([r["requests"] for r in progress], [r["peak_rss_gb"] for r in progress], ".",
                 color="grey", label="stream, one run, so far")
    for mode in sorted({r["mode"] for r in rows} - {"progress"}):
        mine = sorted((r for r in rows if r["mode"] == mode), key=lambda r: r["requests"])
        x = [r["requests"] for r in mine]
        ax.plot(x, [r["cpu_us_per_request"] for r in mine], "o-", label=f"{mode}: CPU")
        ax.plot(x, [r["us_per_request"] for r in mine], "s--", alpha=0.5,
                label=f"{mode}: wall (shared machine)")
        mem.plot(x, [r["peak_rss_gb"] for r in mine], "o-", label=mode)
    for axis in (ax, mem):
        axis.set_xscale("log")
        axis.set_xlabel("requests simulated")
        axis.grid(True, which="both", alpha=0.3)
        axis.legend(fontsize=8)
    ax.set_yscale("log")
    ax.set_ylabel("microseconds per request")
    ax.set_title("Cost per request")
    mem.set_ylabel("peak RSS (GB)")
    mem.set_title("Peak memory")
    fig.suptitle("Simulator at scale: Poisson 50 req/s, h200-reference-s4 step times")
    fig.tight_layout()
    fig.savefig(png, dpi=120)
    return 0


if __name__ == "__main__":
    sys.exit(main())
