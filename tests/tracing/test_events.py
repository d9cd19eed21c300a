"""``EventBuffer.reserve_ids`` and ``extend_rows``: rows appended in bulk get the ids handed out
for them, interleaving with rows emitted one by one; a bulk append needs every column."""

from __future__ import annotations

import pytest

from tracing.events import EventBuffer, NullEventBuffer


def test_reserved_ids_interleave_with_emitted_rows() -> None:
    events = EventBuffer()
    first = events.reserve_ids(2)
    events.emit_preempted(seq_id=1, blocks_released=2, for_seq_id=-1, num_tokens=9)
    events.extend_rows("token_sampled", {"event_id": [first, first + 1], "step": [0, 0],
                                         "seq_id": [4, 5], "token_id": [7, 8]})
    assert first == 0 and events.tables["preempted"]["event_id"] == [2]
    assert events.tables["token_sampled"]["event_id"] == [0, 1]
    assert events.tables["token_sampled"]["token_id"] == [7, 8]
    assert events.next_event_id == 3


def test_extend_rows_needs_every_column_of_one_length() -> None:
    events = EventBuffer()
    with pytest.raises(ValueError, match="columns"):
        events.extend_rows("token_sampled", {"event_id": [0], "step": [0], "seq_id": [1]})
    with pytest.raises(ValueError, match="one length"):
        events.extend_rows("token_sampled", {"event_id": [0], "step": [0], "seq_id": [1, 2],
                                             "token_id": [3]})
    assert events.tables["token_sampled"]["event_id"] == []


def test_a_null_buffer_keeps_no_bulk_rows() -> None:
    events = NullEventBuffer()
    events.extend_rows("token_sampled", {"event_id": [0]})
    assert events.num_events() == 0
