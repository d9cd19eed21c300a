"""``LLM.generate`` edge cases found in hardening session 30: each failed before its fix."""

from __future__ import annotations

from pathlib import Path

import pytest

from engine import LLM, SamplingParams
from engine.errors import EngineClosedError, InvalidRequestError, ReplayLLMError
from replay.cli.main import main as cli_main

PARAMS = SamplingParams(temperature=0.0, max_tokens=2, ignore_eos=True)


def test_a_single_string_is_one_prompt(llm: LLM) -> None:
    """As in vLLM: ``generate("Hi")`` was five one-character prompts ("H", "e", ...)."""
    one = llm.generate("Hello", PARAMS, use_tqdm=False)
    assert len(one) == 1
    assert one == llm.generate(["Hello"], PARAMS, use_tqdm=False)


@pytest.mark.parametrize("params", ["x", {"max_tokens": 2}, 5, [PARAMS, "x"]],
                         ids=["str", "dict", "int", "list-with-str"])
def test_sampling_params_of_the_wrong_type_are_refused(llm: LLM, params: object) -> None:
    """It was an AttributeError from deep inside the engine (``'str' object has no attribute
    'max_tokens'``)."""
    prompts = ["a", "b"] if isinstance(params, list) else ["a"]
    with pytest.raises(InvalidRequestError, match="sampling_params must be a SamplingParams"):
        llm.generate(prompts, params, use_tqdm=False)  # type: ignore[arg-type]
    assert not llm.core.has_unfinished()


@pytest.mark.parametrize("prompts", [None, 5], ids=["none", "int"])
def test_prompts_that_are_not_a_list_are_refused(llm: LLM, prompts: object) -> None:
    with pytest.raises(InvalidRequestError, match="prompts must be a list"):
        llm.generate(prompts, PARAMS, use_tqdm=False)  # type: ignore[arg-type]


def test_a_bytes_prompt_is_refused_not_read_as_token_ids(llm: LLM) -> None:
    """``b"abc"`` is a sequence of ints: it ran as the token ids [97, 98, 99], silently."""
    with pytest.raises(InvalidRequestError, match="got bytes"):
        llm.generate([b"abc"], PARAMS, use_tqdm=False)  # type: ignore[list-item]


def test_a_prompt_with_a_lone_surrogate_is_refused_by_name(llm: LLM) -> None:
    """It was the tokenizer's ``TypeError: TextInputSequence must be str``."""
    with pytest.raises(InvalidRequestError, match="not valid Unicode text"):
        llm.generate(["ok", "bad \ud800"], PARAMS, use_tqdm=False)
    assert not llm.core.has_unfinished()


def test_a_bad_prompt_late_in_a_batch_queues_nothing(llm: LLM) -> None:
    """The prompts before the bad one stayed queued and ran (and were recorded) inside the next
    ``generate`` call; vLLM's ``LLM.generate`` leaves nothing behind either."""
    before = llm.core.next_seq_id
    with pytest.raises(InvalidRequestError):
        llm.generate(["a", "b", None], PARAMS, use_tqdm=False)  # type: ignore[list-item]
    with pytest.raises(InvalidRequestError, match="does not fit"):
        llm.generate(["a", [1, 2**40]], PARAMS, use_tqdm=False)
    assert llm.core.next_seq_id == before and not llm.core.has_unfinished()
    assert len(llm.generate(["c"], PARAMS, use_tqdm=False)) == 1


@pytest.mark.parametrize("priority", ["x", 2**31, 1.5, None], ids=["str", "past-int32", "float",
                                                                    "none"])
def test_a_bad_priority_is_refused_and_the_trace_stays_whole(tmp_path: Path,
                                                             priority: object) -> None:
    """A priority the trace's int32 column cannot hold was queued and run; the recorder then
    failed (``TraceError: cannot convert events``) at the next flush and at ``close``, and
    the trace was lost."""
    trace = tmp_path / "t"
    llm = LLM(None, trace_dir=str(trace), calibration_repeats=0)
    with pytest.raises(InvalidRequestError, match="priority must be an integer"):
        llm.generate(["a", "b"], PARAMS, use_tqdm=False,
                     priorities=[0, priority])  # type: ignore[list-item]
    assert llm.generate(["c"], PARAMS, use_tqdm=False, priorities=[-3])[0]["error"] is None
    assert llm.close()["requests"] == 1
    assert cli_main(["verify", str(trace)]) == 0


def test_an_engine_used_after_close_says_so(tmp_path: Path) -> None:
    """It was ``RuntimeError: ModelRunner.execute called after close()`` once a step ran, the
    request already queued on a closed engine."""
    llm = LLM(None, record_events=False, calibration_repeats=0)
    summary = llm.close()
    assert llm.close()["requests"] == summary["requests"]  # a second close is harmless
    for use in (lambda: llm.generate(["Hi"], PARAMS, use_tqdm=False),
                lambda: llm.add_request("Hi", PARAMS), llm.step):
        with pytest.raises(EngineClosedError, match="closed") as caught:
            use()
        assert isinstance(caught.value, ReplayLLMError)
    with LLM(None, record_events=False, calibration_repeats=0) as engine:
        assert len(engine.generate("Hi", PARAMS, use_tqdm=False)) == 1
    with pytest.raises(EngineClosedError):
        engine.generate(["Hi"], PARAMS, use_tqdm=False)
