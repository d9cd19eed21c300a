"""A request's arrival that is not a time on the engine's clock (NaN, infinity, negative: a trace
recorded before ``EngineCore.add_request`` refused them) stands in by one rule,
``tracing.export.arrivals_on_the_clock``: the Perfetto export draws its span from the very time
a replay or what-if hands back to the engine (``replay.recorded``)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
from _trace_helpers import record, reference_like

from replay.recorded import from_trace
from tracing import read_trace
from tracing.export import arrivals_on_the_clock, perfetto_events


def _edit_arrivals(trace_dir: Path, edits: dict[int, float]) -> None:
    path = next((trace_dir / "request_added").glob("seg-*.parquet"))
    table = pq.read_table(path)
    arrivals = table.column("arrival_s").to_pylist()
    for row, value in edits.items():
        arrivals[row] = value
    index = table.schema.get_field_index("arrival_s")
    pq.write_table(table.set_column(index, table.schema.field(index),
                                    pa.array(arrivals, pa.float64())), path)


def test_the_export_and_the_replay_read_a_bad_arrival_alike(tmp_path: Path) -> None:
    """With arrivals NaN, infinity and negative edited in, every request's span in the export
    starts at the arrival ``from_trace`` hands a replay (before: the export drew a negative
    arrival's span from before the engine started, with a TTFT from it, while a replay read it
    as ``added_s``), and exactly the edited requests have a null ``ttft_s``."""
    record(reference_like(6), tmp_path / "t")
    _edit_arrivals(tmp_path / "t", {1: float("nan"), 2: float("inf"), 4: -2.0})
    trace = read_trace(tmp_path / "t")
    replayed = from_trace(trace).tables["request_added"]
    wanted = dict(zip(np.asarray(replayed["seq_id"]).tolist(),
                      np.asarray(replayed["arrival_s"]).tolist()))
    begins = {e["id"]: e for e in perfetto_events(trace) if e["ph"] == "b"}
    assert begins.keys() == wanted.keys()
    for seq_id, event in begins.items():
        assert event["ts"] == wanted[seq_id] * 1e6
    assert all(t >= 0 for t in wanted.values())
    unknown = {i for i, e in begins.items() if e["args"].get("ttft_s", 0.0) is None}
    assert unknown == {1, 2, 4}


def test_the_stand_in_is_added_s_else_the_step_before_else_zero() -> None:
    """The rule itself: a good arrival is kept; a bad one takes ``added_s`` when that is a time
    on the clock, else the end of the last model step before the request's step, else 0."""
    times, measured = arrivals_on_the_clock(
        arrival=[0.5, float("nan"), -1.0, float("inf"), float("nan")],
        added_s=[0.6, 0.7, float("nan"), -3.0, float("nan")],
        added_step=[0, 1, 3, 5, 0],
        steps=[0, 1, 2, 4], step_ends=[1.0, 2.0, 3.0, 4.0])
    assert times.tolist() == [0.5, 0.7, 3.0, 4.0, 0.0]
    assert measured.tolist() == [True, False, False, False, False]
