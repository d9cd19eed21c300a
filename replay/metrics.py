"""Run metrics from any event stream, recorded or simulated, computed the same way for both.

Times come from two columns only: ``model_step.wall_time_s`` (end of a step, seconds since the
engine started) and ``request_added.arrival_s``. A request's first token is "out" at the end of
the step that sampled it, so TTFT = that step's ``wall_time_s`` minus the arrival. Because a
recording and a simulation carry the same columns, their metrics compare like for like.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from replay.recorded import RecordedEvents

if TYPE_CHECKING:  # pandas loads on first use: ``import replay`` stays light
    import pandas as pd

PERCENTILES = (50, 90, 99)
LATENCIES = ("ttft", "tpot", "e2e", "queue")
# Executors whose recorded times measure no model (the scheduler alone, or nothing).
UNTIMED_EXECUTORS = frozenset({"null", "trace"})


def has_timings(events: RecordedEvents) -> bool:
    """Whether the stream's step times measure a model run (or a cost model's prediction)."""
    executor = events.header.get("executor")
    name = executor.get("executor") if isinstance(executor, dict) else None
    if name in UNTIMED_EXECUTORS:
        return False
    if name == "sim":
        return bool(executor.get("timed"))
    wall = np.asarray(events.tables["model_step"]["wall_time_s"], dtype=float)
    duration = np.asarray(events.tables["model_step"]["duration_s"], dtype=float)
    return len(wall) > 0 and bool((duration > 0).any()) and float(wall.max()) > 0


def _step_index(steps: np.ndarray, query: np.ndarray) -> np.ndarray:
    """Row of ``model_step`` for each step number in ``query`` (steps are sorted)."""
    return np.clip(np.searchsorted(steps, query), 0, max(len(steps) - 1, 0))


@dataclass
class RunMetrics:
    """The summary (metric name -> value), one row per request and one row per step."""

    summary: dict[str, float]
    requests: pd.DataFrame
    steps: pd.DataFrame


def _per_step(events: RecordedEvents, num_blocks: int) -> pd.DataFrame:
    import pandas as pd

    ms = events.tables["model_step"]
    bs = events.tables["batch_scheduled"]
    steps = np.asarray(ms["step"], dtype=np.int64)
    free = np.asarray(bs["free_blocks"], dtype=np.int64)
    # batch_scheduled and model_step have one row per step each, in the same order.
    used = num_blocks - free if len(free) == len(steps) else np.zeros(len(steps), np.int64)
    return pd.DataFrame(
        {
            "step": steps,
            "kind": np.asarray(ms["kind"]).astype(str),
            "time_s": np.asarray(ms["wall_time_s"], dtype=float),
            "duration_s": np.asarray(ms["duration_s"], dtype=float),
            "num_seqs": np.asarray(ms["num_seqs"], dtype=np.int64),
            "batched_tokens": np.asarray(bs["num_batched_tokens"], dtype=np.int64)
            if len(free) == len(steps)
            else np.zeros(len(steps), np.int64),
            "kv_blocks_used": used,
        }
    )


def _first_last(keys: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Sorted unique keys, the index of each one's first and last row, and its row count."""
    unique, first, counts = np.unique(keys, return_index=True, return_counts=True)
    last = len(keys) - 1 - np.unique(keys[::-1], return_index=True)[1]
    return unique, first, last, counts


def _per_request(events: RecordedEvents, end: np.ndarray, steps: np.ndarray) -> pd.DataFrame:
    import pandas as pd

    ra, ts, rf = (events.tables[k] for k in ("request_added", "token_sampled", "request_finished"))
    seq_ids = np.asarray(ra["seq_id"], dtype=np.int64)
    arrival = np.asarray(ra["arrival_s"], dtype=float)
    n = len(seq_ids)
    order = np.argsort(seq_ids)
    position = {"first": np.full(n, np.nan), "last": np.full(n, np.nan)}
    tokens = np.zeros(n, np.int64)
    tok_seq = np.asarray(ts["seq_id"], dtype=np.int64)
    if len(tok_seq):
        unique, first, last, counts = _first_last(tok_seq)
        rows = order[np.searchsorted(seq_ids[order], unique)]
        tok_time = end[_step_index(steps, np.asarray(ts["step"], dtype=np.int64))]
        position["first"][rows] = tok_time[first]
        position["last"][rows] = tok_time[last]
        tokens[rows] = counts
    # Queue time: from arrival to the start (end of the previous step) of the first scheduled step.
    queue = np.full(n, np.nan)
    ss = events.tables["seq_scheduled"]
    sched_seq = np.asarray(ss["seq_id"], dtype=np.int64)
    if len(sched_seq) and len(end):
        unique, first, _, _ = _first_last(sched_seq)
        rows = order[np.searchsorted(seq_ids[order], unique)]
        row = _step_index(steps, np.asarray(ss["step"], dtype=np.int64)[first])
        began = np.where(row > 0, end[np.maximum(row - 1, 0)], -np.inf)
        queue[rows] = np.maximum(began - arrival[rows], 0.0)
    preempted = np.zeros(n, np.int64)
    pre_seq = np.asarray(events.tables["preempted"]["seq_id"], dtype=np.int64)
    if len(pre_seq):
        unique, counts = np.unique(pre_seq, return_counts=True)
        preempted[order[np.searchsorted(seq_ids[order], unique)]] = counts
    reason = np.full(n, "", dtype=object)
    fin_seq = np.asarray(rf["seq_id"], dtype=np.int64)
    if len(fin_seq):
        reason[order[np.searchsorted(seq_ids[order], fin_seq)]] = np.asarray(rf["reason"])
    with np.errstate(invalid="ignore", divide="ignore"):
        tpot = np.where(tokens > 1, (position["last"] - position["first"]) / (tokens - 1), np.nan)
    return pd.DataFrame(
        {
            "seq_id": seq_ids,
            "arrival_s": arrival,
            "prompt_len": np.asarray(ra["prompt_len"], dtype=np.int64),
            "completion_tokens": tokens,
            "ttft_s": position["first"] - arrival,
            "tpot_s": tpot,
            "e2e_s": position["last"] - arrival,
            "queue_s": queue,
            "preemptions": preempted,
            "finish_reason": reason.astype(str),
        }
    )


def _stats(name: str, values: np.ndarray, out: dict[str, float]) -> None:
    finite = values[np.isfinite(values)]
    out[f"{name}_mean_s"] = float(finite.mean()) if len(finite) else float("nan")
    for p in PERCENTILES:
        out[f"{name}_p{p}_s"] = float(np.percentile(finite, p)) if len(finite) else float("nan")


def compute(events: RecordedEvents, timed: bool | None = None) -> RunMetrics:
    """Every metric of one run. ``timed=False`` (default: ``has_timings``) blanks time metrics."""
    timed = has_timings(events) if timed is None else timed
    header = events.header
    num_blocks = int(header.get("num_blocks") or header.get("config", {}).get("num_kvcache_blocks"))
    block_size = int(header.get("block_size") or header["config"]["kvcache_block_size"])
    per_step = _per_step(events, num_blocks)
    steps = per_step["step"].to_numpy()
    end = per_step["time_s"].to_numpy() if timed else np.full(len(steps), np.nan)
    per_request = _per_request(events, end, steps)
    if not timed:
        per_request["queue_s"] = np.nan
    served = per_request[per_request["finish_reason"] != "rejected"]
    completion = int(per_request["completion_tokens"].sum())
    summary: dict[str, float] = {
        "requests": float(len(per_request)),
        "rejected": float(len(per_request) - len(served)),
        "steps": float(len(per_step)),
        "completion_tokens": float(completion),
    }
    arrival = served["arrival_s"].to_numpy()
    makespan = float(end[-1] - arrival.min()) if len(end) and len(arrival) else float("nan")
    summary["makespan_s"] = makespan
    summary["throughput_tok_s"] = completion / makespan if makespan > 0 else float("nan")
    for name in LATENCIES:
        _stats(name, served[f"{name}_s"].to_numpy(dtype=float), summary)
    summary["preemptions"] = float(len(events.tables["preempted"]["seq_id"]))
    hit_tokens = len(events.tables["block_hit"]["seq_id"]) * block_size
    prefill_tokens = int(np.asarray(events.tables["model_step"]["prefill_tokens"]).sum())
    total = hit_tokens + prefill_tokens
    summary["prefix_hit_rate"] = hit_tokens / total if total else 0.0
    batch = per_step["num_seqs"].to_numpy(dtype=float)
    kv = per_step["kv_blocks_used"].to_numpy(dtype=float)
    summary["batch_size_mean"] = float(batch.mean()) if len(batch) else 0.0
    summary["batch_size_p50"] = float(np.percentile(batch, 50)) if len(batch) else 0.0
    summary["batch_size_max"] = float(batch.max()) if len(batch) else 0.0
    summary["kv_blocks_mean"] = float(kv.mean()) if len(kv) else 0.0
    summary["kv_blocks_max"] = float(kv.max()) if len(kv) else 0.0
    summary["kv_usage_max"] = summary["kv_blocks_max"] / num_blocks if num_blocks else 0.0
    if not timed:
        per_step["time_s"] = np.nan
    return RunMetrics(summary, per_request, per_step)


# Metrics --compare reports, with how to print them.
COMPARED: tuple[tuple[str, str], ...] = (
    ("throughput_tok_s", "{:.1f}"),
    ("makespan_s", "{:.3f}"),
    ("ttft_mean_s", "{:.4f}"),
    ("ttft_p50_s", "{:.4f}"),
    ("ttft_p99_s", "{:.4f}"),
    ("tpot_mean_s", "{:.5f}"),
    ("tpot_p50_s", "{:.5f}"),
    ("tpot_p99_s", "{:.5f}"),
    ("e2e_mean_s", "{:.3f}"),
    ("e2e_p50_s", "{:.3f}"),
    ("e2e_p99_s", "{:.3f}"),
    ("queue_mean_s", "{:.4f}"),
    ("queue_p50_s", "{:.4f}"),
    ("steps", "{:.0f}"),
    ("preemptions", "{:.0f}"),
    ("prefix_hit_rate", "{:.4f}"),
    ("batch_size_mean", "{:.2f}"),
    ("kv_blocks_max", "{:.0f}"),
)


def relative_error(predicted: float, measured: float) -> float:
    """(predicted - measured) / measured; 0 when both are 0, NaN when measured alone is 0."""
    if measured == 0:
        return 0.0 if predicted == 0 else float("nan")
    return (predicted - measured) / measured


