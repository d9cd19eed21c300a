"""Where a decode step's time goes: CPU phases of the step loop and GPU kernels, on a CUDA GPU.

``python -m benchmarks.profile_engine --model DIR`` starts the reference workload, steps until every
prompt is prefilled (a pure decode batch of 256), then times ``--steps`` steps: wall time of the
scheduler, of the executor call and of post-processing (host clocks), the executor's GPU time
(CUDA events), and a ``torch.profiler`` table of the GPU kernels (kernels inside CUDA graph
replays included). Writes ``profile.json`` and ``kernels.txt`` under ``--out``.

``--num-seqs N`` takes the reference's first N requests only (a decode batch of N rows; each has
at least 100 tokens to generate, so keep ``--steps`` under 50).

``--prefill-tokens N`` profiles prefill steps of one fresh N-token prompt each instead (an engine
sized for it, one sequence; each step's prompt shares no prefix with another), after as many
untimed ones.
"""

from __future__ import annotations

import argparse
import itertools
import json
import statistics
import sys
import time
from pathlib import Path
from typing import Any

PROFILE_ROWS = 25


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", required=True)
    parser.add_argument("--out", default="out/profile")
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--set", action="append", default=[], help="config override k=v")
    parser.add_argument("--num-seqs", type=int, default=0,
                        help="the reference's first N requests only (default: all 256)")
    parser.add_argument("--prefill-tokens", type=int, default=0,
                        help="profile prefills of one prompt of this many tokens")
    args = parser.parse_args(argv)
    import torch
    from torch.profiler import ProfilerActivity, profile

    from engine import LLM, SamplingParams
    from engine.config import parse_override
    from replay.workloads.builtin import reference_workload

    overrides = {k: parse_override(k, v) for k, _, v in (s.partition("=") for s in args.set)}
    # Sequential steps: the loop below drives scheduler and executor by hand.
    overrides.setdefault("async_scheduling", False)
    long_prompt = args.prefill_tokens
    if long_prompt:
        overrides.update(max_model_len=long_prompt + 8, max_num_batched_tokens=long_prompt + 8,
                         max_num_seqs=1)
    llm = LLM(args.model, record_events=False, **overrides)
    core = llm.core
    if not long_prompt:
        requests = reference_workload()
        for r in itertools.islice(requests, args.num_seqs or None):
            llm.add_request(list(r.prompt), SamplingParams(r.temperature, r.max_tokens, True))
        while True:  # run the prefills
            result = core.step()
            if result is None or result.batch.kind == "decode":
                break
    prompts = 0

    def add_long_prompt() -> None:
        nonlocal prompts
        ids = range(1000 * prompts, 1000 * (prompts + 1))  # no prefix shared between prompts
        llm.add_request([ids[(7 * i) % len(ids)] for i in range(long_prompt)],
                        SamplingParams(0.0, 1, True))
        prompts += 1
    sched_s, exec_s, post_s, gpu_s = [], [], [], []
    scheduler, executor = core.scheduler, core.executor

    def timed_step() -> None:
        if long_prompt:
            add_long_prompt()
        t0 = time.perf_counter()
        batch = scheduler.schedule()
        t1 = time.perf_counter()
        output = executor.execute(batch)
        t2 = time.perf_counter()
        scheduler.postprocess(batch, output.token_ids)
        t3 = time.perf_counter()
        sched_s.append(t1 - t0)
        exec_s.append(t2 - t1)
        post_s.append(t3 - t2)
        gpu_s.append(output.duration_s or 0.0)

    for _ in range(args.steps):
        timed_step()
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        for _ in range(args.steps):
            timed_step()
        torch.cuda.synchronize()
    table = prof.key_averages().table(sort_by="cuda_time_total", row_limit=PROFILE_ROWS)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "kernels.txt").write_text(table)
    n = args.steps

    def ms(xs: list[float]) -> float:
        return statistics.median(xs[:n]) * 1e3

    summary: dict[str, Any] = {
        "batch": len(scheduler.running) if hasattr(scheduler, "running") else None,
        "scheduler_ms": ms(sched_s),
        "execute_wall_ms": ms(exec_s),
        "execute_gpu_ms": ms(gpu_s),
        "postprocess_ms": ms(post_s),
        "host_gap_ms": ms(exec_s) - ms(gpu_s),
    }
    (out / "profile.json").write_text(json.dumps(summary, indent=1))
    print(table)
    print(json.dumps(summary, indent=1))
    llm.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
