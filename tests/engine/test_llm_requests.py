"""Request intake of ``LLM``: what a prompt may be, and how a bad one is refused or rejected."""

from __future__ import annotations

import pytest

from engine import LLM, SamplingParams
from engine.errors import InvalidRequestError

PARAMS = SamplingParams(temperature=0.0, max_tokens=2, ignore_eos=True)


def test_a_token_outside_the_vocabulary_rejects_the_request(llm: LLM) -> None:
    """The first offending id and the vocabulary's range are named; the request is recorded as
    rejected, not raised, so a batch still runs its good requests."""
    vocab = llm.vocab_size
    seq = llm.add_request([5, 6, vocab + 3, -1], PARAMS)
    assert llm.rejection(seq) == f"token id {vocab + 3} is outside the vocabulary [0, {vocab})"
    seq = llm.add_request([5, -2], PARAMS)
    assert llm.rejection(seq) == f"token id -2 is outside the vocabulary [0, {vocab})"
    assert llm.rejection(llm.add_request([0, vocab - 1], PARAMS)) is None


@pytest.mark.parametrize("prompt", [[1, True, 2], [1, 2.0], ["a", 1], 7],
                         ids=["bool", "float", "str-token", "int"])
def test_a_prompt_that_is_not_token_ids_is_refused(llm: LLM, prompt: object) -> None:
    with pytest.raises(InvalidRequestError, match="a str or a list of int token ids"):
        llm.add_request(prompt, PARAMS)  # type: ignore[arg-type]


def test_an_int_subclass_other_than_bool_is_a_token_id(llm: LLM) -> None:
    class TokenId(int):
        pass

    assert llm.rejection(llm.add_request([TokenId(3), 4], PARAMS)) is None
