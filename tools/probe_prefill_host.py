"""Where does a small eager prefill's time go on the H200, and what slows it inside a run?

For calibration-style prefills of 16-2,048 tokens (one prompt each) it times, per phase on the
host: input staging (``prepare``), the forward's kernel launches, logits + sampling launches, and
the wait for the device; then the same steps while another thread competes for the GIL (a busy
Python loop, or a pyarrow Parquet writer like the trace recorder's), with the interpreter's
switch interval at its default and lowered; and a ``torch.profiler`` table of one 128-token
prefill's CPU side.

Usage (a CUDA GPU): ``python tools/probe_prefill_host.py MODEL_DIR OUT_DIR``.
"""

from __future__ import annotations

import io
import json
import statistics
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path

SIZES = (16, 128, 512, 2048)
REPEATS = 20
DEFAULT_SWITCH_S = 0.005
LOW_SWITCH_S = 0.0002


def _busy_python(stop: threading.Event) -> None:
    while not stop.is_set():
        total = 0
        for i in range(20000):
            total += i * i
        time.sleep(0.001)


def _parquet_writer(stop: threading.Event) -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq

    rows = 5000
    table = pa.table({"a": list(range(rows)), "b": [float(i) for i in range(rows)],
                      "c": [str(i % 7) for i in range(rows)]})
    while not stop.is_set():
        sink = io.BytesIO()
        pq.write_table(table, sink, compression="zstd")
        time.sleep(0.002)


def _phases(runner, batch) -> dict[str, float]:
    import torch

    from engine.runner.step_inputs import eager_inputs, payload_from_batch

    torch.cuda.synchronize()
    t0 = time.perf_counter()
    payload = payload_from_batch(batch, decode=False)
    ids, positions, metadata = eager_inputs(payload, runner.block_size, runner.device)
    t1 = time.perf_counter()
    hidden = runner.model(ids, positions, metadata)
    t2 = time.perf_counter()
    index = torch.tensor(payload.sample_rows, dtype=torch.int64).to(runner.device)
    logits = runner.model.compute_logits(hidden.index_select(0, index))
    tokens = runner.cuda.sample(logits, runner.cuda.upload(payload.temperatures, torch.float32))
    t3 = time.perf_counter()
    tokens.tolist()
    t4 = time.perf_counter()
    return {"prepare_ms": 1e3 * (t1 - t0), "forward_launch_ms": 1e3 * (t2 - t1),
            "sample_launch_ms": 1e3 * (t3 - t2), "wait_ms": 1e3 * (t4 - t3),
            "total_ms": 1e3 * (t4 - t0)}


def _measure(runner, batches, label: str) -> list[dict]:
    rows = []
    for batch in batches:
        _phases(runner, batch)
        samples = [_phases(runner, batch) for _ in range(REPEATS)]
        row = {"condition": label, "tokens": batch.num_batched_tokens}
        for key in samples[0]:
            row[key] = round(statistics.median(s[key] for s in samples), 3)
        row["total_p90_ms"] = round(sorted(s["total_ms"] for s in samples)[int(0.9 * REPEATS)], 3)
        rows.append(row)
        print(json.dumps(row), flush=True)
    return rows


def _with_thread(target: Callable[[threading.Event], None] | None, switch_s: float,
                 fn: Callable[[], list[dict]]) -> list[dict]:
    stop = threading.Event()
    thread = threading.Thread(target=target, args=(stop,), daemon=True) if target else None
    sys.setswitchinterval(switch_s)
    if thread:
        thread.start()
    try:
        return fn()
    finally:
        stop.set()
        if thread:
            thread.join()
        sys.setswitchinterval(DEFAULT_SWITCH_S)


def main() -> int:
    import torch
    from torch.profiler import ProfilerActivity, profile

    from engine import LLM
    from engine.calibration import calibration_batches

    model, out = sys.argv[1], Path(sys.argv[2])
    out.mkdir(parents=True, exist_ok=True)
    llm = LLM(model, record_events=False)
    runner = llm.core.executor
    batches = [b for b in calibration_batches(llm.core.config)
               if b.kind == "prefill" and b.num_batched_tokens in SIZES]
    results = []
    with torch.inference_mode():
        for label, target, switch in (
            ("alone", None, DEFAULT_SWITCH_S),
            ("busy-python-thread", _busy_python, DEFAULT_SWITCH_S),
            ("busy-python-thread, switch 0.2 ms", _busy_python, LOW_SWITCH_S),
            ("parquet-writer-thread", _parquet_writer, DEFAULT_SWITCH_S),
            ("alone, switch 0.2 ms", None, LOW_SWITCH_S),
        ):
            results += _with_thread(target, switch, lambda label=label: _measure(runner, batches,
                                                                                 label))
        small = next(b for b in batches if b.num_batched_tokens == 128)
        with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
            for _ in range(5):
                _phases(runner, small)
    table = prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=45)
    (out / "prefill_profile.txt").write_text(table)
    print(table[:6000])
    (out / "prefill_host.json").write_text(json.dumps(results, indent=1))
    llm.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
