"""The Chrome / Perfetto export as real viewers read it: every event placed on a thread, slices
of one track that never overlap, idle gaps left empty, a killed run's requests drawn."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import pytest
from _trace_helpers import FakeClock, Req, Workload, _params, record, reference_like

from engine.engine_core import EngineCore
from engine.executor import NullExecutor
from tracing import read_trace
from tracing.export import export_perfetto, perfetto_events
from tracing.layout import COMMITS_DIR
from tracing.recorder import ParquetRecorder

TRACES = Path(__file__).resolve().parents[2] / "traces"
# A GPU recording with overlapped (async) steps: a step's measured device interval
# [wall_time_s - duration_s, wall_time_s] often starts before the previous step's tokens were back.
OVERLAPPED = TRACES / "matrix-s15b" / "bursty-default"


def _track_slices(events: list[dict[str, Any]], tid: int) -> list[tuple[float, float]]:
    return sorted((e["ts"], e["ts"] + e["dur"]) for e in events
                  if e["ph"] == "X" and e["tid"] == tid)


@pytest.mark.parametrize("source", ["cpu-tiny-demo", "overlapped"])
def test_every_event_is_placed_on_a_thread_with_finite_times(source: str) -> None:
    """Every event has ``ph`` and ``pid``/``tid`` (counters and request spans included: a
    viewer that reads ``tid`` literally, as chrome://tracing does, gets no "undefined" thread);
    every non-metadata event a finite, non-negative ``ts``; the document is strict JSON (no
    NaN) and the same trace gives the same bytes twice."""
    trace = read_trace(TRACES / source if source != "overlapped" else OVERLAPPED)
    events = perfetto_events(trace)
    for event in events:
        assert {"ph", "pid", "tid"} <= set(event), event
        if event["ph"] != "M":
            assert math.isfinite(event["ts"]) and event["ts"] >= 0, event
    assert json.dumps(events, allow_nan=False) == json.dumps(perfetto_events(trace))


def test_model_slices_never_overlap_and_keep_the_measured_duration() -> None:
    """On the "model" track of an overlapped recording no slice starts before the previous one
    ends (viewers need properly nested slices on one thread; Perfetto drops or mis-nests the
    rest); each ends at its step's ``wall_time_s`` and carries the measured ``duration_s``."""
    trace = read_trace(OVERLAPPED)
    events = perfetto_events(trace)
    slices = _track_slices(events, 2)
    assert all(b[0] >= a[1] - 1e-6 for a, b in zip(slices, slices[1:]))
    steps = trace.columns("model_step")
    model = [e for e in events if e["ph"] == "X" and e["tid"] == 2]
    assert [e["args"]["duration_s"] for e in model] == steps["duration_s"].tolist()
    ends = [(e["ts"] + e["dur"]) / 1e6 for e in model]
    assert ends == pytest.approx(steps["wall_time_s"].tolist(), abs=1e-9)
    for tid in (1, 3):  # the steps and the driver tracks too
        slices = _track_slices(events, tid)
        assert all(b[0] >= a[1] - 1e-6 for a, b in zip(slices, slices[1:])), tid


def test_an_idle_gap_is_no_step() -> None:
    """A request arriving 5 s after the engine went idle: no "steps" slice covers the wait (the
    step after it starts when the request was added), and the "sequences" counter shows no
    running or waiting sequence (and every block free) from the idle start on."""
    clock = FakeClock()
    workload = Workload([Req([1, 2, 3, 4, 5], 4)], num_blocks=16)
    sink = _MemoryTrace()
    core = EngineCore(workload.config(), NullExecutor(16, vocab_size=1000), sink=sink,
                      header={"model": {"architecture": "null"}, "device": "cpu: test"},
                      clock=clock)
    core.add_request([1, 2, 3, 4, 5], _params(workload.requests[0]))
    core.run_until_idle()
    idle_from = clock.now
    clock.now += 5.0
    core.add_request([7, 8, 9], _params(Req([7, 8, 9], 3)))
    core.run_until_idle()
    core.close()
    events = sink.events()
    late = [e for e in events if e.get("name") == "added" and e["id"] == 1][0]["ts"]
    steps = _track_slices(events, 1)
    gap = [s for s in steps if s[0] < late - 1.0 and s[1] > idle_from * 1e6 + 1.0]
    assert gap == [], "a step slice spans the idle wait"
    assert any(abs(s[0] - late) <= 1e4 for s in steps)  # the next step starts at the add
    idle = [e for e in events if e["ph"] == "C" and e["name"] == "sequences"
            and idle_from * 1e6 - 1e4 <= e["ts"] < late]
    assert idle and idle[-1]["args"] == {"running": 0, "waiting": 0}
    free = [e for e in events if e["ph"] == "C" and e["name"] == "free KV blocks"
            and e["ts"] == idle[-1]["ts"]]
    assert free[-1]["args"] == {"free": 16}


class _MemoryTrace:
    """Records into a temporary trace directory and exports it."""

    def __init__(self) -> None:
        import tempfile

        self._dir = Path(tempfile.mkdtemp()) / "t"
        self._recorder = ParquetRecorder(self._dir, fsync=False)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._recorder, name)

    def events(self) -> list[dict[str, Any]]:
        return perfetto_events(read_trace(self._dir))


def test_a_killed_runs_unfinished_requests_have_spans(tmp_path: Path) -> None:
    """In the trace of a killed run (the last commit markers and summary.json gone) every
    request added gets a span: an unfinished one up to the end of the last committed step,
    reason "unfinished", with the tokens it had generated."""
    trace_dir = tmp_path / "t"
    record(reference_like(16), trace_dir, flush_steps=2)
    (trace_dir / "summary.json").unlink()
    markers = sorted((trace_dir / COMMITS_DIR).glob("seg-*.json"))
    for marker in markers[len(markers) // 2:]:
        marker.unlink()
    trace = read_trace(trace_dir)
    assert not trace.complete
    out = export_perfetto(trace, tmp_path / "x.json")
    events = json.loads(out.read_text())["traceEvents"]
    added = set(trace.columns("request_added")["seq_id"].tolist())
    finished = set(trace.columns("request_finished")["seq_id"].tolist())
    assert added - finished, "the cut should leave requests unfinished"
    begins = {e["id"]: e for e in events if e["ph"] == "b"}
    ends = {e["id"]: e["ts"] for e in events if e["ph"] == "e"}
    assert set(begins) == set(ends) == added
    last_end = max(trace.columns("model_step")["wall_time_s"].tolist()) * 1e6
    tokens = trace.columns("token_sampled")["seq_id"].tolist()
    for seq_id in added - finished:
        assert begins[seq_id]["args"]["reason"] == "unfinished"
        assert begins[seq_id]["args"]["completion_tokens"] == tokens.count(seq_id)
        assert ends[seq_id] == pytest.approx(max(last_end, begins[seq_id]["ts"]))


def test_preemptions_and_prefix_hits_show_in_the_request_spans() -> None:
    """On the committed demo (5 preemptions, prefix sharing) each preemption is a "preempted"
    instant in its request's span, inside it, with the recorded row as args; each span's args
    hold the tokens its admissions took from the prefix cache (block_hit rows x block size)."""
    trace = read_trace(TRACES / "cpu-tiny-demo")
    events = perfetto_events(trace)
    preempted = trace.columns("preempted")
    marks = [e for e in events if e.get("name") == "preempted"]
    assert sorted((e["id"], e["args"]["step"]) for e in marks) == sorted(
        zip(preempted["seq_id"].tolist(), preempted["step"].tolist()))
    spans = {e["id"]: e for e in events if e["ph"] == "b"}
    ends = {e["id"]: e["ts"] for e in events if e["ph"] == "e"}
    assert all(spans[e["id"]]["ts"] <= e["ts"] <= ends[e["id"]] for e in marks)
    hits = trace.columns("block_hit")["seq_id"].tolist()
    size = trace.header["block_size"]
    assert {i: s["args"]["prefix_cache_hit_tokens"] for i, s in spans.items()} == {
        i: hits.count(i) * size for i in spans}
    assert sum(s["args"]["prefix_cache_hit_tokens"] for s in spans.values()) > 0


def _strict_json(text: str) -> Any:
    """``json.loads`` refusing NaN and Infinity, which are not JSON (Perfetto rejects the file)."""
    def refuse(constant: str) -> Any:
        raise ValueError(f"{constant} is not JSON")

    return json.loads(text, parse_constant=refuse)


@pytest.mark.parametrize("arrival", [float("nan"), float("inf")])
def test_a_non_finite_arrival_still_exports_strict_json(tmp_path: Path, arrival: float) -> None:
    """``LLM.add_request(..., arrival_s=...)`` recorded what it was given, NaN or infinity
    included, until it refused them (tests/engine/test_arrival_check.py): the export wrote
    ``"ts":NaN`` (or ``Infinity``) for that request's span, which is not JSON, and
    ui.perfetto.dev and chrome://tracing refused the whole file. In such a trace (here one
    edited to hold it) the span starts when the engine added the request, its ``ttft_s`` null;
    the others are unchanged."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    record(reference_like(6), tmp_path / "t")
    path = next((tmp_path / "t" / "request_added").glob("seg-*.parquet"))
    table = pq.read_table(path)
    arrivals = table.column("arrival_s").to_pylist()
    arrivals[2] = arrival
    index = table.schema.get_field_index("arrival_s")
    pq.write_table(table.set_column(index, table.schema.field(index),
                                    pa.array(arrivals, pa.float64())), path)
    trace = read_trace(tmp_path / "t")
    out = export_perfetto(trace, tmp_path / "x.json")
    events = _strict_json(out.read_text())["traceEvents"]
    begins = {e["id"]: e for e in events if e["ph"] == "b"}
    added = {e["id"]: e["ts"] for e in events if e.get("name") == "added"}
    assert begins[2]["ts"] == added[2] and begins[2]["args"]["ttft_s"] is None
    assert all(math.isfinite(begins[i]["args"]["ttft_s"]) for i in begins if i != 2)


def test_a_damaged_step_time_is_one_line_not_an_invalid_file(tmp_path: Path) -> None:
    """A model step whose ``wall_time_s`` reads NaN (a damaged or hand-edited trace) cannot be
    placed on the timeline: ``replayllm export`` says so in one line, exit 2, and writes no
    file, where it wrote one that no viewer loads."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from replay.cli.main import main

    record(reference_like(6), tmp_path / "t")
    path = next((tmp_path / "t" / "model_step").glob("seg-*.parquet"))
    table = pq.read_table(path)
    walls = table.column("wall_time_s").to_pylist()
    walls[1] = float("nan")
    index = table.schema.get_field_index("wall_time_s")
    pq.write_table(table.set_column(index, table.schema.field(index),
                                    pa.array(walls, pa.float64())), path)
    assert main(["export", str(tmp_path / "t"), "--out", str(tmp_path / "x.json")]) == 2
    assert not (tmp_path / "x.json").exists()
