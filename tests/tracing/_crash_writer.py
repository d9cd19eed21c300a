"""Subprocess for the crash tests: records a slow run, one segment per step.

``kill`` mode runs for many seconds (the test SIGKILLs it); ``exit`` mode takes a few steps and
leaves the interpreter without closing the recorder, as an uncaught exception would. The third
argument names the recorder's writer (``thread`` or ``process``); with ``process`` the child's
pid is the first line on stdout.
"""

from __future__ import annotations

import sys
from pathlib import Path

from _trace_helpers import FakeClock, Req, SlowExecutor, Workload

from engine.engine_core import EngineCore
from engine.sampling_params import SamplingParams
from tracing.recorder import ParquetRecorder

STEP_SLEEP_S = 0.01
EXIT_AFTER_STEPS = 12


def main() -> None:
    trace_dir, mode, writer = Path(sys.argv[1]), sys.argv[2], sys.argv[3]
    # Enough work for many seconds: the kill test ends the process long before it finishes.
    requests = [Req(list(range(i % 7, i % 7 + 20)), 400) for i in range(16)]
    workload = Workload(requests, num_blocks=512, block_size=8, max_model_len=512)
    recorder = ParquetRecorder(trace_dir, flush_steps=1, fsync=False, writer=writer)
    executor = SlowExecutor(workload.num_blocks, STEP_SLEEP_S if mode == "kill" else 0.0)
    core = EngineCore(workload.config(), executor, sink=recorder, clock=FakeClock())
    if writer == "process":
        print(recorder.writer_pid, flush=True)
    for req in requests:
        core.add_request(req.prompt, SamplingParams(max_tokens=req.max_tokens, ignore_eos=True))
    steps = 0
    while core.step() is not None:
        steps += 1
        if mode == "exit" and steps == EXIT_AFTER_STEPS:
            raise SystemExit(3)  # no close(): the writer still finishes what it was handed


if __name__ == "__main__":
    main()
