"""Benchmark the CPU side: the reference workload through Scheduler + BlockManager, no model,
and what recording it costs.

Run: ``replayllm bench scheduler`` (or ``python -m benchmarks.scheduler [--step-ms 3.6]``).
The reference workload (256 sequences, all arriving at step 0) runs with the null executor, so
the scheduler is the only other work and the recorder's cost is as visible as it can be. Each
mode is timed as the median of ``repeat`` runs (adding requests, stepping until idle, closing),
modes interleaved so machine noise spreads evenly over them:

- ``off``: ``record_events=False`` (the engine emits nothing);
- ``memory``: events kept by ``MemorySink`` (the emission cost alone);
- ``parquet``: the ``ParquetRecorder`` as the engine uses it (background writer, fsync);
- ``parquet-nofsync``: the same without fsync (safe against a killed process, not power loss);
- ``parquet-sync``: the recorder encoding and writing on the engine's thread, for comparison;
- ``parquet-process``: segments written by a child process (``Config.trace_segment_writer``).

Then the trace size and ``verify`` of the trace (in-process, reading included, and as the
``replayllm verify`` command). With ``--step-ms`` each step also waits that long with the GIL
released, standing in for the GPU: a real executor spends most of a step waiting on the device,
and that is when the background writer runs.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from benchmarks.cli_args import json_out, milliseconds, positive_int
from engine.config import Config
from engine.engine_core import EngineCore
from engine.executor import NullExecutor
from replay.workloads.builtin import reference_workload
from tracing.recorder import DEFAULT_FLUSH_STEPS, ParquetRecorder
from tracing.sink import MemorySink

# Large enough that the reference workload never preempts: Nano-vLLM's bench schedule.
BENCH_NUM_BLOCKS = 4096
MODES = ("off", "memory", "parquet", "parquet-nofsync", "parquet-sync", "parquet-process")
_MB = 1e6
def _sink(mode: str, trace_dir: Path, flush_steps: int) -> Any:
    if mode == "memory":
        return MemorySink()
    if mode.startswith("parquet"):
        return ParquetRecorder(
            trace_dir,
            flush_steps=flush_steps,
            background=mode != "parquet-sync",
            fsync=mode != "parquet-nofsync",
            overwrite=True,
            writer="process" if mode == "parquet-process" else "thread",
        )
    return None


class PacedExecutor(NullExecutor):
    """The null executor plus a GIL-free wait per step, like a device-bound model step."""

    def __init__(self, num_blocks: int, step_s: float) -> None:
        super().__init__(num_blocks)
        self.step_s = step_s

    def execute(self, batch: Any) -> Any:
        time.sleep(self.step_s)
        return super().execute(batch)


def run_once(
    mode: str, trace_dir: Path, flush_steps: int, step_s: float = 0.0
) -> tuple[float, float, Any]:
    """(wall seconds, engine-thread CPU seconds) of the whole run in ``mode``, and the sink."""
    workload = reference_workload()
    gc.collect()
    began = time.perf_counter()
    began_cpu = time.thread_time()
    sink = _sink(mode, trace_dir, flush_steps)
    core = EngineCore(
        Config(num_kvcache_blocks=BENCH_NUM_BLOCKS),
        PacedExecutor(BENCH_NUM_BLOCKS, step_s) if step_s else NullExecutor(BENCH_NUM_BLOCKS),
        sink=sink,
        record_events=mode != "off",
    )
    for request in workload:
        core.add_request(request.prompt, request.sampling_params(), arrival_s=0.0)
    core.run_until_idle()
    core.close()
    return time.perf_counter() - began, time.thread_time() - began_cpu, sink


def _trace_bytes(trace_dir: Path) -> tuple[int, int]:
    """(bytes of all files, bytes allocated on disk) under ``trace_dir``."""
    files = [p for p in trace_dir.rglob("*") if p.is_file()]
    size = sum(p.stat().st_size for p in files)
    allocated = sum(p.stat().st_blocks * 512 for p in files)
    return size, allocated


def _pct(value: float, base: float) -> str:
    return f"{100.0 * (value / base - 1.0):+.1f}%"


def _verify_times(trace_dir: Path, repeat: int) -> dict[str, Any]:
    from replay.verify import verify

    in_process, command = [], []
    outcome = proc = None
    for _ in range(repeat):
        began = time.perf_counter()
        outcome = verify(trace_dir)
        in_process.append(time.perf_counter() - began)
        began = time.perf_counter()
        proc = subprocess.run([sys.executable, "-m", "replay.cli.main", "verify", str(trace_dir)],
                              capture_output=True, text=True, check=False)
        command.append(time.perf_counter() - began)
    assert outcome is not None and proc is not None
    return {"verify_in_process_s": statistics.median(in_process),
            "verify_identical": outcome.identical,
            "verify_cli_s": statistics.median(command),
            "verify_cli_output": proc.stdout.strip()}


def run(repeat: int = 3, step_ms: float = 0.0,
        flush_steps: int = DEFAULT_FLUSH_STEPS) -> dict[str, Any]:
    """All measurements (medians of ``repeat``), as a dict (also what ``--json`` writes)."""
    work = Path(tempfile.mkdtemp(prefix="replayllm-bench-"))
    trace_dir = work / "trace"
    wall: dict[str, list[float]] = {mode: [] for mode in MODES}
    cpu: dict[str, list[float]] = {mode: [] for mode in MODES}
    sinks: dict[str, Any] = {}
    try:
        run_once("parquet", trace_dir, flush_steps)  # warm-up: imports, caches
        for _ in range(repeat):
            for mode in MODES:
                seconds, cpu_s, sinks[mode] = run_once(mode, trace_dir, flush_steps,
                                                       step_ms / 1000.0)
                wall[mode].append(seconds)
                cpu[mode].append(cpu_s)
        run_once("parquet", trace_dir, flush_steps)  # the trace verify reads: the default mode
        size, allocated = _trace_bytes(trace_dir)
        verified = _verify_times(trace_dir, repeat)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    recorder: ParquetRecorder = sinks["parquet"]
    return {
        "machine": f"{platform.node()} {platform.machine()} {os.cpu_count()} cores",
        "python": platform.python_version(),
        "date": time.strftime("%Y-%m-%d"),
        "step_ms": step_ms,
        "repeat": repeat,
        "events": sum(recorder.counts.values()),
        "steps": recorder.last_step + 1,
        "segments": recorder.num_segments,
        "wall_s": {mode: statistics.median(v) for mode, v in wall.items()},
        "wall_min_s": {mode: min(v) for mode, v in wall.items()},
        "engine_cpu_s": {mode: statistics.median(v) for mode, v in cpu.items()},
        "recorder_step_end_s": recorder.step_end_s,
        "recorder_convert_s": recorder.convert_s,
        "recorder_close_s": recorder.close_s,
        "writer_wall_s": recorder.write_s,
        "writer_cpu_s": recorder.write_cpu_s,
        "trace_bytes": size,
        "trace_bytes_allocated": allocated,
        **verified,
    }


def format_table(r: dict[str, Any]) -> str:
    med, med_cpu = r["wall_s"], r["engine_cpu_s"]
    lines = [
        f"{r['machine']}; reference workload: {r['events']:,} events, {r['steps']:,} steps, "
        f"{r['segments']} segments, {r['step_ms']:g} ms device time per step, "
        f"median of {r['repeat']} runs",
        f"{'mode':<16}{'wall s':>8}{'vs off':>9}{'vs memory':>11}{'min s':>8}"
        f"{'engine CPU s':>14}{'vs memory':>11}",
    ]
    for mode in MODES:
        lines.append(
            f"{mode:<16}{med[mode]:>8.3f}{_pct(med[mode], med['off']):>9}"
            f"{_pct(med[mode], med['memory']):>11}{r['wall_min_s'][mode]:>8.3f}"
            f"{med_cpu[mode]:>14.3f}{_pct(med_cpu[mode], med_cpu['memory']):>11}"
        )
    lines += [
        f"parquet: engine thread {r['recorder_step_end_s']:.3f} s in on_step_end (of which "
        f"{r['recorder_convert_s']:.3f} s converting to Arrow) + {r['recorder_close_s']:.3f} s "
        f"in close; writer thread {r['writer_wall_s']:.3f} s wall, {r['writer_cpu_s']:.3f} s CPU",
        f"trace size: {r['trace_bytes'] / _MB:.2f} MB in files, "
        f"{r['trace_bytes_allocated'] / _MB:.2f} MB allocated; "
        f"{r['trace_bytes'] / r['events']:.1f} bytes per event",
        f"verify: {r['verify_in_process_s']:.3f} s in-process, {r['verify_cli_s']:.3f} s as "
        f"the replayllm verify command: {r['verify_cli_output']}",
    ]
    return "\n".join(lines)


def main(argv: list[str] | None = None, json_path: str | None = None,
         repeat: int | None = None) -> int:
    """``python -m benchmarks.scheduler [--repeat N] [--step-ms MS] [--json F]``; called with
    ``json_path``/``repeat`` (as ``replayllm bench`` calls its suites), no parsing."""
    parser = argparse.ArgumentParser(prog="python -m benchmarks.scheduler",
                                     description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=positive_int, default=3,
                        help="runs per mode (median kept)")
    parser.add_argument("--flush-steps", type=positive_int, default=DEFAULT_FLUSH_STEPS)
    parser.add_argument("--step-ms", type=milliseconds, default=0.0,
                        help="simulated device time per step (GIL released)")
    parser.add_argument("--json", type=json_out, default=None,
                        help="also write the results here as JSON")
    if argv is None and (json_path is not None or repeat is not None):
        argv = [*(["--json", json_path] if json_path else []), "--repeat", str(repeat or 3)]
    args = parser.parse_args(argv)
    results = run(args.repeat, args.step_ms, args.flush_steps)
    print(format_table(results))
    if args.json:
        with open(args.json, "w", encoding="utf-8") as handle:
            json.dump(results, handle, indent=2)
    return 0 if results["verify_identical"] else 1


if __name__ == "__main__":
    sys.exit(main())
