"""The host work of a recorded run's mixed steps, re-driven on the CPU (no GPU needed).

Replays a trace (``replay.replayer.replay``: the engine's own scheduler, the recording's
tokens) and times, for every mixed step (prompt chunks with decodes), the scheduler's decision,
``payload_from_batch`` and ``stage_mixed`` into numpy buffers of the mixed graphs' layout.
What is left of the recorded ``host_s`` is the upload, the graph and sampler launches and the
recorder. Usage: ``python tools/probe_mixed_host.py TRACE_DIR [REPEATS]``.
"""

from __future__ import annotations

import statistics
import sys
import time

import numpy as np

from engine.graph_sizes import MIXED_GRAPH_PREFILL_SEQS
from engine.runner.mixed_graphs import stage_mixed
from engine.runner.step_inputs import payload_from_batch
from engine.scheduler import Scheduler
from replay import replayer
from replay.recorded import from_trace
from tracing import read_trace

DECODE_ROUND = 8  # decode rows padded to a multiple of this (enough for the staging cost)


def main(argv: list[str]) -> int:
    recorded = from_trace(read_trace(argv[0]))
    repeats = int(argv[1]) if len(argv) > 1 else 3
    block_size = replayer.config_from_header(recorded.header).kvcache_block_size
    s = MIXED_GRAPH_PREFILL_SEQS
    i64 = np.zeros((4, 1 << 14), np.int64)
    i32 = np.zeros(2 * s + 1 + 4096, np.int32)
    tables = np.zeros((s + 4096, 4096), np.int32)
    times: dict[str, list[float]] = {"schedule": [], "payload": [], "stage": []}
    execute, schedule = replayer.TraceExecutor.execute, Scheduler.schedule

    def timed_execute(self: replayer.TraceExecutor, batch):  # noqa: ANN001, ANN202
        if batch.kind == "mixed":
            began = time.perf_counter()
            payload = payload_from_batch(batch, decode=False)
            staged = time.perf_counter()
            decodes = len(payload.query_lens) - payload.num_prefill_seqs
            rows = -(-decodes // DECODE_ROUND) * DECODE_ROUND
            prefill = sum(payload.query_lens[:payload.num_prefill_seqs])
            stage_mixed(i64, i32, tables, payload.input_ids, payload.query_lens,
                        payload.context_lens, payload.block_tables, payload.num_prefill_seqs,
                        block_size, (int(prefill), rows), s)
            times["payload"].append(staged - began)
            times["stage"].append(time.perf_counter() - staged)
        return execute(self, batch)

    def timed_schedule(self: Scheduler):  # noqa: ANN202
        began = time.perf_counter()
        batch = schedule(self)
        if batch is not None and batch.kind == "mixed":
            times["schedule"].append(time.perf_counter() - began)
        return batch

    replayer.TraceExecutor.execute = timed_execute  # type: ignore[method-assign]
    Scheduler.schedule = timed_schedule  # type: ignore[method-assign]
    for _ in range(repeats):
        for values in times.values():
            values.clear()
        replayer.replay(recorded)
        if not times["stage"]:
            print("no mixed steps in this trace")
            return 1
        print("  ".join(f"{name} p50 {statistics.median(v) * 1e3:.3f} ms, mean "
                        f"{statistics.mean(v) * 1e3:.3f} ms" for name, v in times.items())
              + f"  ({len(times['stage'])} mixed steps)")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
