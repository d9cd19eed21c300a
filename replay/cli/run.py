"""``replayllm run``: a workload on a model, recorded to a trace."""

from __future__ import annotations

import os
import shutil
from typing import Any

from engine.errors import InvalidRequestError, ReplayLLMError
from replay.workloads.builtin import load_workload, reference_workload

TRACE_HEADER_FILE = "run.json"


def prepare_trace_dir(path: str) -> None:
    """Make room for a new trace: replace an old trace there, never anything else."""
    if not os.path.exists(path):
        return
    if not os.path.isdir(path):
        raise ReplayLLMError(f"{path} exists and is not a directory; choose another --out")
    entries = os.listdir(path)
    if entries and TRACE_HEADER_FILE not in entries:
        raise ReplayLLMError(f"{path} exists and is not a trace; choose another --out")
    shutil.rmtree(path)


def run_command(
    model: str | None,
    workload: str,
    out: str,
    num_seqs: int | None,
    overrides: dict[str, Any],
    warm_up: int = 0,
) -> int:
    """Run ``workload`` ('bench' or a JSONL path) on ``model``, recording into ``out``.

    ``warm_up``: untraced runs of the same workload first, in this process, so the recorded run
    starts warm (no one-off kernel compilation in its first steps), as ``replayllm bench`` does."""
    from engine import LLM
    from replay.cli.live import run_workload
    from tracing.inspect import describe
    from tracing.reader import read_trace

    requests = reference_workload() if workload == "bench" else load_workload(workload)
    if num_seqs is not None:
        if num_seqs < 1:
            raise InvalidRequestError(f"--num-seqs must be >= 1, got {num_seqs}")
        requests = requests[:num_seqs]
    if warm_up < 0:
        raise InvalidRequestError(f"--warm-up must be >= 0, got {warm_up}")
    prepare_trace_dir(out)
    for _ in range(warm_up):
        warm = LLM(model, record_events=False, **overrides)
        try:
            run_workload(warm, requests)
        finally:
            warm.close()
    llm = LLM(model, trace_dir=out, **overrides)
    try:
        run_workload(llm, requests)
    finally:
        llm.close()  # a clean close writes the summary and the last segment
    print(describe(read_trace(out)))
    print(f"trace: {out}")
    return 0
