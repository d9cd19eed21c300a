"""The Perfetto timeline of a server-like run that goes idle around requests finished between
steps: the last running one (a client that disconnects: ``aborted``; a stop string: ``stop``),
or one rejected as it was added while the engine waited."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from _trace_helpers import FakeClock, Req, Workload, _params

from engine.engine_core import EngineCore
from engine.executor import NullExecutor
from tracing import read_trace
from tracing.export import perfetto_events
from tracing.recorder import ParquetRecorder

IDLE_S = 5.0


def _slices(events: list[dict[str, Any]], tid: int) -> list[tuple[float, float]]:
    return sorted((e["ts"], e["ts"] + e["dur"]) for e in events
                  if e["ph"] == "X" and e["tid"] == tid)


@pytest.mark.parametrize("reason", ["aborted", "stop"])
def test_a_request_finished_between_steps_leaves_the_engine_idle(tmp_path: Path,
                                                                 reason: str) -> None:
    """The only running request is finished between steps, then the next one arrives 5 s
    later. The step after the wait used to be drawn over the whole wait (the finish, recorded
    with the next step's number, still counted the request as left in the engine) and the
    "sequences" counter never went back to 0. Now no step slice covers the wait, the next step
    starts when its request was added, and the counter reads no sequence from where the
    engine was left empty."""
    clock = FakeClock()
    workload = Workload([Req([1, 2, 3, 4, 5], 50)], num_blocks=16)
    core = EngineCore(workload.config(), NullExecutor(16, vocab_size=1000),
                      sink=ParquetRecorder(tmp_path / "t", fsync=False),
                      header={"model": {"architecture": "null"}, "device": "cpu: test"},
                      clock=clock)
    first = core.add_request([1, 2, 3, 4, 5], _params(workload.requests[0]))
    for _ in range(3):
        core.step()
    core.finish(first if isinstance(first, int) else first.seq_id, reason)
    idle_from = clock.now
    clock.now += IDLE_S
    core.add_request([7, 8, 9], _params(Req([7, 8, 9], 3)))
    core.run_until_idle()
    core.close()
    trace = read_trace(tmp_path / "t")
    assert trace.table("request_finished").column("reason").to_pylist()[0] == reason
    events = perfetto_events(trace)
    late = [e for e in events if e.get("name") == "added" and e["id"] == 1][0]["ts"]
    steps = _slices(events, 1)
    assert [s for s in steps if s[0] < late - 1.0 and s[1] > idle_from * 1e6 + 1.0] == [], \
        "a step slice spans the idle wait"
    assert any(abs(s[0] - late) <= 1e4 for s in steps)  # the next step starts at the add
    idle = [e for e in events if e["ph"] == "C" and e["name"] == "sequences"
            and e["ts"] < late and e["ts"] > 0]
    assert idle and max(idle, key=lambda e: e["ts"])["args"] == {"running": 0, "waiting": 0}


def test_a_rejected_arrival_does_not_wake_the_idle_engine(tmp_path: Path) -> None:
    """While the engine is idle a request is rejected as it is added (its prompt is longer
    than ``max_model_len``) and the next one comes 5 s later. The step after the wait used to
    start at the rejected request's arrival, drawn over those 5 s though no step ran; it now
    starts when the request it ran was added."""
    clock = FakeClock()
    workload = Workload([Req([1, 2, 3, 4, 5], 4)], num_blocks=16)
    core = EngineCore(workload.config(), NullExecutor(16, vocab_size=1000),
                      sink=ParquetRecorder(tmp_path / "t", fsync=False),
                      header={"model": {"architecture": "null"}, "device": "cpu: test"},
                      clock=clock)
    core.add_request([1, 2, 3, 4, 5], _params(workload.requests[0]))
    core.run_until_idle()
    clock.now += 1.0
    too_long = [1] * (workload.config().max_model_len + 1)
    core.add_request(too_long, _params(Req(too_long, 3)))
    rejected_at = clock.now
    clock.now += IDLE_S
    core.add_request([7, 8, 9], _params(Req([7, 8, 9], 3)))
    core.run_until_idle()
    core.close()
    trace = read_trace(tmp_path / "t")
    assert "rejected" in trace.table("request_finished").column("reason").to_pylist()
    events = perfetto_events(trace)
    late = [e for e in events if e.get("name") == "added" and e["id"] == 2][0]["ts"]
    steps = _slices(events, 1)
    assert [s for s in steps if s[0] < late - 1.0 and s[1] > rejected_at * 1e6 + 1.0] == [], \
        "a step slice spans the wait after the rejection"
    assert any(abs(s[0] - late) <= 1e4 for s in steps)
