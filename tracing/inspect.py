"""A few-line human summary of a trace (``replayllm inspect TRACE``)."""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from tracing.outdir import lock_holder
from tracing.reader import Trace


def _header_int(header: dict[str, Any], key: str, config_key: str) -> int | None:
    value = header.get(key)
    if value is None:
        config = header.get("config")
        value = config.get(config_key) if isinstance(config, dict) else None
    return int(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else None


def header_block_size(header: dict[str, Any]) -> int | None:
    """Tokens per KV block: the header's ``block_size``, else its engine config's
    ``kvcache_block_size`` (``tracing.validate`` requires neither); None if it holds neither.
    The one rule ``inspect`` and both exports read the block size by."""
    return _header_int(header, "block_size", "kvcache_block_size")


def header_num_blocks(header: dict[str, Any]) -> int | None:
    """The KV pool's size: the header's ``num_blocks``, else ``config.num_kvcache_blocks``."""
    return _header_int(header, "num_blocks", "num_kvcache_blocks")


def _finite(value: Any) -> Any:
    """A float that is not a finite number (a damaged step time) as None: ``--json`` output
    is strict JSON, which has no NaN or Infinity (``jq``, ``JSON.parse`` refuse them)."""
    return None if isinstance(value, float) and not math.isfinite(value) else value


def prefix_cache_hit_rate(trace: Trace) -> tuple[int, int]:
    """(tokens served from the prefix cache, tokens looked up) over every admission.

    A sequence is looked up once per admission: its prompt when it first runs, its whole context
    again when it returns after a preemption. An admission gives a sequence its block table from
    logical block 0 (a ``block_hit`` or ``block_allocated`` row of index 0); every ``block_hit``
    row is one full block of hits. Requests never admitted (rejected, aborted while waiting, or
    still waiting where a killed run's trace ends) and preempted sequences not yet back are
    never looked up.
    """
    block_size = header_block_size(trace.header) or 0
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


def _counts(values: list[str]) -> dict[str, int]:
    uniques, counts = np.unique(np.asarray(values, dtype=object), return_counts=True)
    return {str(k): int(n) for k, n in zip(uniques.tolist(), counts.tolist())}


def _count_by(counts: dict[str, int]) -> str:
    return ", ".join(f"{k} {n:,}" for k, n in counts.items()) or "none"


def summarize(trace: Trace) -> dict[str, Any]:
    """What ``describe`` says, as numbers (``replayllm inspect TRACE --json``): the trace's
    state (``recording``: who still records it, ``"pid N"``, else None) and size, the run's
    setup, requests by finish reason, steps by kind, tokens, the prefix-cache hit rate (None:
    nothing looked up), preemptions, wall, model and host time; for an incomplete trace, over
    steps 0 to ``last_step`` (the rows ``read_trace``'s tables hold)."""
    header = trace.header
    config = header.get("config") or {}
    model = header.get("model")
    model_name = model if isinstance(model, str) else None
    if isinstance(model, dict):
        model_name = model.get("name") or model.get("architecture")
    added = trace.table("request_added")
    steps = trace.table("model_step")
    preempted = trace.table("preempted")
    hits, looked_up = prefix_cache_hit_rate(trace)
    completion_tokens = trace.table("token_sampled").num_rows
    wall = _wall_time(trace)
    names = steps.column_names
    host = np.asarray(steps.column("host_s"), float) if "host_s" in names else np.zeros(0)
    outside = (np.asarray(steps.column("outside_s"), float) if "outside_s" in names
               else np.zeros(0))
    figures = {
        "path": str(trace.path), "complete": trace.complete, "last_step": trace.last_step,
        "recording": None if trace.complete else lock_holder(trace.path),
        "schema_version": header.get("schema_version"), "segments": trace.segments,
        "num_events": trace.num_events,
        "unread": trace.unread_note,
        "size_bytes": trace.size_bytes,
        "model": model_name, "policy": header.get("policy", config.get("policy")),
        "num_kvcache_blocks": header_num_blocks(header),
        "block_size": header_block_size(header), "device": header.get("device"),
        "git_commit": header.get("git_commit"), "start_time": header.get("start_time"),
        "requests": added.num_rows,
        "finished": _counts(
            trace.table("request_finished").column("reason").to_pylist()),
        "steps": steps.num_rows, "step_kinds": _counts(steps.column("kind").to_pylist()),
        "prompt_tokens": int(np.asarray(added.column("prompt_len"), np.int64).sum()),
        "completion_tokens": completion_tokens,
        "prefix_cache_hit_tokens": hits, "prefix_cache_lookup_tokens": looked_up,
        "prefix_cache_hit_rate": hits / looked_up if looked_up else None,
        "preemptions": preempted.num_rows,
        "preemption_steps": len(np.unique(np.asarray(preempted.column("step")))),
        "wall_time_s": wall,
        "model_time_s": float(np.asarray(steps.column("duration_s")).sum()) if steps.num_rows
        else 0.0,
        "throughput_tok_s": completion_tokens / wall if wall > 0 else None,
        "host_s": float(host.sum()) if len(host) and np.isfinite(host).all() else None,
        "outside_s": (float(outside.sum()) if len(outside) and np.isfinite(outside).all()
                      else None),
    }
    return {key: _finite(value) for key, value in figures.items()}


def _or_unknown(value: Any) -> Any:
    return "?" if value is None else value


def _seconds(value: float | None) -> str:
    return "? s" if value is None else f"{value:.2f} s"


def describe(trace: Trace) -> str:
    """Requests, steps, tokens, preemptions, prefix-cache hit rate, wall time and throughput."""
    s = summarize(trace)
    header = trace.header
    if s["complete"]:
        state = "complete"
    elif s["recording"]:  # a process still holds the lock: it has not stopped
        so_far = ("no step committed yet" if s["last_step"] < 0
                  else f"committed through step {s['last_step']} so far")
        state = f"INCOMPLETE (being recorded by {s['recording']}; {so_far})"
    elif s["last_step"] < 0:
        state = "INCOMPLETE (recording stopped before any step was committed)"
    elif s["unread"]:  # a copy taken mid-recording: its markers go past the files it holds
        state = f"INCOMPLETE (read through step {s['last_step']}; see the note below)"
    else:
        state = f"INCOMPLETE (recording stopped; committed through step {s['last_step']})"
    rate = s["prefix_cache_hit_rate"]
    hit_rate = f"{100.0 * rate:.1f}%" if rate is not None else "n/a"
    tput = s["throughput_tok_s"]
    throughput = f"{tput:,.0f} tok/s" if tput is not None else "n/a"
    lines = [
        f"trace {s['path']}: {state}; schema v{s['schema_version']}, "
        f"{s['segments']} segments, {s['num_events']:,} events, "
        f"{s['size_bytes'] / 1e6:.2f} MB",
        f"run: model {s['model'] or '?'}, policy {_or_unknown(s['policy'])}, "
        f"{_or_unknown(s['num_kvcache_blocks'])} KV blocks x "
        f"{s['block_size'] or '?'} tokens, device {header.get('device', '?')}, "
        f"git {(s['git_commit'] or '?')[:12]}, started {header.get('start_time', '?')}",
        f"requests {s['requests']:,} (finished: {_count_by(s['finished'])}); "
        f"steps {s['steps']:,} ({_count_by(s['step_kinds'])})",
        f"tokens: prompt {s['prompt_tokens']:,}, completion {s['completion_tokens']:,}; "
        f"prefix cache hit rate {hit_rate} ({s['prefix_cache_hit_tokens']:,} of "
        f"{s['prefix_cache_lookup_tokens']:,} looked-up tokens)",
        f"preemptions {s['preemptions']:,} (in {s['preemption_steps']:,} steps); wall time "
        f"{_seconds(s['wall_time_s'])} (model {_seconds(s['model_time_s'])}); throughput "
        f"{throughput} (completion tokens)",
    ]
    thread = _engine_thread(trace.table("model_step"))
    if thread:
        lines.append(thread)
    if s["unread"]:
        lines.append(f"note: {s['unread']}")
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
