"""Benchmark the CPU side: the reference workload through Scheduler + BlockManager, no model.

Run: ``replayllm bench scheduler`` (or ``python -m benchmarks.scheduler``). Measures, each as the
median of ``repeat`` runs on one core: the whole schedule with events off, with the in-memory
sink, with the Parquet recorder (close included); the trace size; and ``verify`` of that trace
(in-process, reading included, and as the ``replayllm verify`` command).
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
from engine.engine_core import EngineCore
from engine.executor import NullExecutor
from engine.sampling_params import SamplingParams
from replay.workloads.builtin import reference_workload

# Large enough that the reference workload never preempts: the schedule Nano-vLLM's bench runs.
BENCH_NUM_BLOCKS = 4096


def _schedule_once(mode: str, trace_dir: str | None = None) -> tuple[float, dict[str, Any]]:
    from tracing.sink import MemorySink

    config = Config(num_kvcache_blocks=BENCH_NUM_BLOCKS)
    sink: Any = None
    if mode == "memory":
        sink = MemorySink()
    elif mode == "parquet":
        from tracing.recorder import ParquetRecorder

        sink = ParquetRecorder(trace_dir)
    executor = NullExecutor(BENCH_NUM_BLOCKS)
    core = EngineCore(config, executor, sink=sink, record_events=mode != "off")
    for request in reference_workload():
        core.add_request(
            request.prompt,
            SamplingParams(
                temperature=request.temperature, max_tokens=request.max_tokens, ignore_eos=True
            ),
            arrival_s=0.0,
        )
    began = time.perf_counter()
    core.run_until_idle()
    summary = core.close()
    elapsed = time.perf_counter() - began
    summary["events"] = core.events.next_event_id
    return elapsed, summary


def _dir_size(path: str) -> int:
    return sum(
        os.path.getsize(os.path.join(root, name))
        for root, _, names in os.walk(path)
        for name in names
    )


def _median(values: list[float]) -> float:
    return statistics.median(values)


def run(repeat: int = 3) -> dict[str, Any]:
    """All measurements, as a dict (also what ``--json`` writes)."""
    results: dict[str, Any] = {
        "machine": f"{platform.node()} {platform.machine()} {os.cpu_count()} cores",
        "python": platform.python_version(),
        "date": time.strftime("%Y-%m-%d"),
    }
    times: dict[str, list[float]] = {"off": [], "memory": [], "parquet": []}
    workdir = tempfile.mkdtemp(prefix="replayllm-bench-")
    trace_dir = os.path.join(workdir, "trace")
    try:
        summary: dict[str, Any] = {}
        for _ in range(repeat):
            for mode in times:
                if mode == "parquet":
                    shutil.rmtree(trace_dir, ignore_errors=True)
                elapsed, summary = _schedule_once(mode, trace_dir)
                times[mode].append(elapsed)
        results.update(
            steps=summary["steps"],
            completion_tokens=summary["completion_tokens"],
            events=summary["events"],
            schedule_events_off_s=_median(times["off"]),
            schedule_in_memory_s=_median(times["memory"]),
            schedule_parquet_s=_median(times["parquet"]),
            trace_bytes=_dir_size(trace_dir),
        )
        from replay.verify import verify

        verify_times = []
        for _ in range(repeat):
            began = time.perf_counter()
            outcome = verify(trace_dir)
            verify_times.append(time.perf_counter() - began)
        results["verify_in_process_s"] = _median(verify_times)
        results["verify_identical"] = outcome.identical
        cli_times = []
        for _ in range(repeat):
            began = time.perf_counter()
            proc = subprocess.run(
                [sys.executable, "-m", "replay.cli.main", "verify", trace_dir],
                capture_output=True,
                text=True,
                check=False,
            )
            cli_times.append(time.perf_counter() - began)
        results["verify_cli_s"] = _median(cli_times)
        results["verify_cli_output"] = proc.stdout.strip()
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    memory, off = results["schedule_in_memory_s"], results["schedule_events_off_s"]
    results["events_overhead_pct"] = 100.0 * (memory - off) / off
    results["parquet_overhead_vs_memory_pct"] = (
        100.0 * (results["schedule_parquet_s"] - memory) / memory
    )
    return results


def format_table(r: dict[str, Any]) -> str:
    rows = [
        ("machine", r["machine"]),
        ("steps / completion tokens / events", f"{r['steps']} / {r['completion_tokens']} / "
                                               f"{r['events']}"),
        ("schedule, events off", f"{r['schedule_events_off_s']:.3f} s"),
        ("schedule, in-memory sink", f"{r['schedule_in_memory_s']:.3f} s "
                                     f"(+{r['events_overhead_pct']:.0f}% vs off)"),
        ("schedule, Parquet recorder", f"{r['schedule_parquet_s']:.3f} s "
                                       f"(+{r['parquet_overhead_vs_memory_pct']:.0f}% vs memory)"),
        ("trace size on disk", f"{r['trace_bytes'] / 1e6:.2f} MB"),
        ("verify (in-process, reading included)", f"{r['verify_in_process_s']:.3f} s"),
        ("replayllm verify (whole command)", f"{r['verify_cli_s']:.3f} s"),
        ("verify says", r["verify_cli_output"]),
    ]
    width = max(len(name) for name, _ in rows)
    return "\n".join(f"{name:<{width}}  {value}" for name, value in rows)


def main(json_path: str | None = None, repeat: int = 3) -> int:
    results = run(repeat)
    print(format_table(results))
    if json_path:
        with open(json_path, "w", encoding="utf-8") as handle:
            json.dump(results, handle, indent=2)
    return 0 if results["verify_identical"] else 1


if __name__ == "__main__":
    sys.exit(main())
