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
from tracing.inspect import header_block_size, header_num_blocks

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


def step_rows(steps: np.ndarray, query: np.ndarray) -> np.ndarray:
    """Row of ``model_step`` for each step number in ``query`` (steps are sorted)."""
    return np.clip(np.searchsorted(steps, query), 0, max(len(steps) - 1, 0))


@dataclass
class RunMetrics:
    """The summary (metric name -> value), one row per request and one row per step."""

    summary: dict[str, float]
    requests: pd.DataFrame
    steps: pd.DataFrame


def step_frame(steps: np.ndarray, kind: object, time_s: np.ndarray, duration_s: np.ndarray,
               num_seqs: np.ndarray, batched_tokens: np.ndarray, free_blocks: np.ndarray,
               num_blocks: int) -> pd.DataFrame:
    """The per-step table from its columns (``batched_tokens``/``free_blocks``: the
    ``batch_scheduled`` rows, used only when there is one per step)."""
    import pandas as pd

    # batch_scheduled and model_step have one row per step each, in the same order.
    paired = len(free_blocks) == len(steps)
    zeros = np.zeros(len(steps), np.int64)
    return pd.DataFrame(
        {
            "step": steps,
            "kind": kind,
            "time_s": time_s,
            "duration_s": duration_s,
            "num_seqs": num_seqs,
            "batched_tokens": batched_tokens if paired else zeros,
            "kv_blocks_used": num_blocks - free_blocks if paired else zeros,
        }
    )


def _per_step(events: RecordedEvents, num_blocks: int) -> pd.DataFrame:
    ms = events.tables["model_step"]
    bs = events.tables["batch_scheduled"]
    return step_frame(
        np.asarray(ms["step"], dtype=np.int64),
        np.asarray(ms["kind"]).astype(str),
        np.asarray(ms["wall_time_s"], dtype=float),
        np.asarray(ms["duration_s"], dtype=float),
        np.asarray(ms["num_seqs"], dtype=np.int64),
        np.asarray(bs["num_batched_tokens"], dtype=np.int64),
        np.asarray(bs["free_blocks"], dtype=np.int64),
        num_blocks,
    )


def _first_last(keys: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Sorted unique keys, the index of each one's first and last row, and its row count."""
    unique, first, counts = np.unique(keys, return_index=True, return_counts=True)
    last = len(keys) - 1 - np.unique(keys[::-1], return_index=True)[1]
    return unique, first, last, counts


def request_frame(
    seq_ids: np.ndarray,
    arrival: np.ndarray,
    prompt_len: np.ndarray,
    tokens: np.ndarray,
    first: np.ndarray,
    last: np.ndarray,
    queue: np.ndarray,
    preempted: np.ndarray,
    reason: np.ndarray,
) -> pd.DataFrame:
    """The per-request table from its columns (``first``/``last``: the times of a request's
    first and last token, NaN where it sampled none)."""
    import pandas as pd

    with np.errstate(invalid="ignore", divide="ignore"):
        tpot = np.where(tokens > 1, (last - first) / (tokens - 1), np.nan)
    return pd.DataFrame(
        {
            "seq_id": seq_ids,
            "arrival_s": arrival,
            "prompt_len": prompt_len,
            "completion_tokens": tokens,
            "ttft_s": first - arrival,
            "tpot_s": tpot,
            "e2e_s": last - arrival,
            "queue_s": queue,
            "preemptions": preempted,
            "finish_reason": reason.astype(str),
        }
    )


def queue_times(began: np.ndarray, arrival: np.ndarray) -> np.ndarray:
    """Queue time: from arrival to ``began``, the end of the step before the first scheduled
    one (-inf where that step is the run's first)."""
    return np.maximum(began - arrival, 0.0)


def step_ends_before(end: np.ndarray, row: np.ndarray) -> np.ndarray:
    """The end of the step before ``model_step`` row ``row`` (-inf for the first row)."""
    return np.where(row > 0, end[np.maximum(row - 1, 0)], -np.inf)


def _per_request(events: RecordedEvents, end: np.ndarray, steps: np.ndarray) -> pd.DataFrame:
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
        tok_time = end[step_rows(steps, np.asarray(ts["step"], dtype=np.int64))]
        position["first"][rows] = tok_time[first]
        position["last"][rows] = tok_time[last]
        tokens[rows] = counts
    queue = np.full(n, np.nan)
    ss = events.tables["seq_scheduled"]
    sched_seq = np.asarray(ss["seq_id"], dtype=np.int64)
    if len(sched_seq) and len(end):
        unique, first, _, _ = _first_last(sched_seq)
        rows = order[np.searchsorted(seq_ids[order], unique)]
        row = step_rows(steps, np.asarray(ss["step"], dtype=np.int64)[first])
        queue[rows] = queue_times(step_ends_before(end, row), arrival[rows])
    preempted = np.zeros(n, np.int64)
    pre_seq = np.asarray(events.tables["preempted"]["seq_id"], dtype=np.int64)
    if len(pre_seq):
        unique, counts = np.unique(pre_seq, return_counts=True)
        preempted[order[np.searchsorted(seq_ids[order], unique)]] = counts
    reason = np.full(n, "", dtype=object)
    fin_seq = np.asarray(rf["seq_id"], dtype=np.int64)
    if len(fin_seq):
        reason[order[np.searchsorted(seq_ids[order], fin_seq)]] = np.asarray(rf["reason"])
    return request_frame(seq_ids, arrival, np.asarray(ra["prompt_len"], dtype=np.int64), tokens,
                         position["first"], position["last"], queue, preempted, reason)


def _stats(name: str, values: np.ndarray, out: dict[str, float]) -> None:
    finite = values[np.isfinite(values)]
    out[f"{name}_mean_s"] = float(finite.mean()) if len(finite) else float("nan")
    for p in PERCENTILES:
        out[f"{name}_p{p}_s"] = float(np.percentile(finite, p)) if len(finite) else float("nan")


@dataclass
class RunTotals:
    """Event counts the summary needs besides the per-request and per-step tables."""

    num_blocks: int
    block_size: int
    preemptions: int
    block_hits: int
    prefill_tokens: int


def compute(events: RecordedEvents, timed: bool | None = None) -> RunMetrics:
    """Every metric of one run. ``timed=False`` (default: ``has_timings``) blanks time metrics."""
    timed = has_timings(events) if timed is None else timed
    num_blocks, block_size = pool_of(events.header)
    per_step = _per_step(events, num_blocks)
    steps = per_step["step"].to_numpy()
    end = per_step["time_s"].to_numpy() if timed else np.full(len(steps), np.nan)
    per_request = _per_request(events, end, steps)
    totals = RunTotals(
        num_blocks, block_size, len(events.tables["preempted"]["seq_id"]),
        len(events.tables["block_hit"]["seq_id"]),
        int(np.asarray(events.tables["model_step"]["prefill_tokens"]).sum()),
    )
    return summarize(per_request, per_step, end, totals, timed)


def pool_of(header: dict) -> tuple[int, int]:
    """(KV blocks, block size) of a run's header (``tracing.inspect``'s rule for each)."""
    num_blocks, block_size = header_num_blocks(header), header_block_size(header)
    if num_blocks is None or block_size is None:
        raise ValueError("the header gives no KV pool (num_blocks, block_size)")
    return num_blocks, block_size


def summarize(per_request: pd.DataFrame, per_step: pd.DataFrame, end: np.ndarray,
              totals: RunTotals, timed: bool) -> RunMetrics:
    """The summary of a run from its per-request and per-step tables (``end``: each step's end
    time, NaN when untimed); blanks the time columns of an untimed run."""
    num_blocks = totals.num_blocks
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
    summary["preemptions"] = float(totals.preemptions)
    hit_tokens = totals.block_hits * totals.block_size
    total = hit_tokens + totals.prefill_tokens
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


