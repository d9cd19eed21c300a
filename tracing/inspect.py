"""A few-line human summary of a trace (``replayllm inspect TRACE``)."""

from __future__ import annotations

from typing import Any

import numpy as np

from tracing.reader import Trace


def _block_size(header: dict[str, Any]) -> int | None:
    size = header.get("block_size")
    if size is None:
        size = (header.get("config") or {}).get("kvcache_block_size")
    return int(size) if isinstance(size, (int, float)) else None


def prefix_cache_hit_rate(trace: Trace) -> tuple[int, int]:
    """(tokens served from the prefix cache, tokens looked up) over every admission.

    A sequence is looked up once per admission: its prompt when it first runs, its whole context
    again when it returns after a preemption. An admission gives a sequence its block table from
    logical block 0 (a ``block_hit`` or ``block_allocated`` row of index 0); every ``block_hit``
    row is one full block of hits. Requests never admitted (rejected, aborted while waiting, or
    still waiting where a killed run's trace ends) and preempted sequences not yet back are
    never looked up.
    """
    block_size = _block_size(trace.header) or 0
    admitted: dict[int, int] = {}  # seq_id -> admissions
    for kind in ("block_hit", "block_allocated"):
        table = trace.table(kind)
        first = np.asarray(table.column("logical_index")) == 0
        for seq_id in np.asarray(table.column("seq_id"))[first].tolist():
            admitted[seq_id] = admitted.get(seq_id, 0) + 1
    added = trace.table("request_added")
    looked_up = sum(length for seq_id, length in zip(
        np.asarray(added.column("seq_id")).tolist(),
        np.asarray(added.column("prompt_len"), np.int64).tolist()) if seq_id in admitted)
    preempted = trace.table("preempted")
    returned: dict[int, int] = {}  # seq_id -> preemptions it came back from so far
    for seq_id, tokens in zip(np.asarray(preempted.column("seq_id")).tolist(),
                              np.asarray(preempted.column("num_tokens"), np.int64).tolist()):
        if returned.get(seq_id, 0) + 1 < admitted.get(seq_id, 0):
            returned[seq_id] = returned.get(seq_id, 0) + 1
            looked_up += tokens
    hits = trace.table("block_hit").num_rows * block_size
    return hits, looked_up


def _wall_time(trace: Trace) -> float:
    if trace.summary is not None and isinstance(trace.summary.get("elapsed_s"), (int, float)):
        return float(trace.summary["elapsed_s"])
    wall = trace.table("model_step").column("wall_time_s")
    return float(np.max(np.asarray(wall))) if len(wall) else 0.0


def _count_by(values: list[str]) -> str:
    uniques, counts = np.unique(np.asarray(values, dtype=object), return_counts=True)
    return ", ".join(f"{k} {n:,}" for k, n in zip(uniques.tolist(), counts.tolist())) or "none"


def describe(trace: Trace) -> str:
    """Requests, steps, tokens, preemptions, prefix-cache hit rate, wall time and throughput."""
    header = trace.header
    if trace.complete:
        state = "complete"
    elif trace.last_step < 0:
        state = "INCOMPLETE (recording stopped before any step was committed)"
    else:
        state = f"INCOMPLETE (recording stopped; committed through step {trace.last_step})"
    config = header.get("config") or {}
    policy = header.get("policy", config.get("policy", "?"))
    num_blocks = header.get("num_blocks", config.get("num_kvcache_blocks", "?"))
    block_size = _block_size(header)
    model = header.get("model")
    model_name = model if isinstance(model, str) else None
    if isinstance(model, dict):
        model_name = model.get("name") or model.get("architecture")

    added = trace.table("request_added")
    finished = trace.table("request_finished")
    steps = trace.table("model_step")
    reasons = finished.column("reason").to_pylist()
    prompt_tokens = int(np.asarray(added.column("prompt_len"), np.int64).sum())
    completion_tokens = trace.table("token_sampled").num_rows
    preempted = trace.table("preempted")
    preempt_steps = len(np.unique(np.asarray(preempted.column("step"))))
    hits, looked_up = prefix_cache_hit_rate(trace)
    hit_rate = f"{100.0 * hits / looked_up:.1f}%" if looked_up else "n/a"
    wall = _wall_time(trace)
    throughput = f"{completion_tokens / wall:,.0f} tok/s" if wall > 0 else "n/a"
    model_time = float(np.asarray(steps.column("duration_s")).sum()) if steps.num_rows else 0.0

    lines = [
        f"trace {trace.path}: {state}; schema v{header.get('schema_version')}, "
        f"{trace.segments} segments, {trace.num_events:,} events, "
        f"{trace.size_bytes / 1e6:.2f} MB",
        f"run: model {model_name or '?'}, policy {policy}, {num_blocks} KV blocks x "
        f"{block_size or '?'} tokens, device {header.get('device', '?')}, "
        f"git {(header.get('git_commit') or '?')[:12]}, started {header.get('start_time', '?')}",
        f"requests {added.num_rows:,} (finished: {_count_by(reasons)}); "
        f"steps {steps.num_rows:,} ({_count_by(steps.column('kind').to_pylist())})",
        f"tokens: prompt {prompt_tokens:,}, completion {completion_tokens:,}; "
        f"prefix cache hit rate {hit_rate} ({hits:,} of {looked_up:,} looked-up tokens)",
        f"preemptions {preempted.num_rows:,} (in {preempt_steps:,} steps); wall time {wall:.2f} s "
        f"(model {model_time:.2f} s); throughput {throughput} (completion tokens)",
    ]
    thread = _engine_thread(steps)
    if thread:
        lines.append(thread)
    return "\n".join(lines)


def _engine_thread(steps: Any) -> str | None:
    """Where the engine's thread went: its own host work (``host_s``) and the driver's between
    steps (``outside_s``, schema 7), with the step the driver delayed most; None where the trace
    measured neither."""
    names = steps.column_names
    host = np.asarray(steps.column("host_s"), float) if "host_s" in names else np.zeros(0)
    outside = (np.asarray(steps.column("outside_s"), float) if "outside_s" in names
               else np.zeros(0))
    parts = []
    if len(host) and np.isfinite(host).all():
        parts.append(f"its own host work {host.sum():.2f} s")
    if len(outside) and np.isfinite(outside).all():
        worst = int(np.argmax(outside))
        step = int(np.asarray(steps.column("step"))[worst])
        parts.append(f"the driver's between steps {outside.sum():.3f} s (the most before one "
                     f"step {1e3 * outside[worst]:.1f} ms, step {step})")
    return "engine thread: " + "; ".join(parts) if parts else None
