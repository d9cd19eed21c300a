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
