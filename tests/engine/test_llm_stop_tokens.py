"""``LLM.generate`` with stop strings: the text ends before the stop and the token ids end with
the token that completed it (vLLM's rule), whatever the scheduling mode.

Before: with overlapped (asynchronous) scheduling, the default, the next step was already
launched when a stop string was found, and its token came back in ``token_ids``, one past the
stop: the same request gave different token ids with ``async_scheduling=False``.
"""

from __future__ import annotations

import pytest

from engine import LLM, SamplingParams

PROMPT = "The quick brown fox"
GREEDY = {"temperature": 0.0, "max_tokens": 30, "ignore_eos": True}


@pytest.fixture(scope="module")
def reference() -> tuple[str, list[int], list[str]]:
    """The tiny model's greedy answer, its token ids and each token's own text."""
    with LLM(None, record_events=False, calibration_repeats=0) as llm:
        out = llm.generate(PROMPT, SamplingParams(**GREEDY), use_tqdm=False)[0]
        pieces = [llm.tokenizer.decode([t]) for t in out["token_ids"]]
    return out["text"], list(out["token_ids"]), pieces


def _stops(text: str, pieces: list[str]) -> list[tuple[str, ...]]:
    """Stops within one token, across two and three, overlapping ones, one at the first token."""
    start = len(pieces[0]) + len(pieces[1]) - 2  # the last two characters of token 1, on
    across = text[start:start + len(pieces[2]) + 3]  # ... into token 3
    return [(across,), (pieces[2],), (text[:2],), (across, across[1:3]), (across[2:], across),
            (text[len(pieces[0]) - 1:len(pieces[0]) + 1],)]


@pytest.mark.parametrize("overlap", [True, False])
def test_token_ids_end_at_the_token_that_completes_the_stop(
        reference: tuple[str, list[int], list[str]], overlap: bool) -> None:
    text, token_ids, pieces = reference
    ends = [sum(len(p) for p in pieces[:i + 1]) for i in range(len(pieces))]
    assert "".join(pieces) == text  # byte-level BPE: each token's text stands alone here
    with LLM(None, record_events=False, calibration_repeats=0,
             async_scheduling=overlap) as llm:
        for stop in _stops(text, pieces):
            # The first stop to complete as tokens arrive ends the text (vLLM's rule too: of
            # overlapping "de잭 " and "e잭", "e잭" completes a token earlier); of those a token
            # completes together, the one starting first.
            done = {s: next(i for i, end in enumerate(ends) if end >= text.find(s) + len(s))
                    for s in stop}
            last_token = min(done.values())
            first = min(text.find(s) for s in stop if done[s] == last_token)
            out = llm.generate([PROMPT, PROMPT], SamplingParams(**GREEDY, stop=stop),
                               use_tqdm=False)
            for got in out:
                assert got["finish_reason"] == "stop", stop
                assert got["text"] == text[:first], stop
                assert list(got["token_ids"]) == token_ids[:last_token + 1], stop
