"""The recorder hands int32-array prompts to Arrow as one joined buffer (tracing/convert.py).

Before: every prompt id went through ``np.fromiter`` one Python int at a time (~20-40 ns an
id, on the engine's thread every ``STAGE_STEPS`` steps). The buffer path must give the very
table the per-id path gives, for arrays, lists and a mix of both.
"""

from __future__ import annotations

from array import array

import pytest

from tracing.convert import columns_to_table
from tracing.events import EventBuffer

PROMPTS = [[5, 6, 7], [], [2**31 - 1, -(2**31), 0], [9] * 300]


def _table(prompts: list) -> object:
    events = EventBuffer()
    for seq_id, prompt in enumerate(prompts):
        events.emit_request_added(seq_id, 0.0, prompt, 0.0, 4, True, added_s=0.0)
    return columns_to_table("request_added", events.drain()["request_added"])


@pytest.mark.parametrize("form", ["arrays", "mixed"])
def test_array_prompts_make_the_table_lists_make(form: str) -> None:
    as_arrays = [array("i", p) if form == "arrays" or i % 2 else p for i, p in enumerate(PROMPTS)]
    got, want = _table(as_arrays), _table(PROMPTS)
    assert got.equals(want)
    assert got.column("prompt_token_ids").to_pylist() == PROMPTS


def test_the_event_copies_an_array_prompt() -> None:
    """The event keeps its own bytes: the sequence's buffer grows as it decodes."""
    prompt = array("i", [1, 2, 3])
    events = EventBuffer()
    events.emit_request_added(0, 0.0, prompt, 0.0, 4, True)
    prompt.append(4)
    assert columns_to_table("request_added", events.drain()["request_added"]).column(
        "prompt_token_ids").to_pylist() == [[1, 2, 3]]
