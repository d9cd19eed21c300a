"""Benchmark of the recording cost: ``python -m benchmarks.recorder``.

Schedules the reference workload (256 sequences, all arriving at step 0) with the null executor,
so the scheduler is the only other work and the recorder's cost is as visible as it can be, and
times the whole run (adding requests, stepping until idle, closing) in these modes:

- ``off``: ``record_events=False`` (the engine emits nothing);
- ``memory``: events kept by ``MemorySink`` (the emission cost alone);
- ``parquet``: the ``ParquetRecorder`` as the engine uses it (background writer, fsync);
- ``parquet-nofsync``: the same without fsync (safe against a killed process, not power loss);
- ``parquet-sync``: the recorder encoding and writing on the engine's thread, for comparison.

With ``--step-ms`` each step also waits that long with the GIL released, standing in for the
GPU: the executor of a real run spends most of a step waiting on the device, and that is when
the background writer runs. 3.6 ms is an H200 at the reference throughput ceiling of DESIGN.md
(1,032 steps in about 3.7 s).

This module is a script: unlike the tracing library it imports engine and replay.
"""

from __future__ import annotations

import argparse
import gc
import shutil
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

from engine.config import Config
from engine.engine_core import EngineCore
from engine.executor import NullExecutor
from engine.sampling_params import SamplingParams
from replay.workloads.builtin import reference_workload
from tracing.recorder import DEFAULT_FLUSH_STEPS, ParquetRecorder
from tracing.sink import MemorySink

# Large enough that the reference workload never preempts: Nano-vLLM's bench schedule.
BENCH_NUM_BLOCKS = 4096
DEFAULT_REPEAT = 5
MODES = ("off", "memory", "parquet", "parquet-nofsync", "parquet-sync")
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
        params = SamplingParams(
            temperature=request.temperature, max_tokens=request.max_tokens, ignore_eos=True
        )
        core.add_request(request.prompt, params, arrival_s=0.0)
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


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=DEFAULT_REPEAT, help="runs per mode")
    parser.add_argument("--flush-steps", type=int, default=DEFAULT_FLUSH_STEPS)
    parser.add_argument("--keep", type=Path, help="keep the last parquet trace in this directory")
    parser.add_argument(
        "--step-ms", type=float, default=0.0, help="simulated device time per step (GIL released)"
    )
    args = parser.parse_args(argv)
    work = Path(tempfile.mkdtemp(prefix="bench-recorder-"))
    trace_dir = work / "trace"
    wall: dict[str, list[float]] = {mode: [] for mode in MODES}
    cpu: dict[str, list[float]] = {mode: [] for mode in MODES}
    sinks: dict[str, Any] = {}
    try:
        run_once("parquet", trace_dir, args.flush_steps)  # warm-up: imports, caches
        step_s = args.step_ms / 1000.0
        # Interleave the modes so that machine noise spreads evenly over them.
        for _ in range(args.repeat):
            for mode in MODES:
                seconds, cpu_s, sinks[mode] = run_once(mode, trace_dir, args.flush_steps, step_s)
                wall[mode].append(seconds)
                cpu[mode].append(cpu_s)
        size, allocated = _trace_bytes(trace_dir)
        if args.keep is not None:
            shutil.copytree(trace_dir, args.keep, dirs_exist_ok=True)
    finally:
        shutil.rmtree(work, ignore_errors=True)

    med = {mode: statistics.median(values) for mode, values in wall.items()}
    med_cpu = {mode: statistics.median(values) for mode, values in cpu.items()}
    recorder: ParquetRecorder = sinks["parquet"]
    events = sum(recorder.counts.values())
    print(
        f"reference workload: {events:,} events, {recorder.last_step + 1:,} steps, "
        f"{recorder.num_segments} segments (flush_steps={args.flush_steps}), "
        f"{args.step_ms:g} ms device time per step, median of {args.repeat} runs"
    )
    print(
        f"{'mode':<14}{'wall s':>8}{'vs off':>9}{'vs memory':>11}{'min s':>8}"
        f"{'engine CPU s':>14}{'vs memory':>11}"
    )
    for mode in MODES:
        print(
            f"{mode:<14}{med[mode]:>8.3f}{_pct(med[mode], med['off']):>9}"
            f"{_pct(med[mode], med['memory']):>11}{min(wall[mode]):>8.3f}"
            f"{med_cpu[mode]:>14.3f}{_pct(med_cpu[mode], med_cpu['memory']):>11}"
        )
    sync: ParquetRecorder = sinks["parquet-sync"]
    print(
        f"parquet: engine thread {recorder.step_end_s:.3f} s in on_step_end (of which "
        f"{recorder.convert_s:.3f} s converting to Arrow) + {recorder.close_s:.3f} s in close; "
        f"writer thread {recorder.write_s:.3f} s wall, {recorder.write_cpu_s:.3f} s CPU"
    )
    print(
        f"parquet-sync: engine thread {sync.step_end_s:.3f} s in on_step_end + "
        f"{sync.close_s:.3f} s in close"
    )
    print(
        f"trace size: {size / _MB:.2f} MB in files, {allocated / _MB:.2f} MB allocated on disk; "
        f"{size / events:.1f} bytes per event"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
