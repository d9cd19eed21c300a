"""Where a process's first recording stalls: the matrix driver's warm-up engines, then the
reference workload recorded by fresh engines, with the engine thread's stack sampled every
millisecond and every Triton compile logged. Prints each step whose host work exceeds
``--stall-ms`` in each run, and each stack that stayed put for that long.

    python tools/probe_first_stalls.py MODEL_DIR OUT_DIR [--runs 2] [--stall-ms 20] [--no-warm-up]
        [--cell CELL --matrix-dir .matrix]

A GPU tool (docs/gpu-notes.md, session 18): the first reference recording of each matrix call
has two ~75 ms host stalls (steps 9 and 111) that its twins do not. ``--cell`` runs a cell of
``benchmarks.matrix`` (its workload file from ``--matrix-dir`` and its Config) instead of the
reference: session 35's first Azure recording of a process has 12 decode steps at padded
batches first used in the process whose host waits about one step of the device. Each run also
prints the CUDA caching allocator's device allocations and frees during it, whose
``cudaMalloc``/``cudaFree`` wait for the device.
"""

from __future__ import annotations

import argparse
import sys
import threading
import time
import traceback
from pathlib import Path
from typing import Any


def _sampler(thread_id: int, samples: list, stop: threading.Event) -> None:
    """Every ~1 ms: (time, the thread's innermost 14 frames)."""
    while not stop.is_set():
        frame = sys._current_frames().get(thread_id)
        if frame is not None:
            stack = traceback.extract_stack(frame)[-14:]
            samples.append((time.perf_counter(),
                            tuple(f"{f.filename.split('/site-packages/')[-1]}:{f.lineno} {f.name}"
                                  for f in stack)))
        time.sleep(0.001)


def _long_stacks(samples: list, stall_s: float) -> list[tuple[float, float, tuple]]:
    """Runs of samples whose 6 innermost frames stayed the same for ``stall_s`` or longer."""
    runs, start = [], 0
    for i in range(1, len(samples) + 1):
        if i == len(samples) or samples[i][1][-6:] != samples[start][1][-6:]:
            span = samples[i - 1][0] - samples[start][0]
            if span >= stall_s:
                runs.append((samples[start][0], span, samples[start][1]))
            start = i
    return runs


def _device_allocations(torch: Any) -> list[int]:
    """The CUDA caching allocator's ``cudaMalloc`` and ``cudaFree`` calls so far."""
    stats = torch.cuda.memory_stats()
    return [int(stats.get("num_device_alloc", -1)), int(stats.get("num_device_free", -1))]


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("model")
    parser.add_argument("out")
    parser.add_argument("--runs", type=int, default=2)
    parser.add_argument("--stall-ms", type=float, default=20.0)
    parser.add_argument("--no-warm-up", action="store_true",
                        help="no warm-up engines: what a fresh process's first run compiles")
    parser.add_argument("--cell", help="a benchmarks.matrix cell instead of the reference")
    parser.add_argument("--matrix-dir", default=".matrix",
                        help="the cells' workload files (python -m benchmarks.matrix prepare)")
    args = parser.parse_args()

    import numpy as np
    import torch
    import triton

    from benchmarks.matrix import CELLS, _requests, warm_up_engines
    from engine import LLM
    from replay.cli.live import run_workload
    from replay.workloads.builtin import reference_workload
    from tracing.reader import read_trace

    compiles: list[tuple[float, str]] = []

    def on_compile(**hook: object) -> bool:
        compiles.append((time.perf_counter(), str(hook.get("repr", hook.get("fn")))[:240]))
        return False

    triton.knobs.runtime.jit_cache_hook = on_compile
    overrides: dict = {}
    if args.cell:
        family, overrides = CELLS[args.cell]
        requests = _requests(Path(args.matrix_dir), family)
    else:
        requests = reference_workload()
    if not args.no_warm_up:
        warm_up_engines(args.model)
    print(f"warm-up: {len(compiles)} Triton compiles", flush=True)
    for run in range(args.runs):
        samples: list = []
        stop = threading.Event()
        sampler = threading.Thread(target=_sampler, args=(threading.get_ident(), samples, stop),
                                   daemon=True)
        trace = f"{args.out}/run{run}"
        llm = LLM(args.model, trace_dir=trace, **overrides)
        first_compile = len(compiles)
        allocs = _device_allocations(torch)
        sampler.start()
        began = time.perf_counter()
        run_workload(llm, requests, use_tqdm=False)
        allocs = [b - a for a, b in zip(allocs, _device_allocations(torch))]
        stop.set()
        sampler.join()
        llm.close()
        steps = read_trace(trace).columns("model_step")
        host = np.asarray(steps["host_s"], float)
        slow = np.flatnonzero(host > args.stall_ms / 1e3)
        print(f"run {run}: {time.perf_counter() - began:.2f} s, "
              f"{len(compiles) - first_compile} Triton compiles, steps with host work over "
              f"{args.stall_ms:g} ms: "
              + ", ".join(f"{int(steps['step'][i])} ({host[i] * 1e3:.0f} ms, "
                          f"{steps['kind'][i]} {int(steps['num_seqs'][i])} seqs, padded "
                          f"{int(steps['padded_batch_size'][i])})" for i in slow),
              flush=True)
        print(f"  caching allocator during the run: {allocs[0]} device allocations, "
              f"{allocs[1]} frees", flush=True)
        for at, name in compiles[first_compile:]:
            print(f"  compile at +{(at - began) * 1e3:.0f} ms: {name}")
        for at, span, stack in _long_stacks(samples, args.stall_ms / 1e3):
            print(f"  stack held {span * 1e3:.0f} ms at +{(at - began) * 1e3:.0f} ms:")
            print("    " + "\n    ".join(stack))
    return 0


if __name__ == "__main__":
    sys.exit(main())
