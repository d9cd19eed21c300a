"""Where do the host stalls of a run's first prefill steps come from (H200)?

The reference workload's mean TTFT is set by its first 9 prefill steps (eager, ~16k tokens,
~35 ms of device time, ~17 ms of host work). In some runs a few of them take 30-50 ms of host
work and the step waits on the host, which moves the mean TTFT by 5-10% between two recordings
of the same configuration. This runs the reference workload several times in one process
(after an uncounted warm-up run) with a Parquet trace and with events kept in memory (no writer
threads), and prints for each prefill step: its host and device milliseconds, and what happened
during its launch: Triton kernels compiled (new specialisations), CUDA memory segments
allocated (cudaMalloc), collector passes of 1 ms or more, and the Python threads alive.

Usage (a CUDA GPU): ``python tools/probe_prefill_stalls.py MODEL_DIR OUT_DIR [RUNS]``.
"""

from __future__ import annotations

import gc
import json
import sys
import tempfile
import threading
import time
import warnings
from pathlib import Path
from typing import Any

REPORT_PAUSE_S = 1e-3


def _jit_functions() -> list[Any]:
    from triton.runtime.jit import JITFunction

    with warnings.catch_warnings():  # isinstance on torch's deprecated lazy attributes warns
        warnings.simplefilter("ignore")
        return [obj for obj in gc.get_objects() if isinstance(obj, JITFunction)]


def _compiled(functions: list[Any]) -> int:
    """Kernels compiled so far by these Triton functions, every device."""
    return sum(len(caches[0]) for fn in functions for caches in fn.device_caches.values())


def _segments() -> int:
    import torch

    if not torch.cuda.is_available():
        return 0
    return int(torch.cuda.memory_stats().get("segment.all.allocated", 0))


def run(model: str, trace: Path | None) -> dict[str, Any]:
    from engine import LLM
    from replay.workloads.builtin import reference_workload

    llm = LLM(model, trace_dir=str(trace) if trace else None)
    functions = _jit_functions()
    per_step: dict[int, dict[str, Any]] = {}
    pauses: list[float] = []
    started = [0.0]

    def on_collect(phase: str, info: dict[str, Any]) -> None:
        if phase == "start":
            started[0] = time.perf_counter()
        elif (elapsed := time.perf_counter() - started[0]) >= REPORT_PAUSE_S:
            pauses.append(round(1e3 * elapsed, 2))

    launch = llm.runner.launch

    def observed_launch(batch: Any, previous: Any = None) -> Any:
        compiled, segments, collections = _compiled(functions), _segments(), len(pauses)
        began = time.perf_counter()
        result = launch(batch, previous)
        if batch.num_prefill_seqs:
            per_step[batch.step] = {
                "launch_ms": round(1e3 * (time.perf_counter() - began), 1),
                "compiled": _compiled(functions) - compiled,
                "segments": _segments() - segments,
                "gc_ms": pauses[collections:],
                "threads": sorted(t.name for t in threading.enumerate()),
            }
        return result

    llm.runner.launch = observed_launch
    requests = reference_workload()
    params = [r.sampling_params() for r in requests]
    gc.callbacks.append(on_collect)
    began = time.perf_counter()
    llm.generate([r.prompt for r in requests], params, use_tqdm=False)
    wall = time.perf_counter() - began
    gc.callbacks.remove(on_collect)
    llm.close()
    if trace is None:
        ms = llm.core.sink.tables["model_step"]
    else:
        from tracing.reader import read_trace

        ms = {k: list(v) for k, v in read_trace(trace).columns("model_step").items()}
    steps = []
    for step, kind, host, device in zip(ms["step"], ms["kind"], ms["host_s"], ms["duration_s"]):
        if kind == "prefill" and step in per_step:
            steps.append({"step": int(step), "host_ms": round(1e3 * float(host), 1),
                          "device_ms": round(1e3 * float(device), 1), **per_step[step]})
    return {"trace": "parquet" if trace else "memory",
            "tok_s": round(sum(r.max_tokens for r in requests) / wall),
            "compiled_in_run": sum(s["compiled"] for s in per_step.values()),
            "segments_in_run": sum(s["segments"] for s in per_step.values()),
            "first_prefills": steps[:12]}


def main() -> None:
    model, out = sys.argv[1], Path(sys.argv[2])
    runs = int(sys.argv[3]) if len(sys.argv) > 3 else 2
    out.mkdir(parents=True, exist_ok=True)
    results = []
    with tempfile.TemporaryDirectory() as work:
        for index in range(1 + 2 * runs):
            memory = index > 0 and index % 2 == 0
            result = run(model, None if memory else Path(work) / str(index))
            result["warm_up"] = index == 0
            print(json.dumps(result), flush=True)
            results.append(result)
    (out / "prefill_stalls.json").write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
