"""``inspect`` on the traces scripts meet besides clean ones: a killed run's, one with nothing
committed, one without requests. Its figures agree with the Parquet tables."""

from __future__ import annotations

from pathlib import Path

import numpy as np
from _trace_helpers import Workload, record, reference_like

from tracing import read_trace
from tracing.inspect import describe, prefix_cache_hit_rate
from tracing.layout import COMMITS_DIR


def _killed(tmp_path: Path, keep: int) -> Path:
    """A trace as a killed run leaves it: no summary.json, only the first ``keep`` markers."""
    trace_dir = tmp_path / "t"
    record(reference_like(24), trace_dir, flush_steps=2)
    (trace_dir / "summary.json").unlink()
    for marker in sorted((trace_dir / COMMITS_DIR).glob("seg-*.json"))[keep:]:
        marker.unlink()
    return trace_dir


def _admission_lookups(trace) -> int:  # type: ignore[no-untyped-def]
    """Tokens looked up in the prefix cache, from the scheduling rows: a sequence's prompt at
    its first scheduling, and its context again each time it is scheduled after a preemption."""
    scheduled = trace.columns("seq_scheduled")
    first_seen: dict[int, int] = {}
    for seq_id, event_id in zip(scheduled["seq_id"].tolist(), scheduled["event_id"].tolist()):
        first_seen.setdefault(seq_id, event_id)
    added = trace.columns("request_added")
    total = sum(n for s, n in zip(added["seq_id"].tolist(), added["prompt_len"].tolist())
                if s in first_seen)
    preempted = trace.columns("preempted")
    events = list(zip(scheduled["seq_id"].tolist(), scheduled["event_id"].tolist()))
    for seq_id, event_id, tokens in zip(preempted["seq_id"].tolist(),
                                        preempted["event_id"].tolist(),
                                        preempted["num_tokens"].tolist()):
        if any(s == seq_id and e > event_id for s, e in events):
            total += tokens
    return total


def test_the_hit_rate_of_a_killed_run_counts_only_admitted_requests(tmp_path: Path) -> None:
    """Requests still waiting where a killed run's trace stops were never looked up in the
    prefix cache: counting their prompts made the hit rate of such a trace far too low. Looked-up
    tokens are the admitted prompts plus the contexts of preempted sequences that came back."""
    trace = read_trace(_killed(tmp_path, keep=2))
    assert not trace.complete
    added = trace.columns("request_added")
    scheduled = set(trace.columns("seq_scheduled")["seq_id"].tolist())
    assert set(added["seq_id"].tolist()) - scheduled, "some requests should still be waiting"
    hits, looked_up = prefix_cache_hit_rate(trace)
    assert looked_up == _admission_lookups(trace)
    assert looked_up < int(np.sum(added["prompt_len"]))
    assert f"({hits:,} of {looked_up:,} looked-up tokens)" in describe(trace)


def test_the_hit_rate_of_a_complete_trace_is_unchanged(tmp_path: Path) -> None:
    """On a complete run (every request admitted, every preempted one back) it is still the
    admitted prompts plus the preempted contexts."""
    trace_dir = tmp_path / "t"
    record(reference_like(24), trace_dir)
    trace = read_trace(trace_dir)
    assert trace.table("preempted").num_rows > 0
    _, looked_up = prefix_cache_hit_rate(trace)
    assert looked_up == _admission_lookups(trace) == (
        int(np.sum(trace.columns("request_added")["prompt_len"]))
        + int(np.sum(trace.columns("preempted")["num_tokens"])))


def test_describe_a_trace_with_nothing_committed_or_no_request(tmp_path: Path) -> None:
    """A run killed before its first segment reads as stopped before any step (not "committed
    through step -1"); a run without requests reads as complete with zeros; neither raises."""
    text = describe(read_trace(_killed(tmp_path, keep=0)))
    assert "INCOMPLETE (recording stopped before any step was committed)" in text
    assert "requests 0 " in text and "steps 0 " in text and "step -1" not in text
    empty = tmp_path / "empty"
    record(Workload([]), empty)
    text = describe(read_trace(empty))
    assert ": complete;" in text and "requests 0 (finished: none); steps 0 (none)" in text
    assert "prefix cache hit rate n/a (0 of 0 looked-up tokens)" in text


def test_inspect_json_holds_describes_figures_as_numbers(tmp_path: Path, capsys) -> None:  # type: ignore[no-untyped-def]
    """`replayllm inspect TRACE --json` prints one JSON object whose numbers are the tables'
    (requests, steps, completion tokens, finish reasons), complete or killed; the text of
    `describe` is made from the same figures."""
    import json

    from replay.cli.main import main

    demo = Path(__file__).resolve().parents[2] / "traces" / "cpu-tiny-demo"
    for trace_dir, complete in ((demo, True), (_killed(tmp_path, 2), False)):
        assert main(["inspect", str(trace_dir), "--json"]) == 0
        data = json.loads(capsys.readouterr().out)
        trace = read_trace(trace_dir)
        assert data["complete"] is complete and data["last_step"] == trace.last_step
        assert data["requests"] == trace.table("request_added").num_rows
        assert data["steps"] == trace.table("model_step").num_rows
        assert data["completion_tokens"] == trace.table("token_sampled").num_rows
        assert sum(data["finished"].values()) == trace.table("request_finished").num_rows
        assert f"requests {data['requests']:,} " in describe(trace)


def test_a_trace_still_being_recorded_is_not_called_stopped(tmp_path: Path) -> None:
    """`replayllm inspect` on a trace whose recording is under way (a server's, a long run's)
    said "INCOMPLETE (recording stopped; committed through step N)", as for a killed run's.
    While a process holds the trace's lock it now says who records it and how far it is
    committed so far (`--json`: `recording`, "pid N"); once closed, the trace is complete."""
    import os

    from _trace_helpers import FakeClock, _params

    from engine.engine_core import EngineCore
    from engine.executor import NullExecutor
    from tracing.inspect import summarize
    from tracing.recorder import ParquetRecorder

    workload = reference_like(8)
    recorder = ParquetRecorder(tmp_path / "t", fsync=False, flush_steps=1, background=False)
    core = EngineCore(workload.config(), NullExecutor(workload.num_blocks, vocab_size=1000),
                      sink=recorder, clock=FakeClock(),
                      header={"model": {"architecture": "null"}, "device": "cpu: test"})
    for req in workload.requests:
        core.add_request(req.prompt, _params(req))
    for _ in range(3):
        core.step()
    trace = read_trace(tmp_path / "t")
    assert not trace.complete and trace.last_step >= 0
    text = describe(trace)
    assert (f"INCOMPLETE (being recorded by pid {os.getpid()}; committed through step "
            f"{trace.last_step} so far)") in text
    assert "stopped" not in text
    assert summarize(trace)["recording"] == f"pid {os.getpid()}"
    core.run_until_idle()
    core.close()
    closed = read_trace(tmp_path / "t")
    assert closed.complete and summarize(closed)["recording"] is None
    killed = read_trace(_killed(tmp_path / "k", keep=2))  # nobody holds its lock
    assert "INCOMPLETE (recording stopped; committed through step" in describe(killed)
    assert summarize(killed)["recording"] is None


def test_a_killed_overlapped_run_is_summarized_over_the_steps_verify_checks(
        tmp_path: Path) -> None:
    """Under async scheduling the engine schedules step N+1 before step N's segment is cut,
    so a killed run's last segment can hold step N+1's schedule (its admissions, their
    prefix-cache hits) though the trace is committed only through step N. `inspect` counted
    those rows: more events than `verify` reports for the same trace ("1,907 events" against
    "identical: 1898 events", a tiny-model CPU run killed mid-way) and hits of a step that never
    ran. It now sums steps 0 to `last_step`, the prefix `verify` checks: the rows `read_trace`'s
    tables hold (tests/tracing/test_committed_prefix.py)."""
    import pyarrow.parquet as pq
    from _trace_helpers import kill_after_partial_step, record_overlapped

    from replay.verify import verify
    from tracing.inspect import summarize

    full = record_overlapped(reference_like(24), tmp_path / "full")
    trace = read_trace(kill_after_partial_step(full, tmp_path / "cut", "block_hit"))
    on_disk = np.concatenate([
        pq.read_table(f.located(), columns=["step"]).column("step").to_numpy()
        for seg in trace.segment_list() for f in seg.files if f.kind == "block_hit"])
    assert (on_disk > trace.last_step).any()
    s = summarize(trace)
    assert s["num_events"] == verify(trace).num_events == trace.num_events
    size = trace.header["block_size"]
    assert s["prefix_cache_hit_tokens"] == int((on_disk <= trace.last_step).sum()) * size
    assert f"{s['num_events']:,} events" in describe(trace)
