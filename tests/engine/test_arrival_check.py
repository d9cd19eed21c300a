"""A request's ``arrival_s`` is seconds on the engine's clock (since it started). NaN, an
infinity or a negative time was recorded as given: a negative time to first token, a Perfetto
export stretched to decades (``time.time()`` passed by mistake is the usual source of the
latter; a negative one comes from subtracting the wrong start). Both ``EngineCore.add_request``
and ``LLM.add_request`` now refuse them with one ``InvalidRequestError`` naming the value and
the clock, before anything is recorded."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import pytest

from engine import LLM, SamplingParams
from engine.config import Config
from engine.engine_core import EngineCore
from engine.errors import InvalidRequestError
from engine.executor import NullExecutor
from tracing.schema import EVENT_KINDS
from tracing.sink import MemorySink

PARAMS = SamplingParams(temperature=0.0, max_tokens=2, ignore_eos=True)
BAD = [math.nan, math.inf, -math.inf, -1.0, -1e-9, "0.5", True]


def _message(value: Any) -> str:
    return ("arrival_s must be a finite number of seconds >= 0 on the engine's clock "
            f"(seconds since the engine started, as EngineCore.now() reads), got {value!r}")


def _core(sink: Any) -> EngineCore:
    config = Config(num_kvcache_blocks=16, kvcache_block_size=4, max_model_len=64,
                    max_num_batched_tokens=256, max_num_seqs=4)
    return EngineCore(config, NullExecutor(16, vocab_size=1000), sink=sink,
                      header={"model": {"architecture": "null"}, "device": "cpu: test"})


@pytest.mark.parametrize("arrival", BAD, ids=repr)
def test_the_core_refuses_an_arrival_off_its_clock(arrival: Any) -> None:
    sink = MemorySink()
    core = _core(sink)
    with pytest.raises(InvalidRequestError) as info:
        core.add_request([1, 2, 3], PARAMS, arrival_s=arrival)
    assert str(info.value) == _message(arrival)
    assert "\n" not in str(info.value)
    assert core.next_seq_id == 0 and not core.sequences and not core.has_unfinished()
    assert all(not core.events.tables[kind]["event_id"] for kind in EVENT_KINDS)
    seq = core.add_request([1, 2, 3], PARAMS, arrival_s=0.0)  # the engine still takes requests
    assert seq.seq_id == 0 and seq.arrival_s == 0.0
    core.run_until_idle()
    core.close()
    assert sink.tables["request_added"]["arrival_s"] == [0.0]


def test_the_core_takes_every_arrival_on_its_clock() -> None:
    """0, a later time, an int, and None (now) are all recorded as given."""
    sink = MemorySink()
    core = _core(sink)
    for arrival in (0.0, 2.5, 3, None):
        core.add_request([1, 2, 3], PARAMS, arrival_s=arrival)
    core.run_until_idle()
    core.close()
    arrivals = sink.tables["request_added"]["arrival_s"]
    assert arrivals[:3] == [0.0, 2.5, 3.0] and math.isfinite(arrivals[3]) and arrivals[3] >= 0


@pytest.mark.parametrize("arrival", [math.nan, math.inf, -1.0], ids=repr)
def test_llm_add_request_refuses_it_and_records_nothing(llm: LLM, arrival: float) -> None:
    before = llm.core.next_seq_id
    with pytest.raises(InvalidRequestError, match=r"^arrival_s must be a finite number of "
                       r"seconds >= 0 on the engine's clock \(seconds since the engine started"):
        llm.add_request([1, 2, 3], PARAMS, arrival_s=arrival)
    assert llm.core.next_seq_id == before and llm.is_finished()


@pytest.mark.parametrize("arrival", [math.nan, math.inf, -2.0], ids=repr)
def test_a_trace_recorded_before_the_check_still_replays(tmp_path: Path, arrival: float) -> None:
    """A trace whose ``arrival_s`` holds such a value (recorded before the engine refused it)
    still verifies: the replay and the what-if read that arrival as when the engine added the
    request (``added_s``), since they hand it back to ``add_request``."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from replay.recorded import from_trace
    from replay.verify import verify
    from tracing import read_trace
    from tracing.recorder import ParquetRecorder

    sink = ParquetRecorder(tmp_path / "t", fsync=False)
    core = _core(sink)
    for i in range(4):
        core.add_request([1, 2, 3 + i], PARAMS)
    core.run_until_idle()
    core.close()
    path = next((tmp_path / "t" / "request_added").glob("seg-*.parquet"))
    table = pq.read_table(path)
    arrivals = table.column("arrival_s").to_pylist()
    arrivals[1] = arrival
    index = table.schema.get_field_index("arrival_s")
    pq.write_table(table.set_column(index, table.schema.field(index),
                                    pa.array(arrivals, pa.float64())), path)
    trace = read_trace(tmp_path / "t")
    assert verify(trace).identical
    added = from_trace(trace).tables["request_added"]
    assert added["arrival_s"][1] == added["added_s"][1]
    assert added["arrival_s"].tolist()[::2] == arrivals[::2]
