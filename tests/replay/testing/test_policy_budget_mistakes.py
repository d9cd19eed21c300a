"""Session 35: user policy mistakes found by writing policies as a new user would.

What these tests prove: a policy that admits a prompt the step's budget cannot hold, while
inheriting ``Policy.chunk`` (whole prompts), is told that ``admit`` must check
``step.tokens_left`` (it read ``chose 25 tokens for seq 0``, blaming a ``chunk`` the policy
never wrote); a ``chunk`` answer out of range says the range; a policy that iterates a ``set``
of the sequences it is offered decides the same live and in the replay (views hashed by object
address made it decide by memory layout: a ``replay`` violation that Hypothesis then reported as
flaky); a failure report names the imports its ``rebuild it:`` code needs, and that code, with
them, rebuilds the failing workload.
"""

from __future__ import annotations

import pytest

from engine import Config
from replay.testing import PropertyViolations, RequestSpec, Workload, run_workload

POLICIES = """
    from engine.policy import Chunked, Policy


    class NoBudgetCheck(Policy):
        '''Shortest prompt first, forgetting that a whole prompt must fit the budget.'''

        def admit(self, waiting, step):
            return sorted(waiting, key=lambda s: s.num_tokens)


    class ChunkZero(Chunked):
        def chunk(self, seq, remaining, step):
            return 0


    class SetOrder(Policy):
        '''Admits in the order of a set of the waiting sequences.'''

        def admit(self, waiting, step):
            for seq in set(waiting):
                if seq.num_tokens > step.tokens_left:
                    return
                yield seq
"""


def _workload(policy: str, lengths: list[int], max_num_seqs: int = 2) -> Workload:
    config = Config(policy=policy, kvcache_block_size=2, num_kvcache_blocks=40,
                    max_model_len=12, max_num_batched_tokens=12, max_num_seqs=max_num_seqs)
    return Workload(config, tuple(
        RequestSpec(arrival_step=0, prompt=(i % 5,) * n, max_tokens=2, ignore_eos=True,
                    script=(2, 3)) for i, n in enumerate(lengths)))


@pytest.fixture
def module(policy_module) -> str:
    return policy_module("s35_policy_mistakes", POLICIES)


def test_admitting_past_the_budget_with_whole_prompt_chunks_blames_admit(module) -> None:
    """The 4-token prompt is admitted first, then the 9-token one with 8 tokens left: the
    violation says admit must check step.tokens_left, not that chunk chose 9 tokens."""
    run = run_workload(_workload(f"{module}:NoBudgetCheck", [9, 4]))
    (message,) = run.violations["policy"]
    assert ("admitted seq 0 (9 prompt tokens to compute) with 8 left in the step's budget"
            in message)
    assert "admit may yield a sequence only while its prompt fits step.tokens_left" in message


def test_a_chunk_out_of_range_says_the_range(module) -> None:
    """chunk returning 0 is refused with the range chunk must answer in."""
    run = run_workload(_workload(f"{module}:ChunkZero", [5]))
    (message,) = run.violations["policy"]
    assert "chose 0 tokens for seq 0 (5 to compute, 12 left in the step's budget)" in message
    assert "chunk must return at least 1 and at most min(remaining, step.tokens_left)" in message


def test_iterating_a_set_of_offered_sequences_replays_identically(module) -> None:
    """One request admitted per step, in set order, over many runs: the recording always
    replays identically (the order is the same for the replay's own Sequence objects), and
    every run decides the same."""
    workload = _workload(f"{module}:SetOrder", [3, 1, 4, 1, 5, 2, 6, 3], max_num_seqs=1)
    decisions = []
    for _ in range(12):
        run = run_workload(workload)
        assert not run.violations, run.violations
        decisions.append(run.decisions()["seq_scheduled"]["seq_id"])
    assert all(d == decisions[0] for d in decisions)


def test_the_failure_report_names_the_imports_its_rebuild_code_needs(module) -> None:
    """The report's ``with:`` line holds the imports; with them, the ``rebuild it:`` code
    evaluates to the failing workload, which fails again the same way."""
    workload = _workload(f"{module}:NoBudgetCheck", [9, 4])
    with pytest.raises(PropertyViolations) as failure:
        run_workload(workload).raise_violations()
    lines = str(failure.value).splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("  rebuild it: "))
    end = next(i for i, line in enumerate(lines) if line.startswith("  with: "))
    code = "\n".join([lines[start].removeprefix("  rebuild it: ")]
                     + [line.removeprefix("  ") for line in lines[start + 1:end]])
    namespace: dict = {}
    exec(lines[end].removeprefix("  with: ").replace("; ", "\n"), namespace)
    rebuilt = eval(code, namespace)
    assert rebuilt == workload
    assert "policy" in namespace["run_workload"](rebuilt).violations
