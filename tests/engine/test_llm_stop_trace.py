"""``LLM.generate`` with stop strings under overlapped (async) scheduling records what it returns.

Before: a step of a request watching stop strings was deferred, so the next step was already
launched (and post-processed) when the stop string showed up in the deferred step's tokens. The
request sampled one token past the stop: its ``request_finished`` row counted one completion
token more than the ``token_ids`` returned, its ``output_hash`` was not the hash of the answer,
and the trace's decisions differed from the sequential loop's for the same requests.
"""

from __future__ import annotations

from typing import Any

import pytest

from engine import LLM, SamplingParams
from engine.block_hash import output_hash
from replay.testing.scripted import decision_columns
from tracing.schema import EVENT_KINDS

PROMPT = "The quick brown fox"
GREEDY = {"temperature": 0.0, "max_tokens": 24, "ignore_eos": True}


def _run(overlap: bool, stop_from: tuple[int, int]) -> tuple[list[dict[str, Any]], dict]:
    """Outputs and recorded tables of one plain request and two with a stop string cut out of
    the plain answer's text at ``stop_from`` (characters)."""
    with LLM(None, calibration_repeats=0, async_scheduling=overlap) as llm:
        plain = llm.generate(PROMPT, SamplingParams(**GREEDY), use_tqdm=False)[0]
        stop = plain["text"][stop_from[0]:stop_from[1]]
        outs = llm.generate([PROMPT, PROMPT + " jumps"],
                            SamplingParams(**GREEDY, stop=[stop]), use_tqdm=False)
        llm.close()
        tables = llm.sink.tables
    return [plain, *outs], tables


@pytest.mark.parametrize("stop_from", [(6, 9), (12, 16), (0, 2)])
def test_async_stop_string_trace_counts_the_returned_tokens(stop_from: tuple[int, int]) -> None:
    """Each finished request's recorded count, sampled tokens and output hash are those of the
    ``token_ids`` it returned, and the async run decides exactly as the sequential one."""
    outs, tables = _run(True, stop_from)
    finished = tables["request_finished"]
    sampled = tables["token_sampled"]
    assert any(o["finish_reason"] == "stop" for o in outs)
    for seq_id, out in enumerate(outs):
        row = finished["seq_id"].index(seq_id)
        tokens = list(out["token_ids"])
        assert finished["num_completion_tokens"][row] == len(tokens), (seq_id, out)
        assert finished["output_hash"][row] == output_hash(tokens), seq_id
        recorded = [t for s, t in zip(sampled["seq_id"], sampled["token_id"]) if s == seq_id]
        assert recorded == tokens, seq_id
    _, sequential = _run(False, stop_from)
    for kind in EVENT_KINDS:
        got, want = decision_columns(kind, tables[kind]), decision_columns(kind, sequential[kind])
        got.pop("overlapped", None)  # async_scheduling=False defers nothing: flags differ
        want.pop("overlapped", None)
        assert got == want, kind
