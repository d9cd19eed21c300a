"""A prompt's ids are one int32 array from the frontend to the trace (engine/prompt_ids.py).

Before: the engine held a prompt as a list of Python ints; its ``Sequence``, its
``request_added`` event and a prefill's inputs each held another list, the recorder converted
each id on its own, and every full pass of the garbage collector visited every id of every
queued request (``benchmarks.prompt_path``: ~8 ns a token a pass; an Azure burst's prompts made
a full pass tens of ms on the H200's host). These prove the array path keeps every rule of the
list path: the same verdicts, the same events, the same step inputs, a list to users.
"""

from __future__ import annotations

import gc
from array import array
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from engine import LLM, SamplingParams
from engine.batch import ScheduledBatch
from engine.errors import InvalidRequestError
from engine.prompt_ids import prompt_token_ids
from engine.runner.step_inputs import payload_from_batch
from engine.sequence import Sequence
from tracing.reader import read_trace

GREEDY = SamplingParams(temperature=0.0, max_tokens=3, ignore_eos=True)


@pytest.mark.parametrize("prompt", [[7, 0, 1, 9], (7, 0, 1, 9), np.array([7, 0, 1, 9]),
                                    np.array([7, 0, 1, 9], dtype=np.uint16),
                                    array("i", [7, 0, 1, 9]), [np.int64(7), 0, 1, 9]])
def test_every_prompt_form_is_one_int32_array_with_its_bounds(prompt: Any) -> None:
    ids, bounds = prompt_token_ids(prompt)
    assert isinstance(ids, array) and ids.typecode == "i" and ids.tolist() == [7, 0, 1, 9]
    assert bounds == (0, 9)


@pytest.mark.parametrize("prompt", [[0, 1, True], [False, 5], [3, 1, 0, True, 4]])
def test_a_bool_beside_real_zeros_and_ones_is_still_refused(prompt: list) -> None:
    """``array`` takes a bool as an int: the 0s and 1s are looked at again, and a bool named."""
    with pytest.raises(InvalidRequestError, match="holding bool"):
        prompt_token_ids(prompt)


def test_an_id_past_int32_stays_a_list_for_the_engine_to_refuse() -> None:
    ids, bounds = prompt_token_ids([5, 2**31])
    assert ids == [5, 2**31] and bounds == (5, 2**31)
    ids, _ = prompt_token_ids(np.array([5, -(2**40)]))
    assert ids == [5, -(2**40)]


def test_the_engine_holds_and_records_a_prompt_as_its_own_int32_copy(tmp_path: Path) -> None:
    """The sequence and the event each hold their own copy (the sequence's grows as it
    decodes); neither is the caller's list, the collector visits no id, and the trace reads
    back the prompt."""
    prompt = [11, 12, 13, 14]
    llm = LLM(None, trace_dir=str(tmp_path / "t"), calibration_repeats=0)
    seq = llm.add_request(prompt, GREEDY)
    recorded = llm.core.events.tables["request_added"]["prompt_token_ids"][-1]
    assert isinstance(seq.token_ids, array) and isinstance(recorded, array)
    assert recorded is not seq.token_ids and recorded.tolist() == prompt
    for held in (seq.token_ids, recorded):  # a collector's pass visits no id of either
        assert not [item for item in gc.get_referents(held) if isinstance(item, int)]
    while not llm.is_finished():
        llm.step()
    llm.close()
    assert recorded.tolist() == prompt == [11, 12, 13, 14] and len(seq.token_ids) == 7
    column = read_trace(tmp_path / "t").table("request_added")["prompt_token_ids"]
    assert column.to_pylist() == [prompt]


def test_users_get_lists_back(llm: LLM) -> None:
    out = llm.generate([[11, 12, 13]], GREEDY, use_tqdm=False)[0]
    assert type(out["token_ids"]) is list and len(out["token_ids"]) == 3


def test_a_prefill_payload_is_the_prompts_slices_in_one_int32_buffer() -> None:
    """Two prompt chunks and a decode row in one (mixed) step: the same ids, in order, as the
    list path gave, held as one int32 array."""
    seqs = [Sequence(0, [1, 2, 3, 4, 5], GREEDY), Sequence(1, array("i", [6, 7, 8]), GREEDY),
            Sequence(2, [9, 10], GREEDY)]
    seqs[2].append_token(11)
    batch = ScheduledBatch(step=0, kind="mixed", seqs=seqs, num_new_tokens=[3, 3, 1],
                           context_lens=[3, 3, 3], num_prefill_seqs=2)
    payload = payload_from_batch(batch, decode=False)
    assert isinstance(payload.input_ids, array)
    assert payload.input_ids.tolist() == [1, 2, 3, 6, 7, 8, 11]


def test_the_graph_paths_stage_an_int32_payload_as_they_staged_a_list() -> None:
    """The CUDA-graph prefill and mixed steps write a payload's ids into numpy staging buffers
    (``stage_prefill``, ``stage_mixed``): an int32 array stages the very values a list did."""
    import numpy as np

    from engine.runner.mixed_graphs import stage_mixed
    from engine.runner.prefill_graphs import STAGED_ROWS, stage_prefill

    ids = [5, 6, 7, 8, 9, 10, 42]  # two prompt chunks (3 and 3 tokens), one decode row
    query, context, tables = [3, 3, 1], [3, 5, 9], [[0], [1, 2], [3, 4, 5]]

    def staged(form: Any, mixed: bool) -> list[np.ndarray]:
        i64 = np.full((STAGED_ROWS, 32), -7, dtype=np.int64)
        i32 = np.zeros(64, dtype=np.int32)
        blocks = np.zeros((24, 8), dtype=np.int32)
        if mixed:
            stage_mixed(i64, i32, blocks, form, query, context, tables, 2, 4, (8, 4))
        else:
            stage_prefill(i64, i32, blocks, form[:6], query[:2], context[:2], tables[:2], 4,
                          8, 16)
        return [i64, i32, blocks]

    for mixed in (False, True):
        for got, want in zip(staged(array("i", ids), mixed), staged(ids, mixed)):
            assert np.array_equal(got, want)
