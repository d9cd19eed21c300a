"""Benchmark the what-if simulator on the reference workload, and make timed synthetic traces.

Run: ``python -m benchmarks.whatif``. It records the reference workload (NullExecutor tokens)
to a Parquet trace whose step times follow a known law (``StepLaw``: H200-like magnitudes, noise,
a periodic recorder flush), then measures, each the median of ``repeat`` runs:
one variant (read the trace, fit the step-time model, simulate, metrics), the same as the whole
``whatif`` command, and a 16-variant grid across the machine's cores.

``record_workload`` and the laws live in ``replay.whatif.synthetic`` (re-exported here).
"""

from __future__ import annotations

import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from typing import Any

from engine.config import Config
from replay.whatif.cost.model import CostModel
from replay.whatif.fidelity import FIDELITY_TARGETS, fidelity, fidelity_markdown
from replay.whatif.synthetic import record_workload
from replay.workloads.builtin import reference_workload

__all__ = ["main", "run"]

BENCH_NUM_BLOCKS = 1200  # tight enough that some grid variants preempt
GRID = {"max_num_seqs": [32, 64, 128, 256], "num_kvcache_blocks": [400, 600, 900, 1200]}


def grid_variants() -> list[tuple[str, dict[str, Any]]]:
    return [
        (f"max_num_seqs={s} num_kvcache_blocks={b}", {"max_num_seqs": s, "num_kvcache_blocks": b})
        for s in GRID["max_num_seqs"]
        for b in GRID["num_kvcache_blocks"]
    ]


def _timed(action: Any) -> tuple[float, float, Any]:
    """(wall seconds, CPU seconds of this process and its children, result) of ``action()``.

    CPU time is reported too because a shared CI machine's wall time includes other jobs.
    """
    import resource

    def cpu() -> float:
        children = resource.getrusage(resource.RUSAGE_CHILDREN)
        return time.process_time() + children.ru_utime + children.ru_stime

    wall, before = time.perf_counter(), cpu()
    result = action()
    return time.perf_counter() - wall, cpu() - before, result


def run(repeat: int = 3) -> dict[str, Any]:
    """All measurements (median of ``repeat``), as a dict."""
    from replay.whatif.simulate import load_source, simulate, simulate_many

    workdir = tempfile.mkdtemp(prefix="replayllm-whatif-")
    trace = os.path.join(workdir, "trace")
    command = [sys.executable, "-m", "replay.cli.main", "whatif", trace,
               "--set", "max_num_seqs=128",
               "--out", os.path.join(workdir, "out")]

    def grid() -> list:
        workload = load_source(trace)
        cost = CostModel.fit(workload.recorded, source=trace)  # type: ignore[arg-type]
        return simulate_many(workload, grid_variants(), cost)

    actions = {
        "one_variant": lambda: simulate(trace, {"max_num_seqs": 128}),
        "cli_no_plots": lambda: subprocess.run([*command, "--no-plots"], capture_output=True,
                                               text=True, check=False),
        "cli_with_plots": lambda: subprocess.run(command, capture_output=True, text=True,
                                                 check=False),
        "grid": grid,
    }
    times: dict[str, list[tuple[float, float]]] = {name: [] for name in actions}
    last: dict[str, Any] = {}
    try:
        record_workload(Config(num_kvcache_blocks=BENCH_NUM_BLOCKS), reference_workload(),
                        trace_dir=trace)
        for _ in range(repeat):
            for name, action in actions.items():
                wall, cpu, last[name] = _timed(action)
                times[name].append((wall, cpu))
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    results: dict[str, Any] = {
        "machine": f"{platform.node()} {platform.machine()} {os.cpu_count()} cores",
        "python": platform.python_version(),
        "date": time.strftime("%Y-%m-%d"),
        "steps": int(last["one_variant"].metrics["steps"]),
        "completion_tokens": int(last["one_variant"].metrics["completion_tokens"]),
        "grid_variants": len(last["grid"]),
        "grid_ok": sum(v.ok for v in last["grid"]),
        "cli_ok": all(last[n].returncode == 0 for n in ("cli_no_plots", "cli_with_plots")),
        "cli_error": "".join(last[n].stderr.strip()[-500:] for n in ("cli_no_plots",
                                                                      "cli_with_plots")
                             if last[n].returncode),
    }
    for name, pairs in times.items():
        results[f"{name}_s"] = statistics.median(wall for wall, _ in pairs)
        results[f"{name}_cpu_s"] = statistics.median(cpu for _, cpu in pairs)
    return results


def main(argv: list[str] | None = None, json_path: str | None = None,
         repeat: int | None = None) -> int:
    """``python -m benchmarks.whatif [--json F] [--repeat N] [--fidelity TRACE ...]``;
    called with ``json_path``/``repeat`` (as ``replayllm bench`` calls its suites), no parsing."""
    import argparse

    from benchmarks.cli_args import json_out, positive_int

    parser = argparse.ArgumentParser(prog="python -m benchmarks.whatif",
                                     description=__doc__.split("\n")[0])
    parser.add_argument("--json", type=json_out, default=None,
                        help="also write the results here as JSON")
    parser.add_argument("--repeat", type=positive_int, default=3,
                        help="timed repetitions (median kept)")
    parser.add_argument("--fidelity", nargs="+", metavar="TRACE",
                        help="instead: predict each trace from each other one, Markdown table")
    if argv is None and (json_path is not None or repeat is not None):
        argv = [*(["--json", json_path] if json_path else []), "--repeat", str(repeat or 3)]
    args = parser.parse_args(argv)
    if args.fidelity:
        rows = fidelity(args.fidelity)
        print(fidelity_markdown(rows))
        ok = all(r["status"] == "ok" and r["decisions_identical"]
                 and all(abs(r[m]) <= t for m, t in FIDELITY_TARGETS.items()) for r in rows)
        return 0 if rows and ok else 1
    r = run(args.repeat)

    def both(name: str) -> str:
        return f"{r[name + '_s']:.2f} s wall, {r[name + '_cpu_s']:.2f} s CPU"

    rows = [
        ("machine", r["machine"]),
        ("reference workload", f"{r['steps']} steps, {r['completion_tokens']} output tokens"),
        ("one variant (in-process: read, fit, simulate, metrics)", both("one_variant")),
        ("whatif command, one variant, --no-plots", both("cli_no_plots")),
        ("whatif command, one variant, with plots", both("cli_with_plots")),
        (f"{r['grid_variants']}-variant grid ({os.cpu_count()} cores)", both("grid")),
    ]
    width = max(len(name) for name, _ in rows)
    print("\n".join(f"{name:<{width}}  {value}" for name, value in rows))
    if r["cli_error"]:
        print(f"whatif command failed: {r['cli_error']}", file=sys.stderr)
    if args.json:
        with open(args.json, "w", encoding="utf-8") as handle:
            json.dump(r, handle, indent=2)
    return 0 if r["cli_ok"] and r["grid_ok"] == r["grid_variants"] else 1


if __name__ == "__main__":
    sys.exit(main())
