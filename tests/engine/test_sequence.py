"""``Sequence.extend_tokens`` is ``append_token`` once per token, in one call."""

from __future__ import annotations

from engine.sampling_params import SamplingParams
from engine.sequence import Sequence


def _seq() -> Sequence:
    return Sequence(3, [5, 6, 7], SamplingParams(max_tokens=10))


def test_extend_tokens_equals_appending_one_by_one() -> None:
    one, bulk = _seq(), _seq()
    for token in (11, 12, 13):
        one.append_token(token)
    bulk.extend_tokens([11, 12, 13])
    for name in ("token_ids", "num_tokens", "num_computed_tokens", "last_token"):
        assert getattr(bulk, name) == getattr(one, name), name
    assert bulk.completion_token_ids == [11, 12, 13]


def test_extend_tokens_with_none_changes_nothing() -> None:
    seq = _seq()
    seq.extend_tokens([])
    assert (seq.num_tokens, seq.num_computed_tokens, seq.last_token) == (3, 0, 7)
