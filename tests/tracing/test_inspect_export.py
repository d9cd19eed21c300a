"""``describe`` and ``export_perfetto`` give sane output on recorded traces."""

from __future__ import annotations

import json
import os
import re
from datetime import datetime
from pathlib import Path

import numpy as np
import pytest
from _trace_helpers import Req, Workload, in_memory, record, reference_like

from tracing import read_trace
from tracing.export import export_perfetto, perfetto_events
from tracing.header import git_commit, package_versions, provenance, start_time
from tracing.inspect import describe, prefix_cache_hit_rate


@pytest.fixture
def trace_dir(tmp_path: Path) -> Path:
    path = tmp_path / "t"
    record(reference_like(), path, flush_steps=5)
    return path


def test_describe_reports_the_run(trace_dir: Path) -> None:
    """The summary is a few lines and its figures match the memory sink's counts."""
    expected = in_memory(reference_like())
    text = describe(read_trace(trace_dir))
    lines = text.splitlines()
    assert 3 <= len(lines) <= 8
    assert "complete" in lines[0] and "INCOMPLETE" not in text
    tables = expected.tables
    prompt = sum(tables["request_added"]["prompt_len"])
    assert f"requests {len(tables['request_added']['event_id']):,}" in text
    assert f"steps {len(tables['model_step']['event_id']):,}" in text
    assert f"prompt {prompt:,}, completion {len(tables['token_sampled']['event_id']):,}" in text
    assert f"preemptions {len(tables['preempted']['event_id']):,}" in text
    assert re.search(r"prefix cache hit rate \d+\.\d%", text)
    assert re.search(r"throughput [\d,]+ tok/s", text)


def test_describe_says_where_the_engine_thread_went() -> None:
    """A schema-7 recording's summary adds the engine's own host work and the driver's time
    between steps (``outside_s``) with the step it delayed most; a trace that measured neither
    has no such line."""
    trace = read_trace(Path(__file__).parents[2] / "traces/matrix-s15b/azure-code-default")
    steps = trace.columns("model_step")
    worst = int(np.argmax(steps["outside_s"]))
    line = describe(trace).splitlines()[-1]
    assert line.startswith("engine thread: its own host work ")
    assert f"the driver's between steps {np.sum(steps['outside_s']):.3f} s" in line
    assert f"{1e3 * steps['outside_s'][worst]:.1f} ms, step {steps['step'][worst]})" in line
    old = read_trace(Path(__file__).parents[2] / "traces/h200-reference-s4")  # schema 6
    assert "driver" not in describe(old)


def test_perfetto_export_shows_the_driver(tmp_path: Path) -> None:
    """A schema-7 trace exports a "driver" slice for each step the driver delayed
    (``outside_s``, their total kept) and an "added" instant in each request's span, between
    its arrival and its end; a schema-6 trace exports neither."""
    trace = read_trace(Path(__file__).parents[2] / "traces/matrix-s15b/bursty-default")
    events = perfetto_events(trace)
    driver = [e for e in events if e["ph"] == "X" and e["tid"] == 3]
    outside = np.asarray(trace.columns("model_step")["outside_s"])
    assert len(driver) == int((outside > 0).sum())
    assert sum(e["dur"] for e in driver) == pytest.approx(outside.sum() * 1e6)
    added = {e["id"]: e["ts"] for e in events if e.get("name") == "added"}
    began = {e["id"]: e["ts"] for e in events if e.get("cat") == "request" and e["ph"] == "b"}
    assert len(added) == trace.table("request_added").num_rows
    assert all(added[i] >= began[i] - 1.0 for i in added)  # never before its arrival
    old = perfetto_events(read_trace(Path(__file__).parents[2] / "traces/h200-reference-s4"))
    assert not any(e.get("tid") == 3 and e["ph"] == "X" for e in old)
    assert not any(e.get("name") == "added" for e in old)


def test_hit_rate_counts_hit_blocks_over_looked_up_tokens(trace_dir: Path) -> None:
    """hits = block_hit rows x block size; looked-up = admitted prompts + preempted contexts."""
    trace = read_trace(trace_dir)
    hits, looked_up = prefix_cache_hit_rate(trace)
    assert hits == trace.table("block_hit").num_rows * trace.header["block_size"] > 0
    prompts = sum(trace.table("request_added").column("prompt_len").to_pylist())
    preempted = sum(trace.table("preempted").column("num_tokens").to_pylist())
    assert looked_up == prompts + preempted
    assert 0 < hits < looked_up


def test_describe_flags_an_incomplete_trace(trace_dir: Path) -> None:
    """Without summary.json the first line says INCOMPLETE and where the trace stops."""
    (trace_dir / "summary.json").unlink()
    trace = read_trace(trace_dir)
    assert f"INCOMPLETE (recording stopped; committed through step {trace.last_step})" in (
        describe(trace)
    )


def test_perfetto_export(trace_dir: Path, tmp_path: Path) -> None:
    """Valid trace-event JSON: one model slice and one step slice per model step (with kind and
    batch size), running/waiting and free-block counters per step, and one begin/end pair per
    request with end >= begin."""
    trace = read_trace(trace_dir)
    out = export_perfetto(trace, tmp_path / "trace.json")
    events = json.loads(out.read_text())["traceEvents"]
    steps = trace.table("model_step").to_pylist()
    model = [e for e in events if e["ph"] == "X" and e["tid"] == 2]
    assert [e["args"]["step"] for e in model] == [s["step"] for s in steps]
    assert [e["name"] for e in model] == [s["kind"] for s in steps]
    assert all(e["args"]["num_seqs"] >= 1 and e["dur"] >= 0 for e in model)
    step_slices = [e for e in events if e["ph"] == "X" and e["tid"] == 1]
    assert len(step_slices) == len(steps)
    starts = [e["ts"] for e in step_slices]
    assert starts == sorted(starts)
    counters = {e["name"] for e in events if e["ph"] == "C"}
    assert counters == {"sequences", "free KV blocks"}
    running = [e["args"]["running"] for e in events if e["name"] == "sequences"]
    per_step = trace.table("batch_scheduled").column("num_running").to_pylist()
    # After the per-step samples: none running before the first request and after the last.
    assert running == per_step + [0, 0]
    begins = {e["id"]: e["ts"] for e in events if e["ph"] == "b"}
    ends = {e["id"]: e["ts"] for e in events if e["ph"] == "e"}
    seq_ids = trace.table("request_added").column("seq_id").to_pylist()
    assert set(begins) == set(ends) == set(seq_ids)
    assert all(ends[i] >= begins[i] for i in begins)
    firsts = [e for e in events if e["ph"] == "n"]
    assert all(begins[e["id"]] <= e["ts"] <= ends[e["id"]] for e in firsts)


def test_perfetto_export_of_rejected_request(tmp_path: Path) -> None:
    """A rejected request (no tokens, no steps) still gets a zero-length span, no first token."""
    workload = Workload([Req([1, 2], 3), Req(list(range(200)), 3)], num_blocks=8)
    record(workload, tmp_path / "t")
    out = export_perfetto(read_trace(tmp_path / "t"), tmp_path / "x.json")
    events = json.loads(out.read_text())["traceEvents"]
    assert {e["id"] for e in events if e["ph"] == "b"} == {0, 1}
    assert {e["id"] for e in events if e["ph"] == "n" and e["name"] == "first token"} == {0}


def test_header_helpers(tmp_path: Path) -> None:
    """Versions come from package metadata, start time is ISO 8601 UTC, git is a sha or None."""
    versions = package_versions()
    assert versions["python"].count(".") == 2 and "pyarrow" in versions
    stamp = start_time()
    assert stamp.endswith("Z") and datetime.fromisoformat(stamp.replace("Z", "+00:00"))
    commit = git_commit()
    assert commit is None or re.fullmatch(r"[0-9a-f]{40}(\+dirty)?", commit)
    assert git_commit(tmp_path) is None  # outside a repository: None, never an exception
    assert set(provenance()) == {"versions", "git_commit", "start_time", "host"}
    host = provenance()["host"]
    assert host["model"] and isinstance(host["model"], str) and host["cpus"] == os.cpu_count()
