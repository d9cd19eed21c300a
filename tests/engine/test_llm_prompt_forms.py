"""Token-id prompts in the forms users hold them: numpy arrays and numpy integers are token ids,
and a prompt that is not one says what it holds.

Before: ``LLM.generate([np.array([...])])`` and a list of ``np.int64`` ids (what a tokenizer's
``return_tensors="np"`` gives) were refused with ``got ndarray`` / ``got list`` -- the latter
naming the very type the message asks for.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from engine import SamplingParams
from engine.errors import InvalidRequestError

GREEDY = SamplingParams(temperature=0.0, max_tokens=4)
IDS = [9707, 11, 1879, 0, 1]  # 0 and 1 are real tokens ('!' and '"'), never bools


def test_numpy_prompts_give_the_list_prompts_answer(llm: Any) -> None:
    """A 1-D integer array, a list of numpy integers and a list of ints answer alike."""
    want = llm.generate([IDS], GREEDY, use_tqdm=False)[0]
    forms = [np.array(IDS), np.array(IDS, dtype=np.int32), [np.int64(t) for t in IDS],
             np.array(IDS, dtype=np.uint32)]
    for got in llm.generate(forms, GREEDY, use_tqdm=False):
        assert got["error"] is None
        assert list(got["token_ids"]) == list(want["token_ids"])
        assert all(type(t) is int for t in got["token_ids"])


@pytest.mark.parametrize("prompt, named", [
    ([1.0, 2], "float"), ([True, 5], "bool"), ([5, False], "bool"), (np.array([1.5]), "float"),
    (np.array([True, False]), "bool"), ([5, "6"], "str"), ([[5, 6]], "list"),
    (np.array([[5, 6]]), "2-D"),
])
def test_a_prompt_that_is_not_token_ids_says_what_it_holds(llm: Any, prompt: Any,
                                                           named: str) -> None:
    with pytest.raises(InvalidRequestError, match=named):
        llm.generate([prompt], GREEDY, use_tqdm=False)


def test_ids_outside_the_vocabulary_or_int32_keep_their_verdicts(llm: Any) -> None:
    """The one-pass check keeps the rules: out of the vocabulary is recorded as rejected, past
    int32 is refused before anything is queued."""
    out = llm.generate([[5, llm.vocab_size], np.array([-3, 5])], GREEDY, use_tqdm=False)
    assert [o["finish_reason"] for o in out] == ["rejected", "rejected"]
    assert "token id -3" in out[1]["error"]
    with pytest.raises(InvalidRequestError, match="int32"):
        llm.generate([[5, 2**40]], GREEDY, use_tqdm=False)
    with pytest.raises(InvalidRequestError, match="int32"):
        llm.generate([np.array([5, 2**40])], GREEDY, use_tqdm=False)
