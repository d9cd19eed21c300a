"""A live run builds a workload file's prompts before its clock starts (``WorkloadInputs.prepare``).

Building a recipe prompt is the driver's work, not the engine's; done as each request falls due
it ran on the engine's thread between steps and delayed them (docs/BENCHMARKS.md 7k). What these
tests prove, on the CPU tiny model with recipe building slowed to ``SLOW_S`` a prompt:
- no step waits for a prompt to be built: every step's ``outside_s`` stays below ``SLOW_S``,
  and without the preparation (``PREPARED_PROMPT_TOKENS`` 0) a step does wait (the test can fail);
- the prompts the engine is given are those built as they fall due;
- a workload beyond the token budget builds the rest as they fall due; text prompts are left to
  the engine's tokenizer; a conversation's later turns get their own tokens prepared.
"""

from __future__ import annotations

import time

import pytest

from engine import LLM
from replay.cli import live
from replay.recorded import from_trace
from replay.workloads.inputs import WorkloadInputs
from replay.workloads.recipe import PromptRecipe
from replay.workloads.request import Request
from tracing.reader import read_trace

SLOW_S = 0.05
SETTINGS = {"kvcache_block_size": 16, "num_kvcache_blocks": 64, "max_model_len": 256,
            "max_num_batched_tokens": 256}


def workload() -> list[Request]:
    return [Request(PromptRecipe((i % 3,), 16, 40 + 8 * i, salt=i), 3, temperature=0.0,
                    arrival_s=0.02 * i) for i in range(6)]


def run(tmp_path, name: str, monkeypatch) -> tuple[list[float], object]:
    slow = PromptRecipe.token_ids

    def slow_token_ids(self: PromptRecipe) -> list[int]:
        time.sleep(SLOW_S)
        return slow(self)

    monkeypatch.setattr(PromptRecipe, "token_ids", slow_token_ids)
    llm = LLM(None, trace_dir=str(tmp_path / name), **SETTINGS)
    try:
        live.run_workload(llm, workload(), use_tqdm=False)
    finally:
        llm.close()
    events = from_trace(read_trace(tmp_path / name))
    return list(events.tables["model_step"]["outside_s"]), events


def test_no_step_waits_for_a_prompt_to_be_built(tmp_path, monkeypatch) -> None:
    outside, prepared = run(tmp_path, "prepared", monkeypatch)
    assert max(outside) < SLOW_S
    monkeypatch.setattr(live, "PREPARED_PROMPT_TOKENS", 0)
    outside, as_due = run(tmp_path, "as-due", monkeypatch)
    assert max(outside) >= SLOW_S  # built in the loop: the step after waits for it
    # The same prompts in the same order (the steps differ: arrivals meet other steps).
    assert [list(p) for p in prepared.tables["request_added"]["prompt_token_ids"]] == [
        list(p) for p in as_due.tables["request_added"]["prompt_token_ids"]]


def _inputs(requests: list[Request]) -> WorkloadInputs:
    return WorkloadInputs(requests, submit=lambda *args: None)  # type: ignore[arg-type,return-value]


def test_beyond_the_budget_prompts_are_built_as_they_fall_due() -> None:
    requests = workload() + [Request("some text", 2, arrival_s=1.0)]
    inputs = _inputs(requests)
    budget = sum(r.prompt_len for r in requests[:3])  # type: ignore[misc]
    assert inputs.prepare(budget) == budget
    assert set(inputs.prepared) == {0, 1, 2}
    assert [list(inputs._prompt(i)) for i in range(6)] == [r.prompt_token_ids()
                                                           for r in workload()]
    assert inputs._prompt(6) == "some text" and not inputs.prepared


def test_a_later_turns_own_tokens_are_prepared() -> None:
    requests = [Request([1, 2, 3], 2, conversation_id="c", turn=0),
                Request(PromptRecipe((), 16, 5, salt=9), 2, conversation_id="c", turn=1)]
    inputs = _inputs(requests)
    assert inputs.prepare(1000) == 8
    assert list(inputs.prepared[1]) == requests[1].prompt_token_ids()
    assert inputs._user_tokens(1) == requests[1].prompt_token_ids()


@pytest.mark.parametrize("budget", [0, 10**9])
def test_preparing_changes_no_prompt(budget: int, monkeypatch) -> None:
    from replay.workloads import inputs as module

    monkeypatch.setattr(module, "PREPARE_BATCH_TOKENS", 100)  # several numpy passes
    inputs = _inputs(workload())
    inputs.prepare(budget)
    assert [list(inputs._prompt(i)) for i in range(6)] == [r.prompt_token_ids()
                                                           for r in workload()]
