"""One rule for a killed run's trace, applied where its tables are read: its rows are those of
steps 0 to ``last_step`` (the prefix ``verify`` checks), whatever reads them.

Under async scheduling the engine schedules step N+1 before step N's segment is cut, so a killed
run's last committed segment can hold step N+1's schedule (admissions, block allocations,
prefix-cache hits, hashed blocks) though the trace is committed only through step N. Only
``inspect`` left those rows out; ``read_trace``'s tables, the Perfetto export and the vLLM KV
export (blocks stored for a step that never ran) kept them."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pyarrow.parquet as pq
import pytest
from _trace_helpers import kill_after_partial_step, record_overlapped, reference_like

from replay.recorded import from_trace
from replay.verify import verify
from tracing import read_trace
from tracing.export import perfetto_events
from tracing.inspect import summarize
from tracing.kv_events import trace_kv_batches
from tracing.schema import EVENT_KINDS


@pytest.fixture(scope="module")
def traces(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """(the whole run, the same run killed after a segment holding hits of the step after)."""
    root = tmp_path_factory.mktemp("prefix")
    full = record_overlapped(reference_like(24), root / "full")
    return full, kill_after_partial_step(full, root / "cut", "block_hit")


def _on_disk_steps(trace: Any, kind: str) -> np.ndarray:
    return np.concatenate([
        pq.read_table(f.located(), columns=["step"]).column("step").to_numpy()
        for seg in trace.segment_list() for f in seg.files if f.kind == kind] or [np.zeros(0)])


class _Rows:
    """A trace's header and columns, the rows chosen by ``keep(columns)``: what an exporter
    reading ``columns`` is given."""

    def __init__(self, trace: Any, keep: Any) -> None:
        self.header, self._trace, self._keep = trace.header, trace, keep

    def columns(self, kind: str) -> dict[str, Any]:
        cols = self._trace.columns(kind)
        rows = np.flatnonzero(self._keep(cols))
        return {n: [v[i] for i in rows] if isinstance(v, list) else v[rows]
                for n, v in cols.items()}


def test_read_trace_holds_only_the_committed_steps(traces: tuple[Path, Path]) -> None:
    """Every table (``table``, ``columns``, ``df``, ``events``) and count of the killed run's
    trace holds exactly the whole run's rows of steps 0 to ``last_step``, though its files hold
    more; verify, inspect and whatif's source reading count the same events."""
    full, cut = (read_trace(p) for p in traces)
    assert not cut.complete and full.complete
    extra = {kind: int((_on_disk_steps(cut, kind) > cut.last_step).sum()) for kind in EVENT_KINDS}
    assert extra["block_hit"] and extra["block_hashed"] and extra["block_allocated"]
    for kind in EVENT_KINDS:
        want = full.table(kind).filter(np.asarray(full.table(kind).column("step"))
                                       <= cut.last_step)
        assert cut.table(kind).equals(want), kind
        assert cut.columns(kind)["event_id"].tolist() == want.column("event_id").to_pylist()
        assert len(cut.df(kind)) == cut.counts()[kind] == want.num_rows, kind
    events = cut.events()
    assert events.num_rows == cut.num_events
    assert int(np.max(events.column("step"))) == cut.last_step
    assert verify(cut).num_events == cut.num_events == summarize(cut)["num_events"]
    assert from_trace(cut).num_events == cut.num_events
    assert sum(cut.counts().values()) + sum(extra.values()) == sum(
        f.rows for seg in cut.segment_list() for f in seg.files)


def test_exports_leave_out_the_step_that_never_ran(traces: tuple[Path, Path]) -> None:
    """The KV export publishes exactly what the committed steps stored and removed (it stored
    blocks hashed for the step after, which never ran); the Perfetto timeline's prefix-cache
    hit tokens are those of the committed steps."""
    full, cut = (read_trace(p) for p in traces)
    last_id = cut.segment_list()[-1].last_event_id
    committed = _Rows(full, lambda c: np.asarray(c["step"]) <= cut.last_step)
    in_files = _Rows(full, lambda c: np.asarray(c["event_id"]) <= last_id)  # what it read
    got = list(trace_kv_batches(cut))
    assert got == list(trace_kv_batches(committed))
    assert got != list(trace_kv_batches(in_files))
    hits = _on_disk_steps(cut, "block_hit")
    spans = [e for e in perfetto_events(cut) if e.get("ph") == "b"]
    hit_tokens = sum(e["args"]["prefix_cache_hit_tokens"] for e in spans)
    assert hit_tokens == int((hits <= cut.last_step).sum()) * cut.header["block_size"]
    assert hit_tokens < hits.size * cut.header["block_size"]


def test_size_bytes_survives_a_rename_under_it(traces: tuple[Path, Path], tmp_path: Path,
                                               monkeypatch: pytest.MonkeyPatch) -> None:
    """On a trace being recorded the writer renames a committed segment's file from its
    temporary name to its final one whenever it gets to it: ``size_bytes`` found the final name
    missing, then the temporary one gone when it read its size, and raised FileNotFoundError."""
    import os
    import shutil

    from tracing.layout import tmp_path as temporary

    shutil.copytree(traces[1], tmp_path / "t")
    trace = read_trace(tmp_path / "t")
    want = trace.size_bytes
    moved = trace.segment_list()[-1].files[0].path
    os.rename(moved, temporary(moved))  # committed, not yet renamed
    real_stat = Path.stat

    def racing_stat(self: Path, *args: Any, **kwargs: Any) -> os.stat_result:
        if self == temporary(moved) and real_stat(self).st_size:
            os.rename(self, moved)  # the writer renames it just now
        return real_stat(self, *args, **kwargs)

    monkeypatch.setattr(Path, "stat", racing_stat)
    assert trace.size_bytes == want
