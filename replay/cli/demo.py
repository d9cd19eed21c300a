"""``replayllm demo``: record a small run on the tiny model, verify it, summarise it."""

from __future__ import annotations

import shlex
import time

from replay.workloads.builtin import (
    DEMO_BLOCK_SIZE,
    DEMO_MAX_MODEL_LEN,
    DEMO_NUM_BLOCKS,
    demo_workload,
)

SHOWN_OUTPUTS = 3
PREVIEW_CHARS = 60


def _preview(text: str) -> str:
    flat = " ".join(text.split())
    return flat if len(flat) <= PREVIEW_CHARS else flat[: PREVIEW_CHARS - 3] + "..."


DEMO_WRITER = "demo"


def _replaces_own_demo(trace_dir: str) -> bool:
    """Whether ``trace_dir`` holds a trace an earlier ``replayllm demo`` wrote: re-running the
    demo replaces its own trace without ``--force`` (anything else is checked as ``run`` does)."""
    from pathlib import Path

    from tracing.outdir import read_owner

    owner = read_owner(Path(trace_dir)) if Path(trace_dir).is_dir() else None
    return owner is not None and owner.get("command") == DEMO_WRITER


def load_hint(trace_dir: str) -> str:
    """A shell command that loads the trace's ``seq_scheduled`` table with pandas, quoted so
    that it runs as printed whatever the path holds (spaces, quotes, ``$``)."""
    code = f"import pandas as pd; print(pd.read_parquet({f'{trace_dir}/seq_scheduled'!r}).head())"
    if not any(c in code for c in '"$`\\!'):
        return f'python -c "{code}"'  # the plain form, for a plain path
    return f"python -c {shlex.quote(code)}"


def run_demo(trace_dir: str, force: bool = False) -> int:
    """Make (or reuse) the tiny model, record a run that hits the prefix cache and preempts."""
    from engine import LLM
    from engine.model.checkpoint import default_model_dir
    from replay.cli.live import run_workload
    from replay.verify import verify
    from tracing import header
    from tracing.inspect import describe
    from tracing.reader import read_trace

    began = time.perf_counter()
    from tracing.recorder import check_trace_dir

    check_trace_dir(trace_dir, force or _replaces_own_demo(trace_dir))
    model_dir = default_model_dir()
    print(f"model: {model_dir} (tiny Qwen3 architecture, random weights, real Qwen vocabulary)")
    requests = demo_workload()
    llm = LLM(
        str(model_dir),
        trace_dir=trace_dir,
        force=force or _replaces_own_demo(trace_dir),
        trace_writer=DEMO_WRITER,
        kvcache_block_size=DEMO_BLOCK_SIZE,
        num_kvcache_blocks=DEMO_NUM_BLOCKS,
        max_model_len=DEMO_MAX_MODEL_LEN,
    )
    try:
        seqs = run_workload(llm, requests)
    finally:
        summary = llm.close()  # a clean close writes the summary and the last segment
    trace = read_trace(trace_dir)
    # The device the engine took (CUDA where there is one), as the trace records it.
    device = header.recorded_device(trace.header) or "an unknown device"
    print(f"\n{len(seqs)} requests, {summary['completion_tokens']} tokens generated "
          f"in {summary['elapsed_s']:.2f} s ({summary['throughput_tok_s']:.0f} tok/s on {device})")
    for seq in seqs[:SHOWN_OUTPUTS]:
        prompt = llm.tokenizer.decode(list(seq.prompt_token_ids))
        text = llm.tokenizer.decode(list(seq.completion_token_ids))
        print(f"  [{seq.seq_id}] {_preview(prompt)!r}\n      -> {_preview(text)!r} "
              f"({seq.num_completion_tokens} tokens, {seq.finish_reason})")
    print("\n" + describe(trace))
    result = verify(trace_dir)
    print(f"\nverify: {result.report()}")
    print(f"\ntrace: {trace_dir}")
    print(f"load it: {load_hint(trace_dir)}")
    print(f"demo took {time.perf_counter() - began:.1f} s")
    return 0 if result.identical else 1
