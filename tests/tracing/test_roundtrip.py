"""Round trip: events recorded to Parquet and read back equal the in-memory events."""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd
import pytest
from _trace_helpers import (
    Req,
    Workload,
    assert_same_events,
    in_memory,
    record,
    reference_like,
    run_engine,
)
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tracing import SCHEMA_VERSION, ParquetRecorder, TraceError, read_trace
from tracing.schema import EVENT_KINDS, arrow_schema


@pytest.mark.parametrize("writer", ["thread", "process"])
def test_reference_like_round_trip(tmp_path: Path, writer: str) -> None:
    """A workload with prefix hits and preemptions reads back equal, header and summary intact,
    whether the segments are written by threads of the engine's process or by a child process."""
    workload = reference_like()
    expected = in_memory(workload)
    assert expected.tables["preempted"]["event_id"], "workload should preempt"
    assert expected.tables["block_hit"]["event_id"], "workload should hit the prefix cache"
    recorder = record(workload, tmp_path / "t", flush_steps=7, writer=writer)
    trace = read_trace(tmp_path / "t")
    assert_same_events(trace, expected)
    assert trace.complete
    assert trace.header["schema_version"] == SCHEMA_VERSION
    assert trace.header["block_size"] == workload.block_size
    assert trace.header["config"]["num_kvcache_blocks"] == workload.num_blocks
    assert trace.summary is not None
    assert trace.summary["counts"] == {k: len(v["event_id"]) for k, v in expected.tables.items()}
    assert trace.summary["steps"] == len(expected.tables["model_step"]["event_id"])
    assert trace.summary["segments"] == trace.segments == recorder.num_segments > 1
    assert trace.summary["recorder"]["writer"] == writer
    assert trace.summary["trace_bytes"] == recorder.bytes_written > 0
    assert trace.last_step == trace.summary["steps"] - 1
    assert trace.num_events == sum(trace.counts().values())
    for kind in EVENT_KINDS:
        assert trace.table(kind).schema.equals(arrow_schema(kind))


prompts = st.lists(st.integers(0, 50), min_size=1, max_size=40)


@st.composite
def workloads(draw: st.DrawFn) -> Workload:
    block_size = draw(st.sampled_from([2, 4, 8]))
    # A shared prefix makes prefix-cache hits likely; few blocks make preemptions likely.
    prefix = draw(st.lists(st.integers(0, 50), max_size=3 * block_size))
    requests = [
        Req(
            (prefix if draw(st.booleans()) else []) + draw(prompts),
            draw(st.integers(1, 24)),
            draw(st.sampled_from([0.0, 0.6, 1.0])),
        )
        for _ in range(draw(st.integers(1, 12)))
    ]
    return Workload(
        requests,
        num_blocks=draw(st.integers(4, 48)),
        block_size=block_size,
        max_model_len=96,
        policy=draw(st.sampled_from(["prefill_first", "chunked"])),
        max_num_seqs=draw(st.integers(1, 16)),
    )


@settings(
    max_examples=20,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(
    workload=workloads(),
    flush_steps=st.integers(1, 6),
    background=st.booleans(),
)
def test_generated_workloads_round_trip(
    tmp_path_factory: pytest.TempPathFactory, workload: Workload, flush_steps: int, background: bool
) -> None:
    """For generated workloads (rejections, hits, preemptions, both policies) and any flush
    interval, every table read back equals the MemorySink's, and segments tile the steps."""
    trace_dir = tmp_path_factory.mktemp("trace") / "t"
    expected = in_memory(workload)
    record(workload, trace_dir, flush_steps=flush_steps, background=background)
    trace = read_trace(trace_dir)
    assert_same_events(trace, expected)
    assert trace.complete
    segs = trace.segment_list()
    assert [s.index for s in segs] == list(range(len(segs)))
    through = [s.through_step for s in segs]
    assert through == sorted(through)
    num_steps = len(expected.tables["model_step"]["event_id"])
    assert len(segs) >= num_steps // flush_steps
    events = trace.events()
    assert events.column("event_id").to_pylist() == list(range(trace.num_events))


def test_events_stream_points_at_rows(tmp_path: Path) -> None:
    """``events()`` orders every event by event_id and its ``row`` finds it in its kind's table."""
    record(reference_like(8), tmp_path / "t", flush_steps=2)
    trace = read_trace(tmp_path / "t")
    stream = trace.events().to_pylist()
    assert [e["event_id"] for e in stream] == list(range(len(stream)))
    for e in stream[:: max(1, len(stream) // 50)]:
        row = trace.table(e["kind"]).slice(e["row"], 1).to_pylist()[0]
        assert (row["event_id"], row["step"]) == (e["event_id"], e["step"])


def test_one_liners_with_pandas(tmp_path: Path) -> None:
    """``pd.read_parquet("TRACE/kind")`` gives the reader's rows for every kind, even empty ones."""
    workload = Workload([Req([1, 2, 3], 5), Req([4, 5], 3)], num_blocks=16)
    record(workload, tmp_path / "t", flush_steps=2)
    trace = read_trace(tmp_path / "t")
    assert "preempted" not in trace.kinds
    for kind in EVENT_KINDS:
        df = pd.read_parquet(tmp_path / "t" / kind).sort_values("event_id", ignore_index=True)
        assert list(df.columns) == list(arrow_schema(kind).names)
        assert len(df) == trace.table(kind).num_rows
        if len(df):
            pd.testing.assert_frame_equal(df, trace.df(kind))


def test_one_liners_with_duckdb(tmp_path: Path) -> None:
    """duckdb (optional extra) reads ``'TRACE/kind/*.parquet'`` with the reader's rows."""
    duckdb = pytest.importorskip("duckdb")
    record(reference_like(8), tmp_path / "t", flush_steps=3)
    trace = read_trace(tmp_path / "t")
    con = duckdb.connect()
    for kind in EVENT_KINDS:
        glob = str(tmp_path / "t" / kind / "*.parquet")
        rows = con.execute(f"SELECT count(*) FROM '{glob}'").fetchone()[0]
        assert rows == trace.table(kind).num_rows
    got = con.execute(
        f"SELECT token_id FROM '{tmp_path / 't' / 'token_sampled' / '*.parquet'}' ORDER BY event_id"
    ).fetchall()
    assert [r[0] for r in got] == trace.table("token_sampled").column("token_id").to_pylist()


def test_flush_seconds_zero_flushes_every_step(tmp_path: Path) -> None:
    """With flush_seconds=0 the time rule fires at every step: one segment per step (+ close)."""
    workload = Workload([Req([1, 2, 3], 4)], num_blocks=8)
    recorder = record(workload, tmp_path / "t", flush_steps=1000, flush_seconds=0.0)
    trace = read_trace(tmp_path / "t")
    steps = trace.summary["steps"]
    assert recorder.num_segments in (steps, steps + 1)
    assert [s.through_step for s in trace.segment_list()][:steps] == list(range(steps))


def test_trailing_events_after_last_step(tmp_path: Path) -> None:
    """Events emitted after the last step (a late rejected request) are flushed by close and
    ``last_step`` covers them."""
    workload = Workload([Req([1, 2, 3], 2)], num_blocks=8, max_model_len=16)
    recorder = ParquetRecorder(tmp_path / "t", flush_steps=1, fsync=False)
    summary = run_engine(workload, recorder, late_requests=[Req(list(range(40)), 2)])
    trace = read_trace(tmp_path / "t")
    finished = trace.df("request_finished")
    assert finished["reason"].tolist() == ["length", "rejected"]
    assert trace.last_step == summary["steps"] == int(finished["step"].max())


def test_header_gets_schema_version_and_is_json(tmp_path: Path) -> None:
    """``run.json`` is the header passed to open() plus schema_version (a wrong one is replaced)."""
    rec = ParquetRecorder(tmp_path / "t", fsync=False)
    rec.open({"schema_version": 99, "config": {"a": (1, 2)}, "odd": {3, 4}})
    header = json.loads((tmp_path / "t" / "run.json").read_text())
    assert header["schema_version"] == SCHEMA_VERSION
    assert header["config"] == {"a": [1, 2]} and header["odd"] == [3, 4]


def test_refuses_to_overwrite_a_trace(tmp_path: Path) -> None:
    """Recording into a complete trace raises unless overwrite=True; a trace directory that
    also holds a user's file is never replaced (the file and the trace stay)."""
    workload = Workload([Req([1, 2, 3], 2)], num_blocks=8)
    record(workload, tmp_path / "t")
    with pytest.raises(TraceError, match="already holds a complete trace.*--force"):
        ParquetRecorder(tmp_path / "t").open({})
    (tmp_path / "t" / "notes.txt").write_text("mine")
    with pytest.raises(TraceError, match="notes.txt"):
        record(Workload([Req([7], 1)], num_blocks=8), tmp_path / "t", overwrite=True)
    assert (tmp_path / "t" / "notes.txt").read_text() == "mine"
    assert read_trace(tmp_path / "t").counts()["request_added"] == 1
    (tmp_path / "t" / "notes.txt").unlink()
    record(Workload([Req([7], 1), Req([8], 1)], num_blocks=8), tmp_path / "t", overwrite=True)
    assert read_trace(tmp_path / "t").counts()["request_added"] == 2


@pytest.mark.parametrize("background, writer",
                         [(True, "thread"), (False, "thread"), (True, "process")])
def test_write_failure_surfaces_and_leaves_a_readable_prefix(
    tmp_path: Path, background: bool, writer: str
) -> None:
    """A segment that cannot be written raises TraceError in the engine's thread; later segments
    are never committed past it, so the trace still reads as the prefix before the failure."""
    workload = reference_like(8)
    recorder = ParquetRecorder(tmp_path / "t", flush_steps=2, fsync=False, background=background,
                               writer=writer)
    # A plain file where the kind's directory must go (put there once the recorder has claimed
    # the directory) makes every write of that kind fail.
    opened = recorder.open

    def open_then_block(header: dict) -> None:
        opened(header)
        (tmp_path / "t" / "token_sampled").write_text("in the way")

    recorder.open = open_then_block  # type: ignore[method-assign]
    with pytest.raises(TraceError, match="token_sampled") as info:
        run_engine(workload, recorder)
    assert "\n" not in str(info.value)
    trace = read_trace(tmp_path / "t")
    assert not trace.complete and trace.segments == 0


def test_invalid_arguments() -> None:
    """Bad flush settings are rejected up front."""
    with pytest.raises(ValueError, match="flush_steps"):
        ParquetRecorder("/nonexistent", flush_steps=0)
    with pytest.raises(ValueError, match="flush_seconds"):
        ParquetRecorder("/nonexistent", flush_seconds=-1)
    with pytest.raises(ValueError, match="writer"):
        ParquetRecorder("/nonexistent", writer="fork")


def test_conversion_rejects_out_of_range_values(tmp_path: Path) -> None:
    """An int that does not fit its column type fails loudly rather than wrapping around."""
    from tracing.events import EventBuffer

    buffer = EventBuffer()
    buffer.emit_tokens_sampled([0], [2**40])
    recorder = ParquetRecorder(tmp_path / "t", background=False, fsync=False)
    recorder.open({})
    with pytest.raises(TraceError, match="token_sampled.*cannot convert events.*OverflowError"):
        recorder.close(buffer, {})
